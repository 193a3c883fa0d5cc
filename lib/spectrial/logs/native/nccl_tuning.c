/* nccl.tuning_table compiled: an `NCCL_DEBUG_SUBSYS=TUNING` table (`Algorithm | ...` then `Protocol | ...`, or the
 * old `Latency/AlgBw | Tree/ LL | ...`), then rows `name | lat/bw | ...` with as many cells as the table has
 * columns, one record per row x column (the Python function in nccl.py is the reference). */
#include <math.h>
#include <string.h>

#include "blockpass.h"

const char bp_nccl_tuning_columns[] = "pid,rank,latency_us,bw_gbs,nthreads|host,collective,algorithm,protocol|";
enum { PID, RANK, LATENCY, BW, NTHREADS };      /* float columns */
enum { HOST, COLLECTIVE, ALGORITHM, PROTOCOL }; /* string columns */

#define MAXC 256 /* columns of a table read here (NCCL prints at most 7 algorithms x 3 protocols); more: DECLINE */

/* _INFO's group 1: what follows the line's first `NCCL INFO` / `NCCL TRACE` (give or take the one whitespace
 * character the regex skips: the cells are stripped). 0 where neither is. */
static int body_of(bp_text s, bp_text *body) {
    int32_t from = 0;
    while (from < s.len) {
        int32_t p = bp_find(bp_sub(s, from, s.len), "NCCL ");
        if (p < 0) return 0;
        int32_t i = from + p + 5;
        bp_text rest = bp_sub(s, i, s.len);
        if (bp_starts(rest, "INFO")) {
            *body = bp_sub(s, i + 4, s.len);
            return 1;
        }
        if (bp_starts(rest, "TRACE")) {
            *body = bp_sub(s, i + 5, s.len);
            return 1;
        }
        from = from + p + 1;
    }
    return 0;
}

/* _cells: a table line's stripped cells (the name, then the values; a last empty cell dropped), the first `cap`
 * into out. Returns how many there are, or -1 where the line is no table line (no NCCL INFO/TRACE, no `|`
 * after it). */
static int64_t cells(bp_text s, bp_text *out, int64_t cap) {
    bp_text body;
    if (!body_of(s, &body) || bp_find(body, "|") < 0) return -1;
    int64_t n = 0;
    int32_t a = 0, last = 0;
    for (int32_t i = 0; i <= body.len; i++) {
        if (i == body.len || body.s[i] == '|') {
            bp_text c = bp_strip(bp_sub(body, a, i));
            if (n < cap) out[n] = c;
            n++;
            last = c.len;
            a = i + 1;
        }
    }
    return last == 0 ? n - 1 : n; /* the split gives 2 parts or more: n - 1 >= 1 */
}

static int host_char(uint8_t c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || bp_digit(c) || c == '_' || c == '.' || c == '-';
}

/* The digits at s[i..] (at least one); their end, or -1. */
static int32_t digits_at(bp_text s, int32_t i) {
    int32_t j = i;
    while (j < s.len && bp_digit(s.s[j])) j++;
    return j > i ? j : -1;
}

/* float() of a run of ASCII digits: 1, or -1 where it is too long to be read exactly here (DECLINE). */
static int digits_value(bp_text d, double *v) {
    if (d.len > 19) return -1;
    uint64_t x = 0;
    for (int32_t j = 0; j < d.len; j++) x = x * 10 + (uint64_t)(d.s[j] - '0');
    *v = (double)x; /* correctly rounded, as float("...") */
    return 1;
}

/* _HOSTPID.search: `host:pid:tid [n] NCCL`, the host a whole run of [A-Za-z0-9_.-] (the first such run followed by
 * the rest of the pattern). */
