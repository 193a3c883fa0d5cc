/* llamacpp.timings_json compiled: a response's `timings` object, on one line or pretty-printed over several (the
 * Python function in llamacpp.py is the reference): the lines from the marker line on up to the first one holding a
 * `}` (40 at most) joined with newlines, and in that text each key's first `"key"\s*:\s*NUM` (a regex search: the
 * whitespace may run over line ends), its value num(NUM). A record where prompt_n or predicted_n was found. */
#include <string.h>

#include "blockpass.h"

/* the float columns, in llamacpp._JSON_KEYS's order (the Spec in llamacpp.py names the same), and `origin` */
const char bp_timings_json_columns[] =
    "prompt_tokens,prompt_ms,prompt_throughput,eval_tokens,eval_ms,gen_throughput,drafted,accepted||origin";
static const char *const KEYS[] = {"\"prompt_n\"",    "\"prompt_ms\"",    "\"prompt_per_second\"", "\"predicted_n\"",
                             "\"predicted_ms\"", "\"predicted_per_second\"", "\"draft_n\"", "\"draft_n_accepted\""};
#define NKEYS ((int)(sizeof(KEYS) / sizeof(*KEYS)))
#define PROMPT_N 0
#define PREDICTED_N 3
#define MAX_LINES 40 /* `for k in range(40)` */

/* The length of text.NUM's match at the start of s (0: none): the decimal branch
 * [-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?, else [-+]?(inf|Inf|INF|nan|NaN). */
static int32_t num_match(const uint8_t *s, int32_t len) { return bp_num_len(s, len); }

/* \s* in the joined text from line *li, byte *p (byte len: the newline after the line); 0 where the text ends. */
static int skip_space(const bp_text *lines, int32_t n, int32_t *li, int32_t *p) {
    while (*li < n) {
        bp_text t = lines[*li];
        while (*p < t.len && bp_space(t.s[*p])) (*p)++;
        if (*p < t.len) return 1;
        (*li)++; /* the newline */
        *p = 0;
    }
    return 0;
}

/* _JSON_RX[key].search(text): the first `"key"` followed by \s*:\s*NUM; the number's text in *x. */
static int search(const bp_text *lines, int32_t n, const char *key, bp_text *x) {
    int32_t klen = (int32_t)strlen(key);
    for (int32_t li = 0; li < n; li++) {
        bp_text t = lines[li];
        for (int32_t from = 0; from < t.len;) {
            int32_t f = bp_find(bp_sub(t, from, t.len), key);
            if (f < 0) break;
            int32_t hit = from + f, l = li, p = hit + klen;
            from = hit + 1;
            if (!skip_space(lines, n, &l, &p) || lines[l].s[p] != ':') continue;
            p++;
            if (!skip_space(lines, n, &l, &p)) continue;
            int32_t m = num_match(lines[l].s + p, lines[l].len - p); /* a number holds no newline */
            if (m > 0) {
                *x = bp_sub(lines[l], p, p + m);
                return 1;
            }
        }
    }
    return 0;
}

int bp_timings_json(const bp_chunk *ch, const int64_t *at, int64_t nb, int64_t *used, int64_t *examined,
                    int64_t *status, bp_out *out) {
    for (int64_t b = 0; b < nb; b++) {
        bp_text lines[MAX_LINES];
        int32_t n = 0;
        int more = 0;
        examined[b] = MAX_LINES;
        for (int64_t k = 0; k < MAX_LINES; k++) {
            bp_text s;
            int r = bp_line(ch, at[b], k, &s);
            if (r == BP_PAST) {
                more = 1;
                break;
            }
            if (r == BP_NONE) {
                examined[b] = k;
                break;
            }
            lines[n++] = s;
            if (memchr(s.s, '}', (size_t)s.len) != NULL) {
                examined[b] = k + 1;
                break;
            }
        }
        if (more) {
            status[b] = BP_MORE;
            continue;
        }
        double val[NKEYS];
        uint8_t found[NKEYS];
        int decline = 0;
        for (int j = 0; j < NKEYS; j++) {
            bp_text x;
            found[j] = (uint8_t)search(lines, n, KEYS[j], &x);
            if (found[j] && bp_num(x, &val[j]) != 1) { /* NUM always reads; -1: a number too long */
                decline = 1;
                break;
            }
        }
        if (decline) {
            status[b] = BP_DECLINE;
            continue;
        }
        if (!found[PROMPT_N] && !found[PREDICTED_N]) continue;
        int64_t r = bp_add(out, b, 0);
        if (r < 0) return -1;
        for (int j = 0; j < NKEYS; j++)
            if (found[j]) *bp_f(out, r, j) = val[j];
        bp_code(out, r, 0, 0);
        used[b] = n;
    }
    return 0;
}
