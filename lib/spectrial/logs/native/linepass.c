/* spectrial's compiled line pass: every pattern and `key: value` list of a LineFormat over a batch of lines in
 * one call (see native/__init__.py, which builds this file with the machine's C compiler and calls it through
 * ctypes; without a compiler or libpcre2 the parse reads with pyarrow's kernels, to the same tables).
 *
 * The regexes run on PCRE2 (the libpcre2-8.so.0 that grep links, JIT-compiled), only on lines of plain ASCII
 * (tab and 0x20-0x7e, and a final newline): there PCRE2 and RE2 (pyarrow's engine, which defines the result) read a pattern alike.
 * Any other line is marked and left to pyarrow. No PCRE2 header is needed: the few functions used are
 * declared here (PCRE2 10.x's stable ABI). */
#define _GNU_SOURCE
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct pcre2_real_code_8 pcre2_code;
typedef struct pcre2_real_match_data_8 pcre2_match_data;
extern pcre2_code *pcre2_compile_8(const uint8_t *, size_t, uint32_t, int *, size_t *, void *);
extern int pcre2_jit_compile_8(pcre2_code *, uint32_t);
extern pcre2_match_data *pcre2_match_data_create_from_pattern_8(const pcre2_code *, void *);
extern int pcre2_match_8(const pcre2_code *, const uint8_t *, size_t, size_t, uint32_t, pcre2_match_data *, void *);
extern size_t *pcre2_get_ovector_pointer_8(pcre2_match_data *);
extern void pcre2_match_data_free_8(pcre2_match_data *);
extern void pcre2_code_free_8(pcre2_code *);
extern int pcre2_get_error_message_8(int, uint8_t *, size_t);

#define PCRE2_DOLLAR_ENDONLY 0x00000010u
#define PCRE2_NEVER_UTF 0x00001000u
#define PCRE2_NEVER_UCP 0x00000800u
#define PCRE2_JIT_COMPLETE 0x00000001u
#define PCRE2_ERROR_NOMATCH (-1)
#define PCRE2_UNSET (~(size_t)0)

int lp_version(void) { return 2; }

/* A compiled pattern, or NULL with the reason in err. $ matches only at the end (as in RE2). */
void *lp_compile(const uint8_t *pattern, size_t len, char *err, size_t errlen) {
    int code = 0;
    size_t at = 0;
    pcre2_code *re = pcre2_compile_8(pattern, len, PCRE2_DOLLAR_ENDONLY | PCRE2_NEVER_UTF | PCRE2_NEVER_UCP,
                                     &code, &at, NULL);
    if (re == NULL) {
        if (err && errlen) {
            pcre2_get_error_message_8(code, (uint8_t *)err, errlen);
        }
        return NULL;
    }
    pcre2_jit_compile_8(re, PCRE2_JIT_COMPLETE); /* without JIT (refused by the system) it still matches */
    return re;
}

void lp_free(void *re) { pcre2_code_free_8((pcre2_code *)re); }

/* Plain: tab and 0x20-0x7e, and a newline as the last byte (the driver's lines keep theirs). */
static int plain(const uint8_t *s, int32_t len) {
    if (len > 0 && s[len - 1] == '\n') len--;
    for (int32_t j = 0; j < len; j++) {
        uint8_t c = s[j];
        if ((c < 0x20 && c != '\t') || c > 0x7e) return 0;
    }
    return 1;
}

static int space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n'; }

/* For each of n lines (an arrow string array: offs[0..n], data), plain[i] = 1 where the line is plain ASCII; on
 * those lines:
 *   spans[(i*G + g)*2 + 0/1]: pattern group g's capture (absolute offsets into data) in the leftmost match of
 *     its pattern; -1/-1 where the pattern does not match; 0/0 (empty) for a group that took no part. Pattern p
 *     owns groups ngroups[p] in order, numbered groups[...] in it; a pattern whose literal (lits[p], litlens[p]
 *     bytes; 0: none) is not on the line is not run there.
 *   kspans[(i*ncol + c)*3 + 0/1/2]: column c's value from the line's `key: value, ...` list (keys: nkeys keys,
 *     key k = keydata[keyoffs[k]..keyoffs[k+1]], its column keycol[k]): the value's start, its token's end (the
 *     first word, without closing .,;) ) and that token's end without trailing %; -1 where no key of c is on
 *     the line. Items are split at ", " and each at ": " (left to right, as arrow's split_pattern): the key is
 *     the text between the item's last two ": " (or its start), trimmed; a key not among `keys` takes the first
 *     key it ends with; the first item of a column wins.
 * Line i is line rows[i] of the array (rows NULL: line i); every row must lie in 0..nlines-1, else nothing is
 * read and -2 is returned.
 * A line on which PCRE2 fails other than by not matching is marked not plain. Returns 0. */