static int host_pid(bp_text s, bp_text *host, bp_text *pid) {
    int32_t i = 0;
    while (i < s.len) {
        if (!host_char(s.s[i])) {
            i++;
            continue;
        }
        int32_t a = i;
        while (i < s.len && host_char(s.s[i])) i++;
        int32_t j = i, p0, p1, e;
        if (j >= s.len || s.s[j] != ':') continue;
        p0 = j + 1;
        if ((p1 = digits_at(s, p0)) < 0 || p1 >= s.len || s.s[p1] != ':') continue;
        if ((e = digits_at(s, p1 + 1)) < 0) continue;
        if (!bp_starts(bp_sub(s, e, s.len), " [")) continue;
        if ((e = digits_at(s, e + 2)) < 0) continue;
        if (!bp_starts(bp_sub(s, e, s.len), "] NCCL")) continue;
        *host = bp_sub(s, a, i);
        *pid = bp_sub(s, p0, p1);
        return 1;
    }
    return 0;
}

/* _RANKPY.search: `[rank]`, then before the next `[`, `NCCL INFO|WARN|TRACE|ERROR`. */
static int rank_of(bp_text s, bp_text *rank) {
    static const char *const LEVELS[] = {"INFO", "WARN", "TRACE", "ERROR"};
    for (int32_t i = 0; i < s.len; i++) {
        if (s.s[i] != '[') continue;
        int32_t e = digits_at(s, i + 1);
        if (e < 0 || e >= s.len || s.s[e] != ']') continue;
        int32_t end = e + 1; /* the next `[` or the line's end */
        while (end < s.len && s.s[end] != '[') end++;
        bp_text gap = bp_sub(s, e + 1, end);
        int32_t from = 0;
        while (from < gap.len) {
            int32_t p = bp_find(bp_sub(gap, from, gap.len), "NCCL ");
            if (p < 0) break;
            bp_text rest = bp_sub(gap, from + p + 5, gap.len);
            for (int l = 0; l < 4; l++) {
                if (bp_starts(rest, LEVELS[l])) {
                    *rank = bp_sub(s, i + 1, e);
                    return 1;
                }
            }
            from = from + p + 1;
        }
    }
    return 0;
}

static int starts_nocase(bp_text t, const char *lit) { /* t.lower().startswith(lit), lit lower-case ASCII */
    size_t n = strlen(lit);
    if ((size_t)t.len < n) return 0;
    for (size_t j = 0; j < n; j++) {
        uint8_t c = t.s[j];
        if (c >= 'A' && c <= 'Z') c = (uint8_t)(c + 32);
        if (c != (uint8_t)lit[j]) return 0;
    }
    return 1;
}

