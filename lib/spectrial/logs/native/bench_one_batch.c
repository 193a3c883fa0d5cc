/* sglang.bench_one_batch compiled: `last generation throughput: X tok/s` / `acc_length: X` lines (and
 * sglang.test.send_one's `speed=X token/s` / `acc_length=X`), grouped into one record over up to 8 lines (the
 * Python function in sglang.py is the reference). Its two regexes are searched here as Python's `re` searches
 * them on plain text: the leftmost match, where NUM at a given place matches as far as it can (a shorter NUM
 * would leave a digit, `.`, `e` or a sign next, which neither `\s` nor `tok` begins with). */
#include <math.h>
#include <string.h>

#include "blockpass.h"

/* the columns (the Spec in sglang.py names the same): sglang._ONE's */
const char bp_bench_one_batch_columns[] = "gen_throughput,accept_len||";
#define GEN 0
#define ACC 1
#define LINES 8 /* the Python function's `range(0, 8)` */

static int32_t skip_space(bp_text s, int32_t i) { return bp_skip_space(s, i); }
static int at_lit(bp_text s, int32_t i, const char *lit) { return bp_at(s, i, lit); }

/* The end of text.NUM matched at s[i], or -1 where it does not match there. */
static int32_t num_end(bp_text s, int32_t i) {
    int32_t n = i >= 0 && i <= s.len ? bp_num_len(s.s + i, s.len - i) : 0;
    return n > 0 ? i + n : -1;
}

/* `(NUM)\s*tok(?:en)?/s` at s[i]: 1 with the number's span in *g. */
static int num_tok(bp_text s, int32_t i, bp_text *g) {
    int32_t e = num_end(s, i);
    if (e < 0) return 0;
    int32_t j = skip_space(s, e);
    if (!at_lit(s, j, "tok")) return 0;
    j += 3;
    if (!at_lit(s, j, "en/s") && !at_lit(s, j, "/s")) return 0;
    *g = bp_sub(s, i, e);
    return 1;
}

/* _ONE["gen_throughput"].search(s): (?:last generation throughput:\s*|^\s*speed=)(NUM)\s*tok(?:en)?/s. The
 * `^` branch can only match at 0, where the other cannot (its first character is `l`): it is the leftmost match
 * where it matches; else the first `last generation throughput:` that the rest follows. */
static int gen_search(bp_text s, bp_text *g) {
    int32_t i = skip_space(s, 0);
    if (at_lit(s, i, "speed=") && num_tok(s, i + 6, g)) return 1;
    static const char LAST[] = "last generation throughput:";
    for (int32_t from = 0; from < s.len;) {
        int32_t p = bp_find(bp_sub(s, from, s.len), LAST);
        if (p < 0) return 0;
        p += from;
        if (num_tok(s, skip_space(s, p + (int32_t)sizeof(LAST) - 1), g)) return 1;
        from = p + 1;
    }
    return 0;
}

/* _ONE["accept_len"].search(s): acc_length\s*[:=]\s*(NUM), the first `acc_length` that the rest follows. */
static int acc_search(bp_text s, bp_text *g) {
    for (int32_t from = 0; from < s.len;) {
        int32_t p = bp_find(bp_sub(s, from, s.len), "acc_length");
        if (p < 0) return 0;
        p += from;
        int32_t j = skip_space(s, p + 10);
        if (j < s.len && (s.s[j] == ':' || s.s[j] == '=')) {
            j = skip_space(s, j + 1);
            int32_t e = num_end(s, j);
            if (e >= 0) {
                *g = bp_sub(s, j, e);
                return 1;
            }
        }
        from = p + 1;
    }
    return 0;
}

static int blank(bp_text s) { return bp_strip(s).len == 0; }

int bp_bench_one_batch(const bp_chunk *ch, const int64_t *at, int64_t nb, int64_t *used, int64_t *examined,
                       int64_t *status, bp_out *out) {
    for (int64_t b = 0; b < nb; b++) {
        double val[2] = {NAN, NAN};
        int have[2] = {0, 0}, more = 0, decline = 0;
        int64_t last = 0;
        examined[b] = 1;
        for (int64_t k = 0; k < LINES; k++) {
            bp_text s, g[2];
            int r = bp_line(ch, at[b], k, &s);
            if (r == BP_PAST) {
                more = 1;
                break;
            }
            if (r == BP_NONE) break;
            examined[b] = k + 1;
            int found[2] = {gen_search(s, &g[GEN]), acc_search(s, &g[ACC])};
            if ((found[GEN] && have[GEN]) || (found[ACC] && have[ACC])) break; /* the next record begins */
            if (found[GEN] || found[ACC]) {
                for (int c = 0; c < 2; c++) {
                    if (!found[c]) continue;
                    double v;
                    int got = bp_num(g[c], &v);
                    if (got < 0) {
                        decline = 1;
                        break;
                    }
                    val[c] = got ? v : (double)NAN; /* num() of a NUM match is never None */
                    have[c] = 1;
                }
                if (decline) break;
                last = k + 1;
            } else if (!blank(s) && have[GEN] && have[ACC]) {
                break;
            }
        }
        if (more || decline) {
            status[b] = more ? BP_MORE : BP_DECLINE;
            continue;
        }
        if (!have[GEN] && !have[ACC]) continue;
        int64_t rec = bp_add(out, b, 0);
        if (rec < 0) return -1;
        for (int c = 0; c < 2; c++)
            if (have[c]) *bp_f(out, rec, c) = val[c];
        used[b] = last;
    }
    return 0;
}