int lp_extract(int64_t n, const int64_t *rows, int64_t nlines, const int32_t *offs, const uint8_t *data, int npat,
               void **codes, const uint8_t **lits, const int64_t *litlens, const int32_t *ngroups,
               const int32_t *groups, int32_t G, int32_t *spans, int nkeys, const uint8_t *keydata,
               const int32_t *keyoffs, const int32_t *keycol, int ncol, int32_t *kspans, uint8_t *plain_out) {
    if (rows != NULL) {
        for (int64_t i = 0; i < n; i++) {
            if (rows[i] < 0 || rows[i] >= nlines) return -2;
        }
    } else if (n > nlines) {
        return -2;
    }
    pcre2_match_data **md = NULL;
    if (npat > 0) {
        md = (pcre2_match_data **)calloc((size_t)npat, sizeof(*md));
        if (md == NULL) return -1;
        for (int p = 0; p < npat; p++) {
            md[p] = pcre2_match_data_create_from_pattern_8((pcre2_code *)codes[p], NULL);
            if (md[p] == NULL) {
                for (int q = 0; q < p; q++) pcre2_match_data_free_8(md[q]);
                free(md);
                return -1;
            }
        }
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t r = rows != NULL ? rows[i] : i;
        int32_t base = offs[r], len = offs[r + 1] - offs[r];
        const uint8_t *s = data + base;
        int32_t *sp = spans + i * (int64_t)G * 2;
        int32_t *kp = kspans + i * (int64_t)ncol * 3;
        for (int32_t g = 0; g < 2 * G; g++) sp[g] = -1;
        for (int c = 0; c < 3 * ncol; c++) kp[c] = -1;
        uint8_t ok = (uint8_t)plain(s, len);
        plain_out[i] = ok;
        if (!ok) continue;
        int32_t goff = 0;
        for (int p = 0; p < npat; p++) {
            int32_t ng = ngroups[p];
            int32_t *gs = sp + 2 * goff;
            const int32_t *gn = groups + goff;
            goff += ng;
            if (litlens[p] > 0 && memmem(s, (size_t)len, lits[p], (size_t)litlens[p]) == NULL) continue;
            int rc = pcre2_match_8((pcre2_code *)codes[p], s, (size_t)len, 0, 0, md[p], NULL);
            if (rc == PCRE2_ERROR_NOMATCH) continue;
            if (rc <= 0) { /* a match error (limits): leave the line to pyarrow */
                plain_out[i] = 0;
                break;
            }
            size_t *ov = pcre2_get_ovector_pointer_8(md[p]);
            for (int32_t g = 0; g < ng; g++) {
                int32_t k = gn[g];
                if (k < rc && ov[2 * k] != PCRE2_UNSET) {
                    gs[2 * g] = base + (int32_t)ov[2 * k];
                    gs[2 * g + 1] = base + (int32_t)ov[2 * k + 1];
                } else {
                    gs[2 * g] = 0;
                    gs[2 * g + 1] = 0;
                }
            }
        }
        if (!plain_out[i]) {
            for (int32_t g = 0; g < 2 * G; g++) sp[g] = -1;
            continue;
        }
        if (nkeys == 0) continue;
        const uint8_t *p = s, *end = s + len;
        for (;;) {
            const uint8_t *sep = (const uint8_t *)memmem(p, (size_t)(end - p), ", ", 2);
            const uint8_t *ie = sep ? sep : end;
            const uint8_t *q = p, *prev = NULL, *last = NULL, *x;
            while ((x = (const uint8_t *)memmem(q, (size_t)(ie - q), ": ", 2)) != NULL) {
                prev = last;
                last = x;
                q = x + 2;
            }
            if (last != NULL) {
                const uint8_t *ka = prev ? prev + 2 : p, *kb = last;
                while (ka < kb && space(*ka)) ka++;
                while (kb > ka && space(kb[-1])) kb--;
                size_t klen = (size_t)(kb - ka);
                int kid = -1;
                for (int k = 0; k < nkeys && kid < 0; k++) {
                    size_t l = (size_t)(keyoffs[k + 1] - keyoffs[k]);
                    if (l == klen && memcmp(ka, keydata + keyoffs[k], l) == 0) kid = k;
                }
                for (int k = 0; k < nkeys && kid < 0; k++) {
                    size_t l = (size_t)(keyoffs[k + 1] - keyoffs[k]);
                    if (l <= klen && memcmp(kb - l, keydata + keyoffs[k], l) == 0) kid = k;
                }
                if (kid >= 0 && kp[3 * keycol[kid]] < 0) {
                    const uint8_t *va = last + 2, *vb = ie;
                    while (va < vb && space(*va)) va++;
                    while (vb > va && space(vb[-1])) vb--;
                    const uint8_t *te = (const uint8_t *)memchr(va, ' ', (size_t)(vb - va));
                    if (te == NULL) te = vb;
                    while (te > va && (te[-1] == '.' || te[-1] == ',' || te[-1] == ';' || te[-1] == ')')) te--;
                    const uint8_t *be = te;
                    while (be > va && be[-1] == '%') be--;
                    int32_t *c = kp + 3 * keycol[kid];
                    c[0] = (int32_t)(va - data);
                    c[1] = (int32_t)(te - data);
                    c[2] = (int32_t)(be - data);
                }
            }
            if (sep == NULL) break;
            p = sep + 2;
        }
    }
    for (int p = 0; p < npat; p++) pcre2_match_data_free_8(md[p]);
    free(md);
    return 0;
}

