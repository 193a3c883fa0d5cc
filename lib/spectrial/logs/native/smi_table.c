/* nvidia_smi.smi_table compiled: the `nvidia-smi` table. The header line (the marker) gives the driver and CUDA
 * versions, a date line up to 3 lines above it the timestamp; then, while a line (quotes `> ` taken off, stripped)
 * starts with `|` or `+`, each line that _ROW1 matches is a GPU, its values on the next line (_ROW2). The Python
 * function in nvidia_smi.py is the reference; each regex is mirrored here step by step, as Python's backtracking
 * finds its first match (on plain ASCII text: \s is [\t\n\v\f\r ], \b a change between [A-Za-z0-9_] and not). */
#include <string.h>

#include "blockpass.h"
#include "smi.h"

enum { F_INDEX, F_FAN, F_TEMP, F_POWER, F_CAP, F_USED, F_TOTAL, F_UTIL, NF };
enum { S_NAME, S_BUS, S_PSTATE, S_DRIVER, S_CUDA, S_TIMESTAMP, NS };
const char bp_smi_table_columns[] =
    "index,fan_pct,temp_c,power_w,power_cap_w,memory_used_mib,memory_total_mib,util_pct"
    "|name,bus_id,pstate,driver_version,cuda_version,timestamp|persistence";

#define MAX_ROW2 2048 /* a values line longer than this: DECLINE (the searches below are quadratic at worst) */

