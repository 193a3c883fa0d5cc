/* spectrial's compiled line pass: every pattern and `key: value` list of a LineFormat over a batch of lines in
 * one call (see native/__init__.py, which builds this file with the machine's C compiler and calls it through
 * ctypes; without a compiler or libpcre2 the parse reads with pyarrow's kernels, to the same tables).
 *
 * The regexes run on PCRE2 (the libpcre2-8.so.0 that grep links, JIT-compiled), only on lines of plain ASCII
 * (tab and 0x20-0x7e, and a final newline): there PCRE2 and RE2 (pyarrow's engine, which defines the result) read a pattern alike.
 * Any other line is marked and left to pyarrow. No PCRE2 header is needed: the few functions used are
 * declared here (PCRE2 10.x's stable ABI). */
#define _GNU_SOURCE
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

int lp_version(void) { return 1; }

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
 * A line on which PCRE2 fails other than by not matching is marked not plain. Returns 0. */
int lp_extract(int64_t n, const int32_t *offs, const uint8_t *data, int npat, void **codes, const uint8_t **lits,
               const int64_t *litlens, const int32_t *ngroups, const int32_t *groups, int32_t G, int32_t *spans,
               int nkeys, const uint8_t *keydata, const int32_t *keyoffs, const int32_t *keycol, int ncol,
               int32_t *kspans, uint8_t *plain_out) {
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
        int32_t base = offs[i], len = offs[i + 1] - offs[i];
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