/* Copy n spans (starts[i*stride], ends[i*stride]; start -1: none) of data into out at offsets (offsets[i] ..
 * offsets[i+1], computed by the caller from the spans' lengths). */
void lp_gather(int64_t n, const int32_t *starts, const int32_t *ends, int64_t stride, const uint8_t *data,
               const int32_t *offsets, uint8_t *out) {
    for (int64_t i = 0; i < n; i++) {
        int32_t a = starts[i * stride];
        if (a < 0) continue;
        memcpy(out + offsets[i], data + a, (size_t)(ends[i * stride] - a));
    }
}


/* A span of text as Python's float() and arrow's cast (string -> float64) both read it, where it is a plain decimal
 * number: [-+]?(digits[.digits*]|.digits)([eE][-+]?digits)? and nothing else (no space, `_`, inf, nan, hex).
 * Returns 1 with *v set; 0 where the text is anything else, or its value is not finite or under/overflows (the
 * caller reads such a column in Python, as before). Up to 15 digits and a power of ten within 1e+-22: the
 * digits' integer times or over that power, both exact doubles, in one correctly rounded operation (Clinger);
 * else glibc's strtod in the C locale (correctly rounded, as float() and arrow's cast are). */
static int lp_number(const uint8_t *s, int32_t len, locale_t cloc, double *v) {
    static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    int32_t i = 0;
    int neg = 0;
    if (i < len && (s[i] == '+' || s[i] == '-')) {
        neg = s[i] == '-';
        i++;
    }
    uint64_t m = 0;
    int32_t digits = 0, nfrac = 0;
    while (i < len && s[i] >= '0' && s[i] <= '9') {
        if (digits < 18) m = m * 10 + (uint64_t)(s[i] - '0');
        digits++;
        i++;
    }
    if (i < len && s[i] == '.') {
        i++;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            if (digits < 18) m = m * 10 + (uint64_t)(s[i] - '0');
            digits++;
            nfrac++;
            i++;
        }
    }
    if (digits == 0) return 0;
    int64_t ex = 0;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        int eneg = 0;
        if (i < len && (s[i] == '+' || s[i] == '-')) {
            eneg = s[i] == '-';
            i++;
        }
        int32_t e0 = i;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            if (ex < 100000) ex = ex * 10 + (s[i] - '0');
            i++;
        }
        if (i == e0) return 0;
        if (eneg) ex = -ex;
    }
    if (i != len) return 0;
    int64_t e = ex - nfrac;
    if (digits <= 15 && e >= -22 && e <= 22) {
        double x = (double)m; /* m < 1e15 < 2^53: exact */
        x = e >= 0 ? x * POW10[e] : x / POW10[-e];
        *v = neg ? -x : x;
        return 1;
    }
    char buf[128];
    if (cloc == (locale_t)0 || len >= (int32_t)sizeof(buf)) return 0;
    memcpy(buf, s, (size_t)len);
    buf[len] = 0;
    char *end = NULL;
    errno = 0;
    double x = strtod_l(buf, &end, cloc);
    if (end != buf + len || errno == ERANGE || !isfinite(x)) return 0;
    *v = x;
    return 1;
}

