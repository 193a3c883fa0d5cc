/* llamacpp.speed_bench compiled: server-bench's speed-bench table, a header of names on the marker line, dashed
 * rules, rows of as many whitespace-separated cells as the header has names; one record per row (the Python
 * function in llamacpp.py is the reference). */
#include <math.h>
#include <string.h>

#include "blockpass.h"

/* the columns (the Spec in llamacpp.py names the same): the floats of llamacpp._SPEED_BENCH, then `category` */
const char bp_speed_bench_columns[] =
    "base_gen_throughput,gen_throughput,speedup,base_latency_s,latency_s,latency_speedup,accept_rate|category|";
#define CATEGORY (-2)
#define NONE (-1)
#define MAX_HEADER 256 /* names in a header; a wider one is left to the Python function */

/* llamacpp._SPEED_BENCH: header name -> float column (CATEGORY: the string column) */
static const char *const NAMES[] = {"category",         "base_avg_pred_t/s", "spec_avg_pred_t/s", "decode_speedup",
                              "base_avg_latency", "spec_avg_latency",  "latency_speedup",   "accept_rate"};

static int column_of(bp_text name) {
    for (int j = 0; j < (int)(sizeof(NAMES) / sizeof(*NAMES)); j++)
        if (bp_eq(name, NAMES[j])) return j == 0 ? CATEGORY : j - 1;
    return NONE;
}

/* The next word of s.split() at or after *i (Python's whitespace on plain text); 0 when there is none. */
static int next_word(bp_text s, int32_t *i, bp_text *word) {
    int32_t j = *i;
    while (j < s.len && bp_space(s.s[j])) j++;
    if (j >= s.len) return 0;
    int32_t a = j;
    while (j < s.len && !bp_space(s.s[j])) j++;
    *word = bp_sub(s, a, j);
    *i = j;
    return 1;
}

static int is_rule(bp_text s) { /* `cells and set(s.strip()) <= set("- ")` */
    bp_text t = bp_strip(s);
    if (t.len == 0) return 0;
    for (int32_t j = 0; j < t.len; j++)
        if (t.s[j] != '-' && t.s[j] != ' ') return 0;
    return 1;
}

int bp_speed_bench(const bp_chunk *ch, const int64_t *at, int64_t nb, int64_t *used, int64_t *examined,
                   int64_t *status, bp_out *out) {
    for (int64_t b = 0; b < nb; b++) {
        int8_t cols[MAX_HEADER];
        int32_t nh = 0, mapped = 0;
        bp_text s, word;
        examined[b] = 1;
        if (bp_line(ch, at[b], 0, &s) == BP_LINE) { /* `(w[0] or "").split()` */
            int32_t i = 0, wide = 0;
            while (next_word(s, &i, &word)) {
                if (nh >= MAX_HEADER) {
                    wide = 1;
                    break;
                }
                cols[nh] = (int8_t)column_of(word);
                mapped |= cols[nh] != NONE;
                nh++;
            }
            if (wide) {
                status[b] = BP_DECLINE;
                continue;
            }
        }
        int64_t first = out->n; /* this block's records: dropped again where it ends in MORE or DECLINE */
        int rows = 0, more = 0, decline = 0;
        int64_t k = 1;
        for (;;) {
            int r = bp_line(ch, at[b], k, &s);
            if (r == BP_PAST) {
                more = 1;
                break;
            }
            if (r == BP_NONE) {
                examined[b] = k;
                break;
            }
            examined[b] = k + 1;
            if (is_rule(s)) {
                k++;
                continue;
            }
            int32_t i = 0, n = 0;
            while (n <= nh && next_word(s, &i, &word)) n++;
            if (n != nh) break;
            rows = 1; /* recs.append((k, rec)), rec maybe {} (no column named): no record, the rows still count */
            if (mapped) {
                int64_t rec = bp_add(out, b, k);
                if (rec < 0) return -1;
                i = 0;
                for (int32_t j = 0; j < nh && next_word(s, &i, &word); j++) {
                    if (cols[j] == CATEGORY) {
                        bp_span(out, rec, 0, ch, word);
                    } else if (cols[j] != NONE) {
                        double v;
                        int got = bp_num(word, &v);
                        if (got < 0) {
                            decline = 1;
                            break;
                        }
                        *bp_f(out, rec, cols[j]) = got ? v : (double)NAN; /* a later same name overwrites */
                    }
                }
                if (decline) break;
            }
            k++;
        }
        if (more || decline) {
            out->n = first;
            status[b] = more ? BP_MORE : BP_DECLINE;
            continue;
        }
        used[b] = rows ? k : 0;
    }
    return 0;
}