/* One block: 0 (answered), BP_DECLINE, BP_MORE, or -1 (out of memory). */
static int table(const bp_chunk *ch, int64_t b, int64_t at, int64_t *used, int64_t *examined, bp_out *out) {
    bp_text head[MAXC + 1], second[MAXC + 1], row[MAXC + 1];
    bp_text algos[MAXC], protos[MAXC];
    double nth[MAXC];
    bp_text s0, s1, s;
    int r = bp_line(ch, at, 0, &s0);
    if (r == BP_PAST) return BP_MORE;
    *examined = 1;
    if (r == BP_NONE) return 0;
    int64_t nh = cells(s0, head, MAXC + 1);
    if (nh < 0) return 0; /* not a table: nothing */
    int64_t width, k;
    bp_text body;
    body_of(s0, &body);
    bp_text after = bp_sub(body, bp_find(body, "|") + 1, body.len);
    if (bp_find(after, "/") >= 0) { /* old: `Latency/AlgBw | Tree/ LL | ...` */
        width = nh - 1;
        if (width > MAXC) return BP_DECLINE;
        for (int64_t j = 0; j < width; j++) {
            bp_text c = head[j + 1];
            int32_t slash = bp_find(c, "/");
            if (slash < 0) {
                algos[j] = protos[j] = c;
            } else {
                algos[j] = bp_strip(bp_sub(c, 0, slash));
                protos[j] = bp_strip(bp_sub(c, slash + 1, c.len));
            }
        }
        k = 1;
    } else { /* new: `Algorithm | Tree | Ring |` then `Protocol | LL | LL128 | Simple | ...` */
        r = bp_line(ch, at, 1, &s1);
        if (r == BP_PAST) return BP_MORE;
        if (r == BP_NONE) return 0;
        *examined = 2;
        int64_t np = cells(s1, second, MAXC + 1);
        if (np < 0 || !bp_starts(second[0], "Protocol") || nh < 2) return 0;
        if (nh - 1 > MAXC || np - 1 > MAXC) return BP_DECLINE;
        width = np - 1;
        int64_t nalg = nh - 1, per = width / nalg;
        if (per < 1) per = 1;
        for (int64_t j = 0; j < width; j++) {
            int64_t a = j / per;
            algos[j] = head[1 + (a < nalg - 1 ? a : nalg - 1)];
            protos[j] = second[j + 1];
        }
        k = 2;
    }
    bp_text host, pid, rank;
    double pid_v = 0, rank_v = 0;
    int has_host = host_pid(s0, &host, &pid), has_rank = rank_of(s0, &rank);
    if (has_host && digits_value(pid, &pid_v) < 0) return BP_DECLINE;
    if (has_rank && digits_value(rank, &rank_v) < 0) return BP_DECLINE;
    for (int64_t j = 0; j < width; j++) nth[j] = NAN;
    int64_t r0 = out->n;
    int rows = 0, status = 0;
    for (;; k++) {
        r = bp_line(ch, at, k, &s);
        if (r == BP_PAST) {
            status = BP_MORE;
            break;
        }
        if (r == BP_NONE) break;
        *examined = k + 1;
        int64_t n = cells(s, row, MAXC + 1);
        if (n < 0 || n - 1 != width) break;
        if (starts_nocase(row[0], "max nthreads")) { /* the last such row holds for the whole table */
            for (int64_t j = 0; j < width; j++) {
                double v;
                int got = bp_num(row[j + 1], &v);
                if (got < 0) {
                    status = BP_DECLINE;
                    break;
                }
                nth[j] = got ? v : NAN;
            }
            if (status) break;
            continue;
        }
        for (int64_t j = 0; j < width; j++) {
            bp_text c = row[j + 1], lat = c, bw = {c.s + c.len, 0};
            int32_t slash = bp_find(c, "/");
            if (slash >= 0) {
                lat = bp_sub(c, 0, slash);
                bw = bp_sub(c, slash + 1, c.len);
            }
            double lv, bv;
            int gl = bp_num(lat, &lv), gb = bp_num(bw, &bv);
            if (gl < 0 || gb < 0) {
                status = BP_DECLINE;
                break;
            }
            int64_t rec = bp_add(out, b, k);
            if (rec < 0) return -1;
            bp_span(out, rec, COLLECTIVE, ch, row[0]);
            if (gl) *bp_f(out, rec, LATENCY) = lv;
            if (gb) *bp_f(out, rec, BW) = bv;
        }
        if (status) break;
        rows = 1;
    }
    if (status) {
        out->n = r0; /* this block's records go */
        return status;
    }
    if (!rows) { /* the table was cut before its collectives: keep the thread counts */
        for (int64_t j = 0; j < width; j++)
            if (bp_add(out, b, 0) < 0) return -1;
    }
    for (int64_t rec = r0; rec < out->n; rec++) {
        int64_t j = width ? (rec - r0) % width : 0; /* records come row by row, column by column */
        bp_span(out, rec, ALGORITHM, ch, algos[j]);
        bp_span(out, rec, PROTOCOL, ch, protos[j]);
        *bp_f(out, rec, NTHREADS) = nth[j];
        if (has_host) {
            bp_span(out, rec, HOST, ch, host);
            *bp_f(out, rec, PID) = pid_v;
        }
        if (has_rank) *bp_f(out, rec, RANK) = rank_v;
    }
    *used = k;
    return 0;
}

int bp_nccl_tuning(const bp_chunk *ch, const int64_t *at, int64_t nb, int64_t *used, int64_t *examined,
                   int64_t *status, bp_out *out) {
    for (int64_t b = 0; b < nb; b++) {
        int r = table(ch, b, at[b], &used[b], &examined[b], out);
        if (r < 0) return -1;
        if (r) {
            status[b] = r;
            used[b] = 0;
        }
    }
    return 0;
}