/* The numbers of ncols columns of spans: row i, column c reads data[spans[i*rowstride + startcol[c]] ..
 * spans[i*rowstride + endcol[c]]) (start -1: no value). out[c*n + i] gets its value (NaN where none) and
 * valid[c*n + i] 1 where it is a number; an empty span is no value, or with blank_odd an odd one; odd[c] counts
 * the spans of column c that are not plain numbers (lp_number; a span outside 0..datalen too): where it is not 0
 * the caller reads that column its own way and the column's out / valid are not all set. */
void lp_floats(int64_t n, int ncols, const int32_t *spans, int64_t rowstride, const int32_t *startcol,
               const int32_t *endcol, const uint8_t *data, int64_t datalen, int blank_odd, double *out,
               uint8_t *valid, int64_t *odd) {
    locale_t cloc = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    for (int c = 0; c < ncols; c++) odd[c] = 0;
    for (int64_t i = 0; i < n; i++) {
        const int32_t *row = spans + i * rowstride;
        for (int c = 0; c < ncols; c++) {
            int64_t at = (int64_t)c * n + i;
            out[at] = NAN;
            valid[at] = 0;
            if (odd[c]) continue;
            int32_t a = row[startcol[c]], b = row[endcol[c]];
            if (a < 0) continue;
            if (b < a || b > datalen) {
                odd[c]++;
                continue;
            }
            if (a == b) {
                if (blank_odd) odd[c]++;
                continue;
            }
            double x;
            if (lp_number(data + a, b - a, cloc, &x)) {
                out[at] = x;
                valid[at] = 1;
            } else {
                odd[c]++;
            }
        }
    }
    if (cloc != (locale_t)0) freelocale(cloc);
}

/* Column c of spans (row i: data[spans[i*rowstride + startcol] .. spans[i*rowstride + endcol])) as arrow's text
 * conversion of a capture reads it: no value (outs[i] = -1) where there is no span or it is empty, else the span
 * without the white space that utf8_trim_whitespace trims off ASCII text (\t-\r, \x1c-\x1f, space) at either end
 * (it may become empty: "" then). A span outside 0..datalen is no value. */
void lp_trim(int64_t n, const int32_t *spans, int64_t rowstride, int32_t startcol, int32_t endcol,
             const uint8_t *data, int64_t datalen, int32_t *outs, int32_t *oute) {
    for (int64_t i = 0; i < n; i++) {
        int32_t a = spans[i * rowstride + startcol], b = spans[i * rowstride + endcol];
        if (a < 0 || b <= a || b > datalen) {
            outs[i] = -1;
            oute[i] = -1;
            continue;
        }
        while (a < b && ((data[a] >= '\t' && data[a] <= '\r') || (data[a] >= 0x1c && data[a] <= 0x20))) a++;
        while (b > a && ((data[b - 1] >= '\t' && data[b - 1] <= '\r') || (data[b - 1] >= 0x1c && data[b - 1] <= 0x20)))
            b--;
        outs[i] = a;
        oute[i] = b;
    }
}
