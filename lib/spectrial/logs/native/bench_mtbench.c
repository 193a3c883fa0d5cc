/* sglang.bench_mtbench compiled: a `#questions: 80, Throughput: X token/s, Acceptance length: X` line and the
 * label line above it (`<label>:`), one record per marker line (the Python function in sglang.py is the
 * reference). sglang._MT's three regexes are searched here as Python's `re` searches them on plain text: the
 * first place their fixed text begins that the rest follows, NUM matching as far as it can there (a shorter NUM
 * would leave a digit, `.`, `e` or a sign next, which neither `\s` nor `tok` begins with). */
#include <math.h>
#include <string.h>

#include "blockpass.h"

/* the columns (the Spec in sglang.py names the same) */
const char bp_bench_mtbench_columns[] = "questions,gen_throughput,accept_len|label|";
#define QUESTIONS 0
#define GEN 1
#define ACC 2

static int32_t skip_space(bp_text s, int32_t i) { return bp_skip_space(s, i); }
static int at_lit(bp_text s, int32_t i, const char *lit) { return bp_at(s, i, lit); }

/* The end of text.NUM matched at s[i], or -1 where it does not match there. */
static int32_t num_end(bp_text s, int32_t i) {
    int32_t n = i >= 0 && i <= s.len ? bp_num_len(s.s + i, s.len - i) : 0;
    return n > 0 ? i + n : -1;
}

/* The rest of a pattern after its fixed text, at s[i]: the end of the match and the group's span in *g, or -1. */
static int32_t questions_rest(bp_text s, int32_t i, bp_text *g) { /* \s*([0-9]+) */
    int32_t a = skip_space(s, i), e = a;
    while (e < s.len && bp_digit(s.s[e])) e++;
    if (e == a) return -1;
    *g = bp_sub(s, a, e);
    return e;
}

static int32_t throughput_rest(bp_text s, int32_t i, bp_text *g) { /* \s*(NUM)\s*tok */
    int32_t a = skip_space(s, i), e = num_end(s, a);
    if (e < 0) return -1;
    int32_t j = skip_space(s, e);
    if (!at_lit(s, j, "tok")) return -1;
    *g = bp_sub(s, a, e);
    return j + 3;
}

static int32_t accept_rest(bp_text s, int32_t i, bp_text *g) { /* (?:ance)? length:\s*(NUM) */
    if (at_lit(s, i, "ance length:")) {
        i += 12; /* `ance` then ` length:`: either it follows or ` length:` does, never both */
    } else if (at_lit(s, i, " length:")) {
        i += 8;
    } else {
        return -1;
    }
    int32_t a = skip_space(s, i), e = num_end(s, a);
    if (e < 0) return -1;
    *g = bp_sub(s, a, e);
    return e;
}

/* rx.search(s) for a pattern `lit` + rest: the first occurrence of `lit` that the rest follows. */
static int search(bp_text s, const char *lit, int32_t (*rest)(bp_text, int32_t, bp_text *), bp_text *g) {
    int32_t n = (int32_t)strlen(lit);
    for (int32_t from = 0; from < s.len;) {
        int32_t p = bp_find(bp_sub(s, from, s.len), lit);
        if (p < 0) return 0;
        p += from;
        if (rest(s, p + n, g) >= 0) return 1;
        from = p + 1;
    }
    return 0;
}

int bp_bench_mtbench(const bp_chunk *ch, const int64_t *at, int64_t nb, int64_t *used, int64_t *examined,
                     int64_t *status, bp_out *out) {
    static const char *const LIT[] = {"#questions:", "Throughput:", "Accept"};
    int32_t (*const REST[])(bp_text, int32_t, bp_text *) = {questions_rest, throughput_rest, accept_rest};
    for (int64_t b = 0; b < nb; b++) {
        bp_text s = {NULL, 0}, g;
        double val[3];
        int got[3], decline = 0;
        examined[b] = 1;
        int r = bp_line(ch, at[b], 0, &s); /* `w[0] or ""` */
        if (r == BP_PAST) {
            status[b] = BP_MORE;
            continue;
        }
        if (r != BP_LINE) s.len = 0;
        for (int c = 0; c < 3; c++) {
            got[c] = 0; /* absent (None) */
            val[c] = NAN;
            if (!search(s, LIT[c], REST[c], &g)) continue;
            int n = bp_num(g, &val[c]);
            if (n < 0) {
                decline = 1;
                break;
            }
            got[c] = n;
            if (!n) val[c] = NAN;
        }
        if (decline) {
            status[b] = BP_DECLINE;
            continue;
        }
        /* `not rec.get(...)`: None and 0 are false, NaN is true */
        if (!(got[GEN] && val[GEN] != 0) && !(got[ACC] && val[ACC] != 0)) continue;
        int64_t rec = bp_add(out, b, 0);
        if (rec < 0) return -1;
        for (int c = 0; c < 3; c++)
            if (got[c]) *bp_f(out, rec, c) = val[c];
        for (int64_t k = -1; k >= -2; k--) { /* the label: the first non-blank line above, where it ends with `:` */
            bp_text prev;
            if (bp_line(ch, at[b], k, &prev) != BP_LINE) continue;
            prev = bp_strip(prev);
            if (prev.len == 0) continue;
            if (prev.s[prev.len - 1] == ':') bp_span(out, rec, 0, ch, bp_strip(bp_sub(prev, 0, prev.len - 1)));
            break;
        }
        used[b] = 1;
    }
    return 0;
}
