/* sglang.server_args compiled: a `ServerArgs(...)` dump (joined across hard wraps) cut into its `key=value` items
 * as pyrepr.parse_kwargs cuts it; sglang.py builds each record's dict from the items (the Python function is the
 * reference). One record per item: its key's and its value's text (spans of the chunk's bytes; one that runs
 * across a hard wrap holds the newline, which sglang.py drops) in the block's joined text (the text after
 * `ServerArgs(` on the marker line, or that line stripped, then the lines that continue it, as the Python function
 * joins them) and whether the value is simple (pyrepr._simple_value reads it) or bracketed / escaped
 * (pyrepr._literal reads it). A dump whose items this reading is not sure of is DECLINEd. */
#include <stdlib.h>
#include <string.h>

#include "blockpass.h"

const char bp_server_args_columns[] = "|key,value|kind";
enum { KEY, VALUE };
enum { SIMPLE, BRACKETED };

/* A span of the joined text as a span of the chunk's bytes (where[j]: the byte of joined character j); 0 where the
 * characters are not one run of the chunk's bytes apart from the newlines between lines (a headless dump's first
 * line stripped of trailing blanks, then wrapped): the block is left to Python then. */
static int to_data(const bp_chunk *ch, const int32_t *where, int32_t len, int32_t a, int32_t b, bp_out *out,
                   int64_t rec, int col) {
    int32_t da, db;
    if (b > a) {
        da = where[a];
        db = where[b - 1] + 1;
        for (int32_t j = da, k = a; j < db; j++) { /* the bytes between: the joined characters and newlines only */
            if (k < b && where[k] == j) k++;
            else if (ch->data[j] != '\n') return 0;
        }
    } else {
        da = db = a < len ? where[a] : (len > 0 ? where[len - 1] + 1 : 0);
    }
    out->s[(rec * out->ns + col) * 2] = da;
    out->s[(rec * out->ns + col) * 2 + 1] = db;
    return 1;
}

static int word(uint8_t c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; }

/* sglang._LOG_START: a line that starts a new log record (a wrapped dump does not run into it). */
static int log_start(bp_text t) {
    bp_text s = bp_lstrip(t);
    const uint8_t *p = s.s;
    int32_t n = s.len;
    if (n >= 2 && p[0] == '[' && bp_digit(p[1])) return 1;
    if (n >= 1 && p[0] == '(') {
        int32_t j = 1;
        while (j < n && word(p[j])) j++;
        if (j > 1 && j + 5 <= n && memcmp(p + j, " pid=", 5) == 0) return 1;
    }
    static const char *levels[] = {"INFO", "WARNING", "ERROR", "DEBUG"};
    for (int k = 0; k < 4; k++) {
        int32_t l = (int32_t)strlen(levels[k]);
        if (n >= l && memcmp(p, levels[k], (size_t)l) == 0 && (n == l || !word(p[l]))) return 1;
    }
    if (n >= 10 && bp_digit(p[0]) && bp_digit(p[1]) && bp_digit(p[2]) && bp_digit(p[3]) && p[4] == '-' &&
        bp_digit(p[5]) && bp_digit(p[6]) && p[7] == '-' && bp_digit(p[8]) && bp_digit(p[9]))
        return 1;
    int32_t j = 0;
    while (j < n && bp_digit(p[j])) j++;
    if (j > 0) { /* [0-9]+\.[0-9]{2}\.[0-9]{3}\.[0-9]{3} */
        static const int groups[] = {2, 3, 3};
        for (int g = 0; g < 3; g++) {
            if (j >= n || p[j] != '.') return 0;
            j++;
            for (int d = 0; d < groups[g]; d++, j++)
                if (j >= n || !bp_digit(p[j])) return 0;
        }
        return j < n && p[j] == ' ';
    }
    return 0;
}

/* pyrepr._scan_value from i: the end of a bracketed or escaped value (a top-level `,`, or a closing bracket with
 * nothing open; *closed: that bracket is `)`); len where the text ends first. */
static int32_t scan_value(const uint8_t *t, int32_t len, int32_t i, int *closed) {
    int32_t depth = 0;
    uint8_t quote = 0;
    *closed = 0;
    for (int32_t j = i; j < len; j++) {
        uint8_t c = t[j];
        if (quote) {
            if (c == '\\') j++;
            else if (c == quote) quote = 0;
        } else if (c == '\'' || c == '"') {
            quote = c;
        } else if (c == '(' || c == '[' || c == '{') {
            depth++;
        } else if (c == ')' || c == ']' || c == '}') {
            if (depth == 0) {
                *closed = c == ')';
                return j;
            }
            depth--;
        } else if (c == ',' && depth == 0) {
            return j;
        }
    }
    return len;
}

static int bare(uint8_t c) {
    return !(c == ',' || c == '(' || c == ')' || c == '[' || c == ']' || c == '{' || c == '}' || c == '\'' ||
             c == '"' || c == '\n');
}

/* Items of the joined text t[0..len) (character j: chunk byte where[j]) into out (records of block b); 0, -1
 * (DECLINE) or -2 (memory). */