static int word(uint8_t c) { return bp_digit(c) || c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z'); }
static int hex(uint8_t c) { return bp_digit(c) || ((c | 32) >= 'a' && (c | 32) <= 'f'); }
static int at_lit_n(bp_text t, int32_t i, const char *lit, size_t n) {
    return i >= 0 && i <= t.len && (size_t)(t.len - i) >= n && t.s[i] == (uint8_t)lit[0] &&
           memcmp(t.s + i, lit, n) == 0;
}
#define at_lit(t, i, lit) at_lit_n(t, i, lit, sizeof(lit) - 1) /* lit: a string literal */
static int32_t skip_digits(bp_text t, int32_t i) {
    while (i < t.len && bp_digit(t.s[i])) i++;
    return i;
}

/* text.NUM at i (greedy: the longest, the only end a following \s*W can follow): its end, or -1. */
static int32_t num_end(bp_text t, int32_t i) {
    int32_t n = i >= 0 && i <= t.len ? bp_num_len(t.s + i, t.len - i) : 0;
    return n > 0 ? i + n : -1;
}

/* num() of t[a:b] into *v: 1, or -1 (not certain: DECLINE). */
static int value(bp_text t, int32_t a, int32_t b, double *v) {
    int got = bp_num(bp_sub(t, a, b), v);
    return got == 1 ? 1 : -1;
}

/* [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f] at p: its end, or -1. */
static int32_t bus_at(bp_text t, int32_t p) {
    int32_t h = 0;
    while (h < 9 && p + h < t.len && hex(t.s[p + h])) h++;
    if (h < 4 || h > 8) return -1;
    int32_t q = p + h;
    if (!(ch_is(t, q, ':') && q + 2 < t.len && hex(t.s[q + 1]) && hex(t.s[q + 2]) && ch_is(t, q + 3, ':') &&
          q + 5 < t.len && hex(t.s[q + 4]) && hex(t.s[q + 5]) && ch_is(t, q + 6, '.') && q + 7 < t.len &&
          hex(t.s[q + 7])))
        return -1;
    return q + 8;
}

/* \s*\|\s*(?P<bus_id>...) at x: 1 with the bus span, or 0. */
static int rest_at(bp_text t, int32_t x, int32_t *bus0, int32_t *bus1) {
    int32_t j = skip_ws(t, x);
    if (!ch_is(t, j, '|')) return 0;
    j = skip_ws(t, j + 1);
    int32_t e = bus_at(t, j);
    if (e < 0) return 0;
    *bus0 = j;
    *bus1 = e;
    return 1;
}

typedef struct {
    int32_t run_end; /* the whitespace run of the last position asked about ends here (-1: none yet) */
    int ok, pers;
    int32_t bus0, bus1;
} cont_memo;

/* What follows the name, at e: (?:\s+(?P<persistence>On|Off))?\s*\|\s*(?P<bus_id>...). For e in a whitespace run
 * the answer depends on the run's end alone (remembered: the name's loop stays linear). */
static int cont_at(bp_text t, int32_t e, cont_memo *m, int *pers, int32_t *bus0, int32_t *bus1) {
    if (e < t.len && bp_space(t.s[e])) {
        int32_t j = skip_ws(t, e);
        if (m->run_end != j) {
            m->run_end = j;
            m->pers = -1;
            m->ok = 0;
            if (at_lit(t, j, "On") && rest_at(t, j + 2, &m->bus0, &m->bus1)) {
                m->ok = 1;
                m->pers = 0;
            } else if (at_lit(t, j, "Off") && rest_at(t, j + 3, &m->bus0, &m->bus1)) {
                m->ok = 1;
                m->pers = 1;
            } else if (rest_at(t, j, &m->bus0, &m->bus1)) {
                m->ok = 1;
            }
        }
        *pers = m->pers;
        *bus0 = m->bus0;
        *bus1 = m->bus1;
        return m->ok;
    }
    *pers = -1;
    return rest_at(t, e, bus0, bus1);
}

typedef struct {
    int32_t idx0, idx1, name0, name1, bus0, bus1;
    int pers; /* 0 On, 1 Off, -1 None */
} row1;

/* _ROW1.match(t): ^\|\s*(?P<index>[0-9]+)\s+(?P<name>.+?)(?:\s+(?P<persistence>On|Off))?\s*\|\s*(?P<bus_id>...) */
static int match_row1(bp_text t, row1 *r) {
    if (!ch_is(t, 0, '|')) return 0;
    int32_t d0 = skip_ws(t, 1), d1 = skip_digits(t, d0);
    if (d1 == d0 || !(d1 < t.len && bp_space(t.s[d1]))) return 0;
    int32_t p = skip_ws(t, d1); /* \s+ takes the whole run first: the name starts at p */
    cont_memo m = {-1, 0, -1, 0, 0};
    r->idx0 = d0;
    r->idx1 = d1;
    for (int32_t e = p + 1; e <= t.len; e++) { /* .+? : the shortest name first */
        if (cont_at(t, e, &m, &r->pers, &r->bus0, &r->bus1)) {
            r->name0 = p;
            r->name1 = e;
            return 1;
        }
    }
    /* \s+ gives back a character at a time: the name starts at s (one character; every longer one was tried) */
    for (int32_t s = p - 1; s >= d1 + 1; s--) {
        if (cont_at(t, s + 1, &m, &r->pers, &r->bus0, &r->bus1)) {
            r->name0 = s;
            r->name1 = s + 1;
            return 1;
        }
    }
    return 0;
}

/* _DATE.match: ^\s*(?P<timestamp>[A-Z][a-z]{2} [A-Z][a-z]{2} +[0-9]{1,2} [0-9]{2}:[0-9]{2}:[0-9]{2} [0-9]{4}) */
static int match_date(bp_text t, bp_text *ts) {
    int32_t i0 = skip_ws(t, 0), i = i0;
    for (int part = 0; part < 2; part++) {
        if (!(i + 2 < t.len && t.s[i] >= 'A' && t.s[i] <= 'Z' && t.s[i + 1] >= 'a' && t.s[i + 1] <= 'z' &&
              t.s[i + 2] >= 'a' && t.s[i + 2] <= 'z' && ch_is(t, i + 3, ' ')))
            return 0;
        i += 4;
    }
    while (ch_is(t, i, ' ')) i++;
    int32_t d = skip_digits(t, i) - i;
    if (d < 1 || d > 2 || !ch_is(t, i + d, ' ')) return 0;
    i += d + 1;
    static const char shape[] = "00:00:00 0000"; /* 0: a digit */
    for (int j = 0; shape[j]; j++, i++) {
        if (i >= t.len) return 0;
        if (shape[j] == '0' ? !bp_digit(t.s[i]) : t.s[i] != (uint8_t)shape[j]) return 0;
    }
    *ts = bp_sub(t, i0, i);
    return 1;
}

/* _DRIVER / _CUDA .search: the first `<a> Version:` or `<b> Version:` followed by \s*([0-9][0-9A-Za-z.-]*); its
 * group, or len -1. (The match that starts first is the one at the first `Version:`: the two prefixes cannot both
 * end there, and `Version:` is longer than the difference of their lengths.) */
static bp_text version(bp_text t, const char *a, const char *b) {
    bp_text none = {NULL, -1};
    size_t la = strlen(a), lb = strlen(b);
    for (int32_t i = 0; i < t.len;) {
        int32_t v = bp_find(bp_sub(t, i, t.len), "Version:");
        if (v < 0) break;
        v += i;
        i = v + 1;
        if (!((v >= (int32_t)la && at_lit_n(t, v - (int32_t)la, a, la)) ||
              (v >= (int32_t)lb && at_lit_n(t, v - (int32_t)lb, b, lb))))
            continue;
        int32_t j = skip_ws(t, v + 8);
        if (!(j < t.len && bp_digit(t.s[j]))) continue;
        int32_t e = j + 1;
        while (e < t.len && (bp_digit(t.s[e]) || ((t.s[e] | 32) >= 'a' && (t.s[e] | 32) <= 'z') || t.s[e] == '.' ||
                             t.s[e] == '-'))
            e++;
        return bp_sub(t, j, e);
    }
    return none;
}

/* The _ROW2 searches over the values line: each sets its column where it matches; -1: DECLINE. */
static int row2_values(bp_text t, bp_out *out, int64_t rec, const bp_chunk *ch) {
    double v;
    int32_t n = t.len;
    /* fan_pct: ^\|\s*([0-9]+)\s*% */
    if (ch_is(t, 0, '|')) {
        int32_t d0 = skip_ws(t, 1), d1 = skip_digits(t, d0);
        if (d1 > d0 && ch_is(t, skip_ws(t, d1), '%')) {
            if (value(t, d0, d1, &v) < 0) return -1;
            *bp_f(out, rec, F_FAN) = v;
        }
    }
    /* temp_c: \b([0-9]+)\s*C\b */
    for (int32_t i = 0; i < n; i++) {
        if (!bp_digit(t.s[i]) || (i > 0 && word(t.s[i - 1]))) continue;
        int32_t d1 = skip_digits(t, i), c = skip_ws(t, d1);
        if (ch_is(t, c, 'C') && !(c + 1 < n && word(t.s[c + 1]))) {
            if (value(t, i, d1, &v) < 0) return -1;
            *bp_f(out, rec, F_TEMP) = v;
            break;
        }
        i = d1 - 1;
    }
    /* pstate: \b(P[0-9]{1,2})\b */
    for (int32_t i = 0; i < n; i++) {
        if (t.s[i] != 'P' || (i > 0 && word(t.s[i - 1]))) continue;
        int32_t d = skip_digits(t, i + 1) - (i + 1);
        if ((d == 1 || d == 2) && !(i + 1 + d < n && word(t.s[i + 1 + d]))) {
            bp_span(out, rec, S_PSTATE, ch, bp_sub(t, i, i + 1 + d));
            break;
        }
    }
    /* power_w: (NUM)\s*W\s*[/] */
    for (int32_t i = 0; i < n; i++) {
        int32_t e = num_end(t, i);
        if (e < 0) continue;
        int32_t w = skip_ws(t, e);
        if (ch_is(t, w, 'W') && ch_is(t, skip_ws(t, w + 1), '/')) {
            if (value(t, i, e, &v) < 0) return -1;
            *bp_f(out, rec, F_POWER) = v;
            break;
        }
    }
    /* power_cap_w: /\s*(NUM)\s*W\b */
    for (int32_t i = 0; i < n; i++) {
        if (t.s[i] != '/') continue;
        int32_t a = skip_ws(t, i + 1), e = num_end(t, a);
        if (e < 0) continue;
        int32_t w = skip_ws(t, e);
        if (ch_is(t, w, 'W') && !(w + 1 < n && word(t.s[w + 1]))) {
            if (value(t, a, e, &v) < 0) return -1;
            *bp_f(out, rec, F_CAP) = v;
            break;
        }
    }
    /* memory_used_mib: ([0-9]+)\s*MiB\s*[/] (a match from inside a run of digits ends as one from its start) */
    for (int32_t i = 0; i < n; i++) {
        if (!bp_digit(t.s[i])) continue;
        int32_t d1 = skip_digits(t, i), m = skip_ws(t, d1);
        if (at_lit(t, m, "MiB") && ch_is(t, skip_ws(t, m + 3), '/')) {
            if (value(t, i, d1, &v) < 0) return -1;
            *bp_f(out, rec, F_USED) = v;
            break;
        }
        i = d1 - 1;
    }
    /* memory_total_mib: /\s*([0-9]+)\s*MiB */
    for (int32_t i = 0; i < n; i++) {
        if (t.s[i] != '/') continue;
        int32_t d0 = skip_ws(t, i + 1), d1 = skip_digits(t, d0);
        if (d1 > d0 && at_lit(t, skip_ws(t, d1), "MiB")) {
            if (value(t, d0, d1, &v) < 0) return -1;
            *bp_f(out, rec, F_TOTAL) = v;
            break;
        }
    }
    /* util_pct: MiB\s*\|\s*([0-9]+)\s*% */
    for (int32_t i = 0; i + 3 <= n; i++) {
        if (!at_lit(t, i, "MiB")) continue;
        int32_t b = skip_ws(t, i + 3);
        if (!ch_is(t, b, '|')) continue;
        int32_t d0 = skip_ws(t, b + 1), d1 = skip_digits(t, d0);
        if (d1 > d0 && ch_is(t, skip_ws(t, d1), '%')) {
            if (value(t, d0, d1, &v) < 0) return -1;
            *bp_f(out, rec, F_UTIL) = v;
            break;
        }
    }
    return 0;
}

int bp_smi_table(const bp_chunk *ch, const int64_t *at, int64_t nb, int64_t *used, int64_t *examined,
                 int64_t *status, bp_out *out) {
    for (int64_t b = 0; b < nb; b++) {
        int64_t n0 = out->n;
        bp_text head = {(const uint8_t *)"", 0}, s;
        if (bp_line(ch, at[b], 0, &head) != BP_LINE) head.len = 0;
        bp_text driver = version(head, "Driver ", "KMD ");
        bp_text cuda = version(head, "CUDA UMD ", "CUDA ");
        bp_text stamp = {NULL, -1};
        for (int64_t k = -1; k >= -3; k--) {
            if (bp_line(ch, at[b], k, &s) == BP_LINE && match_date(s, &stamp)) break;
            stamp.len = -1;
        }
        int more = 0, decline = 0;
        int64_t k = 1;
        examined[b] = 1;
        for (;;) {
            int r = bp_line(ch, at[b], k, &s);
            if (r == BP_PAST) {
                more = 1;
                break;
            }
            if (r == BP_NONE) break;
            if (examined[b] < k + 1) examined[b] = k + 1;
            bp_text t = unquote(s);
            if (t.len == 0 || (t.s[0] != '|' && t.s[0] != '+')) break;
            row1 m;
            if (match_row1(t, &m)) {
                bp_text row2 = {(const uint8_t *)"", 0}, s2;
                r = bp_line(ch, at[b], k + 1, &s2);
                if (r == BP_PAST) {
                    more = 1;
                    break;
                }
                if (r == BP_LINE) {
                    row2 = unquote(s2);
                    if (examined[b] < k + 2) examined[b] = k + 2;
                }
                if (row2.len > MAX_ROW2) {
                    decline = 1;
                    break;
                }
                double index;
                if (value(t, m.idx0, m.idx1, &index) < 0) {
                    decline = 1;
                    break;
                }
                int64_t rec = bp_add(out, b, k);
                if (rec < 0) return -1;
                *bp_f(out, rec, F_INDEX) = index;
                bp_span(out, rec, S_NAME, ch, bp_strip(bp_sub(t, m.name0, m.name1)));
                bp_span(out, rec, S_BUS, ch, bp_sub(t, m.bus0, m.bus1));
                if (m.pers >= 0) bp_code(out, rec, 0, m.pers);
                if (driver.len >= 0) bp_span(out, rec, S_DRIVER, ch, driver);
                if (cuda.len >= 0) bp_span(out, rec, S_CUDA, ch, cuda);
                if (stamp.len >= 0) bp_span(out, rec, S_TIMESTAMP, ch, stamp);
                if (row2_values(row2, out, rec, ch) < 0) {
                    decline = 1;
                    break;
                }
            }
            k++;
        }
        if (more || decline) {
            out->n = n0; /* this block's records go */
            status[b] = more ? BP_MORE : BP_DECLINE;
            continue;
        }
        used[b] = out->n > n0 ? k : 0;
    }
    return 0;
}
