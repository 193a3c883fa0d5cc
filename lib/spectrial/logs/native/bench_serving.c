/* sglang.bench_serving compiled: a `==== Serving Benchmark Result ====` block, rows `label: value` up to the closing
 * `=` rule, one record per block (the Python function in sglang.py is the reference). */
#include <stdio.h>
#include <string.h>

#include "blockpass.h"

/* the float columns, in sglang.BENCH_COLUMNS's order without `backend` (the Spec in sglang.py names the same) */
static const char *FLOATS[] = {
    "request_rate", "max_concurrency", "successful_requests", "failed_requests", "duration_s",
    "total_input_tokens", "total_output_tokens", "request_throughput", "input_throughput", "output_throughput",
    "peak_output_throughput", "peak_concurrency", "total_throughput", "concurrency", "accept_len", "accept_rate",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2e_ms", "median_e2e_ms", "p99_e2e_ms"};
#define NF ((int)(sizeof(FLOATS) / sizeof(*FLOATS)))
const char bp_bench_serving_columns[] =
    "request_rate,max_concurrency,successful_requests,failed_requests,duration_s,total_input_tokens,"
    "total_output_tokens,request_throughput,input_throughput,output_throughput,peak_output_throughput,"
    "peak_concurrency,total_throughput,concurrency,accept_len,accept_rate,mean_ttft_ms,median_ttft_ms,p99_ttft_ms,"
    "mean_tpot_ms,median_tpot_ms,p99_tpot_ms,mean_itl_ms,median_itl_ms,p99_itl_ms,mean_e2e_ms,median_e2e_ms,"
    "p99_e2e_ms|backend|engine";

/* sglang._LABELS */
static const char *LABELS[][2] = {
    {"backend", "backend"},
    {"traffic request rate", "request_rate"},
    {"request rate", "request_rate"},
    {"max request concurrency", "max_concurrency"},
    {"maximum request concurrency", "max_concurrency"},
    {"successful requests", "successful_requests"},
    {"failed requests", "failed_requests"},
    {"benchmark duration (s)", "duration_s"},
    {"total input tokens", "total_input_tokens"},
    {"total generated tokens", "total_output_tokens"},
    {"request throughput (req/s)", "request_throughput"},
    {"input token throughput (tok/s)", "input_throughput"},
    {"output token throughput (tok/s)", "output_throughput"},
    {"peak output token throughput (tok/s)", "peak_output_throughput"},
    {"peak concurrent requests", "peak_concurrency"},
    {"total token throughput (tok/s)", "total_throughput"},
    {"total throughput (tok/s)", "total_throughput"},
    {"concurrency", "concurrency"},
    {"accept length", "accept_len"},
    {"acceptance length", "accept_len"},
    {"acceptance rate (%)", "accept_rate"},
};
#define NLABELS ((int)(sizeof(LABELS) / sizeof(*LABELS)))
#define BACKEND (-2)

static int float_index(const char *name, size_t len) {
    for (int j = 0; j < NF; j++)
        if (strlen(FLOATS[j]) == len && memcmp(FLOATS[j], name, len) == 0) return j;
    return -1;
}

/* sglang._bench_column: the column of a row's label (BACKEND, a float column, or -1); index[j]: LABELS[j]'s. */
static int column_of(bp_text label, const int *index) {
    char key[96];
    int32_t n = bp_norm(label, key, (int32_t)sizeof(key) - 1);
    if (n < 0) return -1;
    for (int32_t j = 0; j + 8 <= n; j++) { /* .replace("reqeuest", "request") */
        if (memcmp(key + j, "reqeuest", 8) == 0) {
            memmove(key + j + 3, key + j + 4, (size_t)(n - j - 4));
            n--;
        }
    }
    key[n] = 0;
    for (int j = 0; j < NLABELS; j++) {
        if (key[0] == LABELS[j][0][0] && strcmp(key, LABELS[j][0]) == 0) return index[j];
    }
    /* _LAT: ^(mean|median|p99) (ttft|tpot|itl|e2e latency) \(ms\)$ */
    static const char *STATS[] = {"mean", "median", "p99"};
    static const char *METRICS[][2] = {{"ttft", "ttft"}, {"tpot", "tpot"}, {"itl", "itl"}, {"e2e latency", "e2e"}};
    for (int a = 0; a < 3; a++) {
        size_t la = strlen(STATS[a]);
        if (strncmp(key, STATS[a], la) != 0 || key[la] != ' ') continue;
        for (int b = 0; b < 4; b++) {
            size_t lb = strlen(METRICS[b][0]);
            const char *p = key + la + 1;
            if (strncmp(p, METRICS[b][0], lb) == 0 && strcmp(p + lb, " (ms)") == 0) {
                char name[32];
                size_t m = (size_t)snprintf(name, sizeof(name), "%s_%s_ms", STATS[a], METRICS[b][1]);
                return float_index(name, m);
            }
        }
    }
    return -1;
}

static int is_close(bp_text s) { /* _CLOSE: ^\s*={10,}\s*$ */
    bp_text t = bp_strip(s);
    if (t.len < 10) return 0;
    for (int32_t j = 0; j < t.len; j++)
        if (t.s[j] != '=') return 0;
    return 1;
}

static int is_section(bp_text s) { /* _SECTION: ^\s*-{3,}.*?-{3,}\s*$ */
    bp_text t = bp_strip(s);
    return t.len >= 6 && bp_starts(t, "---") && bp_ends(t, "---");
}

int bp_bench_serving(const bp_chunk *ch, const int64_t *at, int64_t nb, int64_t *used, int64_t *examined,
                     int64_t *status, bp_out *out) {
    int index[NLABELS];
    for (int j = 0; j < NLABELS; j++)
        index[j] = strcmp(LABELS[j][1], "backend") == 0 ? BACKEND : float_index(LABELS[j][1], strlen(LABELS[j][1]));
    const int accept_rate = float_index("accept_rate", 11), failed = float_index("failed_requests", 15);
    for (int64_t b = 0; b < nb; b++) {
        double val[NF];
        uint8_t present[NF], found[NF];
        bp_text backend = {NULL, 0};
        int has_backend = 0, decline = 0, more = 0;
        memset(present, 0, sizeof(present));
        memset(found, 0, sizeof(found));
        int64_t k = 1;
        bp_text s;
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
            bp_text l = bp_lstrip(s);
            uint8_t head = l.len ? l.s[0] : 0;
            if (head == '=' && is_close(s)) {
                k++;
                break;
            }
            if (head == '-' && is_section(s)) {
                k++;
                continue;
            }
            int32_t colon = bp_find(s, ":");
            if (colon < 0) break;
            bp_text rest = bp_sub(s, colon + 1, s.len);
            bp_text value = bp_strip(rest);
            bp_text lrest = bp_lstrip(rest);
            if (value.len == 0 || colon > 80 || s.len - lrest.len < 30) break;
            int col = column_of(bp_sub(s, 0, colon), index);
            if (col == BACKEND) {
                backend = value;
                has_backend = 1;
            } else if (col >= 0) {
                double v;
                int got = bp_num(value, &v);
                if (got < 0) {
                    decline = 1;
                    break;
                }
                present[col] = 1;
                found[col] = (uint8_t)got;
                if (got) val[col] = col == accept_rate ? v / 100 : v;
            }
            k++;
        }
        if (more || decline) {
            status[b] = more ? BP_MORE : BP_DECLINE;
            continue;
        }
        int any = 0;
        for (int j = 0; j < NF; j++) any |= found[j];
        if (!any) continue;
        int64_t r = bp_add(out, b, 0);
        if (r < 0) return -1;
        for (int j = 0; j < NF; j++)
            if (found[j]) *bp_f(out, r, j) = val[j];
        if (has_backend) bp_span(out, r, 0, ch, backend);
        int vllm = !has_backend && present[failed];
        bp_code(out, r, 0, vllm ? 1 : 0);
        used[b] = k;
    }
    return 0;
}