static int items(const bp_chunk *ch, const uint8_t *t, const int32_t *where, int32_t len, int64_t b, bp_out *out) {
    int32_t pos = 0;
    for (;;) {
        if (pos < len && t[pos] == ',') pos += (pos + 1 < len && t[pos + 1] == ' ') ? 2 : 1; /* `, ` or `,`: a
            search from the comma finds a key right after it (one further off is left to Python) */
        if (pos >= len) return 0; /* the dump ends unclosed: what was read stands */
        int32_t k0 = pos;
        if (!((t[pos] >= 'A' && t[pos] <= 'Z') || (t[pos] >= 'a' && t[pos] <= 'z') || t[pos] == '_')) return -1;
        while (pos < len && word(t[pos])) pos++;
        if (pos >= len || t[pos] != '=') return -1;
        int32_t k1 = pos, v0 = pos + 1, v1, next;
        int kind = SIMPLE, closed = 0;
        uint8_t c = v0 < len ? t[v0] : 0;
        if (v0 < len && (c == '\'' || c == '"')) {
            int32_t q = v0 + 1;
            while (q < len && t[q] != c && t[q] != '\\' && t[q] != '\n') q++;
            if (q < len && t[q] == c) { /* a quoted value without escapes: simple where , or ) follows */
                v1 = q + 1;
                next = v1;
                while (next < len && bp_space(t[next])) next++;
                if (!(next >= len || t[next] == ',' || t[next] == ')')) kind = BRACKETED;
            } else {
                kind = BRACKETED;
            }
        } else {
            int32_t j = v0;
            while (j < len && bare(t[j])) j++;
            if (j >= len || t[j] == ',' || t[j] == ')') {
                v1 = j;
                while (v1 > v0 && bp_space(t[v1 - 1])) v1--;
                next = j;
            } else {
                kind = BRACKETED;
            }
        }
        if (kind == BRACKETED) {
            v1 = scan_value(t, len, v0, &closed);
            next = v1 > v0 + 1 ? v1 : v0 + 1;
        }
        int64_t r = bp_add(out, b, 0);
        if (r < 0) return -2;
        if (!to_data(ch, where, len, k0, k1, out, r, KEY) || !to_data(ch, where, len, v0, v1, out, r, VALUE)) return -1;
        bp_code(out, r, 0, kind);
        if (kind == BRACKETED) {
            if (closed) return 0;
            pos = next;
            continue;
        }
        if (next < len && t[next] == ')') return 0; /* closed */
        pos = next;
    }
}

int bp_server_args(const bp_chunk *ch, const int64_t *at, int64_t nb, int64_t *used, int64_t *examined,
                   int64_t *status, bp_out *out) {
    int64_t claimed = -1; /* the lines of the last dump read: their markers start no dump (the driver skips them) */
    for (int64_t b = 0; b < nb; b++) {
        bp_text first, s;
        if (at[b] < claimed) {
            status[b] = BP_DECLINE;
            continue;
        }
        if (bp_line(ch, at[b], 0, &first) != BP_LINE) {
            status[b] = BP_DECLINE;
            continue;
        }
        examined[b] = 1;
        int32_t head = bp_find(first, "ServerArgs(");
        if (head < 0 && (bp_find(first, "with config:") >= 0 || bp_find(first, "non-default args") >= 0)) continue;
        bp_text part0 = head >= 0 ? bp_sub(first, head + 11, first.len) : bp_strip(first);
        /* the lines that continue the dump (as the Python function's loop takes them) */
        int64_t k = 1;
        int more = 0;
        size_t total = (size_t)part0.len;
        bp_text last = part0;
        while (!bp_ends(bp_rstrip(last), ")") && k < 200) {
            int r = bp_line(ch, at[b], k, &s);
            if (r == BP_PAST) {
                more = 1;
                break;
            }
            examined[b] = k + 1;
            if (r == BP_NONE || bp_strip(s).len == 0 || log_start(s)) break;
            total += (size_t)s.len;
            last = s;
            k++;
        }
        if (more) {
            status[b] = BP_MORE;
            continue;
        }
        uint8_t *text = (uint8_t *)malloc(total ? total : 1);
        int32_t *where = (int32_t *)malloc((total ? total : 1) * sizeof(int32_t));
        if (text == NULL || where == NULL) {
            free(text);
            free(where);
            return -1;
        }
        size_t at_byte = 0;
        for (int64_t j = 0; j < k; j++) {
            if (j == 0) s = part0;
            else bp_line(ch, at[b], j, &s);
            memcpy(text + at_byte, s.s, (size_t)s.len);
            for (int32_t q = 0; q < s.len; q++) where[at_byte + (size_t)q] = (int32_t)(s.s - ch->data) + q;
            at_byte += (size_t)s.len;
        }
        int64_t before = out->n;
        int got = items(ch, text, where, (int32_t)total, b, out);
        free(text);
        free(where);
        if (got == -2) return -1;
        if (got == -1) {
            out->n = before; /* the items read so far are dropped with the block */
            status[b] = BP_DECLINE;
            continue;
        }
        used[b] = out->n > before ? k : 0; /* sglang.py drops a dump of too few items (and its claim) */
        if (used[b]) claimed = at[b] + k;
    }
    return 0;
}
