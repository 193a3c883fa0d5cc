/* vllm.spec_summary compiled: the offline spec_decode example's summary, `key: value` lines (each summary key once),
 * `acceptance at token i: x` lines and `-----` rules, at most 200 lines from the marker line on, one record per
 * block (the Python function in vllm.py is the reference).
 *
 * A record's per_position is a list, which bp_out cannot hold: after the block's record (code 0 in `_row`) come
 * its positions as records of their own (code 1 in `_row`, the value in `_position`), in line order; vllm.py turns
 * them into the list. */
#include <math.h>
#include <string.h>

#include "blockpass.h"

/* the float columns: vllm._SUMMARY_COLS, then the value of a position record (the Spec in vllm.py names the same) */
const char bp_spec_summary_columns[] = "output_tokens,drafts,drafted,accepted,accept_len,_position||_row";
#define NCOLS 5
#define POSITION 5
#define MAX_K 200 /* the loop's `k < 200` */

/* vllm._SUMMARY: key -> float column */
static const char *const KEYS[NCOLS] = {"total_num_output_tokens", "num_drafts", "num_draft_tokens",
                                        "num_accepted_tokens", "mean acceptance length"};

/* The length of text.NUM's match at the start of s (0: none): the decimal branch
 * [-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?, else [-+]?(inf|Inf|INF|nan|NaN). */
static int32_t num_match(const uint8_t *s, int32_t len) { return bp_num_len(s, len); }

/* _AT: ^\s*acceptance at token ([0-9]+)\s*:\s*(NUM): whether s is such a line, with the number's text in *x. */
static int position_line(bp_text s, bp_text *x) {
    bp_text t = bp_lstrip(s);
    static const char lead[] = "acceptance at token ";
    if (!bp_starts(t, lead)) return 0;
    int32_t i = (int32_t)sizeof(lead) - 1, j = i;
    while (j < t.len && bp_digit(t.s[j])) j++;
    if (j == i) return 0;
    while (j < t.len && bp_space(t.s[j])) j++;
    if (j >= t.len || t.s[j] != ':') return 0;
    j++;
    while (j < t.len && bp_space(t.s[j])) j++;
    int32_t m = num_match(t.s + j, t.len - j);
    if (m == 0) return 0;
    *x = bp_sub(t, j, j + m);
    return 1;
}

/* _KV: ^\s*([a-z_ ]+?)\s*:\s*(\S+)\s*$ with its key one of KEYS: the column (-1: not such a line), the value's
 * text in *value. A match whose key starts with a space (the engine giving back leading whitespace) names no key
 * of KEYS, so only the match after all the leading whitespace counts: the key runs to the first `:`, less the
 * whitespace before it, and holds [a-z_ ] only; the rest is one word between whitespace. */
static int summary_line(bp_text s, bp_text *value) {
    bp_text t = bp_lstrip(s);
    int32_t colon = bp_find(t, ":");
    if (colon < 0) return -1;
    bp_text key = bp_rstrip(bp_sub(t, 0, colon));
    if (key.len == 0) return -1;
    for (int32_t j = 0; j < key.len; j++) {
        uint8_t c = key.s[j];
        if (!((c >= 'a' && c <= 'z') || c == '_' || c == ' ')) return -1;
    }
    bp_text v = bp_strip(bp_sub(t, colon + 1, t.len));
    if (v.len == 0) return -1;
    for (int32_t j = 0; j < v.len; j++)
        if (bp_space(v.s[j])) return -1;
    for (int c = 0; c < NCOLS; c++) {
        if (bp_eq(key, KEYS[c])) {
            *value = v;
            return c;
        }
    }
    return -1;
}

static int rule_line(bp_text s) { /* _RULE: ^\s*-{5,}\s*$ */
    bp_text t = bp_strip(s);
    if (t.len < 5) return 0;
    for (int32_t j = 0; j < t.len; j++)
        if (t.s[j] != '-') return 0;
    return 1;
}

int bp_spec_summary(const bp_chunk *ch, const int64_t *at, int64_t nb, int64_t *used, int64_t *examined,
                    int64_t *status, bp_out *out) {
    for (int64_t b = 0; b < nb; b++) {
        double val[NCOLS], pos[MAX_K];
        uint8_t has[NCOLS];
        int32_t npos = 0;
        int any = 0, decline = 0, more = 0;
        memset(has, 0, sizeof(has));
        int64_t k = 0, got_used = 0;
        bp_text s;
        for (;;) {
            int r = bp_line(ch, at[b], k, &s); /* w[k] first, then `k < 200` */
            if (r == BP_PAST) {
                more = 1;
                break;
            }
            if (r == BP_NONE) {
                examined[b] = k;
                break;
            }
            examined[b] = k + 1;
            if (k >= MAX_K) break;
            bp_text x, value;
            int col;
            if (position_line(s, &x)) {
                double v;
                if (bp_num(x, &v) != 1 || npos >= MAX_K) { /* NUM always reads; -1: a number too long */
                    decline = 1;
                    break;
                }
                pos[npos++] = v; /* `num(x) or 0.0`: 0.0 stays 0.0, NaN is true */
            } else if ((col = summary_line(s, &value)) >= 0) {
                if (has[col]) break; /* the next summary */
                double v;
                int got = bp_num(value, &v);
                if (got < 0) {
                    decline = 1;
                    break;
                }
                has[col] = 1;
                any = 1;
                val[col] = got ? v : (double)NAN;
            } else if (!rule_line(s)) {
                break;
            }
            k++;
            got_used = k;
        }
        if (more || decline) {
            status[b] = more ? BP_MORE : BP_DECLINE;
            continue;
        }
        if (!any) continue; /* `if not rec`: nothing, whatever lines it read */
        int64_t r = bp_add(out, b, 0);
        if (r < 0) return -1;
        for (int c = 0; c < NCOLS; c++)
            if (has[c]) *bp_f(out, r, c) = val[c];
        bp_code(out, r, 0, 0);
        for (int32_t j = 0; j < npos; j++) {
            int64_t p = bp_add(out, b, 0);
            if (p < 0) return -1;
            *bp_f(out, p, POSITION) = pos[j];
            bp_code(out, p, 0, 1);
        }
        used[b] = got_used;
    }
    return 0;
}
