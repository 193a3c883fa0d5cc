/* tables.results_table compiled: a markdown (`a | b` over `-- | --`) or tabulate grid (`+====+`) results table whose
 * marker is its separator line and whose header is the line above it (or the one above that), one record per row
 * (the Python function in tables.py is the reference). */
#include <math.h>
#include <string.h>

#include "blockpass.h"

/* the float columns, in tables.TABLE_COLUMNS's order without `method` (the Spec in tables.py names the same) */
static const char *FLOATS[] = {"batch_size",     "tp_size",        "ep_size",         "steps",
                               "topk",           "num_draft_tokens", "gen_throughput", "output_throughput",
                               "input_throughput", "accept_len",   "latency",         "total_time_s",
                               "max_concurrency", "mean_ttft_ms",  "median_ttft_ms",  "p99_ttft_ms",
                               "mean_tpot_ms",   "median_tpot_ms", "p99_tpot_ms",     "per_user_throughput"};
#define NF ((int)(sizeof(FLOATS) / sizeof(*FLOATS)))
#define METHOD NF         /* the string column `method` */
#define NCOLS (NF + 1)    /* every column a header cell may name */
const char bp_results_table_columns[] =
    "batch_size,tp_size,ep_size,steps,topk,num_draft_tokens,gen_throughput,output_throughput,input_throughput,"
    "accept_len,latency,total_time_s,max_concurrency,mean_ttft_ms,median_ttft_ms,p99_ttft_ms,mean_tpot_ms,"
    "median_tpot_ms,p99_tpot_ms,per_user_throughput|method|engine";

enum { /* FLOATS's indexes */
    BATCH_SIZE, TP_SIZE, EP_SIZE, STEPS, TOPK, NUM_DRAFT_TOKENS, GEN_THROUGHPUT, OUTPUT_THROUGHPUT, INPUT_THROUGHPUT,
    ACCEPT_LEN, LATENCY, TOTAL_TIME_S, MAX_CONCURRENCY, MEAN_TTFT_MS, MEDIAN_TTFT_MS, P99_TTFT_MS, MEAN_TPOT_MS,
    MEDIAN_TPOT_MS, P99_TPOT_MS, PER_USER_THROUGHPUT
};

/* tables.ALIASES: a header cell (lower-cased, whitespace runs made one space) -> its column */
#define A(label, column) {label, sizeof(label) - 1, column}
static const struct {
    const char *label;
    size_t len;
    int column;
} ALIASES[] = {
    A("bs", BATCH_SIZE),
    A("batch_size", BATCH_SIZE),
    A("batch size", BATCH_SIZE),
    A("batch", BATCH_SIZE),
    A("tp", TP_SIZE),
    A("tp_size", TP_SIZE),
    A("ep", EP_SIZE),
    A("ep_size", EP_SIZE),
    A("steps", STEPS),
    A("num_steps", STEPS),
    A("topk", TOPK),
    A("eagle_topk", TOPK),
    A("num_draft_tokens", NUM_DRAFT_TOKENS),
    A("num_draft", NUM_DRAFT_TOKENS),
    A("num draft tokens", NUM_DRAFT_TOKENS),
    A("num spec tokens", NUM_DRAFT_TOKENS),
    A("draft_tokens", NUM_DRAFT_TOKENS),
    A("throughput", GEN_THROUGHPUT),
    A("decode throughput (toks/sec)", GEN_THROUGHPUT),
    A("gen throughput", GEN_THROUGHPUT),
    A("speed (token/s)", GEN_THROUGHPUT),
    A("throughput (token/s)", GEN_THROUGHPUT),
    A("tok/s", GEN_THROUGHPUT),
    A("output_throughput", OUTPUT_THROUGHPUT),
    A("output throughput", OUTPUT_THROUGHPUT),
    A("input_throughput", INPUT_THROUGHPUT),
    A("accept_length", ACCEPT_LEN),
    A("acc len", ACCEPT_LEN),
    A("accept len", ACCEPT_LEN),
    A("accept length", ACCEPT_LEN),
    A("mean acceptance length", ACCEPT_LEN),
    A("acc_length", ACCEPT_LEN),
    A("acceptance length", ACCEPT_LEN),
    A("avg accept length", ACCEPT_LEN),
    A("accept_len", ACCEPT_LEN),
    A("latency", LATENCY),
    A("total time (sec)", TOTAL_TIME_S),
    A("method", METHOD),
    A("max_concurrency", MAX_CONCURRENCY),
    A("per_user_throughput", PER_USER_THROUGHPUT),
    A("mean_ttft_ms", MEAN_TTFT_MS),
    A("median_ttft_ms", MEDIAN_TTFT_MS),
    A("p99_ttft_ms", P99_TTFT_MS),
    A("mean_tpot_ms", MEAN_TPOT_MS),
    A("median_tpot_ms", MEDIAN_TPOT_MS),
    A("p99_tpot_ms", P99_TPOT_MS),
};
#undef A
#define NALIASES ((int)(sizeof(ALIASES) / sizeof(*ALIASES)))

/* ALIASES.get(re.sub(r"\s+", " ", cell.lower())) of a (stripped) header cell: its column, or -1 */
static int column_of(bp_text cell) {
    char key[48]; /* longer than every label: a cell whose normalised text does not fit names no column */
    int32_t n = bp_norm(cell, key, (int32_t)sizeof(key));
    if (n <= 0) return -1;
    for (int j = 0; j < NALIASES; j++)
        if (ALIASES[j].len == (size_t)n && memcmp(key, ALIASES[j].label, (size_t)n) == 0) return ALIASES[j].column;
    return -1;
}

static int is_result(int col) { return col == ACCEPT_LEN || col == GEN_THROUGHPUT || col == OUTPUT_THROUGHPUT; }

/* tables._cells without the split: the text between the outer `|`s (line.strip(), one leading `|` off, then one
 * trailing `|` off) */
static bp_text inner(bp_text line) {
    bp_text s = bp_strip(line);
    if (s.len > 0 && s.s[0] == '|') s = bp_sub(s, 1, s.len);
    if (s.len > 0 && s.s[s.len - 1] == '|') s.len--;
    return s;
}

/* len(_cells(line)): the `|`s of its inner text, plus one */
static int64_t cell_count(bp_text in) {
    int64_t n = 1;
    const uint8_t *p = in.s, *end = in.s + in.len;
    while (p < end && (p = memchr(p, '|', (size_t)(end - p))) != NULL) {
        n++;
        p++;
    }
    return n;
}

/* "vllm" in text.lower() (ASCII: the reader answers plain text only): each `v` or `V` (memchr) and what follows */
static int vllm_at(const uint8_t *p, const uint8_t *end, uint8_t v) {
    while (end - p >= 4 && (p = memchr(p, v, (size_t)(end - p - 3))) != NULL) {
        if ((p[1] | 0x20) == 'l' && (p[2] | 0x20) == 'l' && (p[3] | 0x20) == 'm') return 1;
        p++;
    }
    return 0;
}

static int has_vllm(bp_text t) { return vllm_at(t.s, t.s + t.len, 'v') || vllm_at(t.s, t.s + t.len, 'V'); }

/* whether t (ASCII) is `lit` (lower case) ignoring case */
static int eq_nocase(bp_text t, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)t.len != n) return 0;
    for (size_t j = 0; j < n; j++) {
        uint8_t c = t.s[j];
        if (c >= 'A' && c <= 'Z') c = (uint8_t)(c + 32);
        if (c != (uint8_t)lit[j]) return 0;
    }
    return 1;
}

/* tables._cell_value of a (stripped) cell: float(text), else num(text). Returns 1 with *v set, 0 where it gives
 * None, -1 where the reading is not certain here (the block is DECLINEd). float() reads what num() reads the same,
 * except the words inf / infinity / nan in any case (num's regex knows only some spellings); `_` is declined. */
static int cell_value(bp_text t, double *v) {
    if (t.len <= 0) return 0; /* float("") fails, num("") is None */
    /* the common case at once: [-+]?digits[.digits] with at most 15 digits, which float() reads as the integer of
     * its digits over a power of ten up to 1e22, both exact doubles (one correctly rounded division) */
    {
        int32_t j = (t.len > 0 && (t.s[0] == '-' || t.s[0] == '+')) ? 1 : 0, digits = 0, frac = -1;
        uint64_t m = 0;
        for (; j < t.len; j++) {
            uint8_t c = t.s[j];
            if (bp_digit(c)) {
                m = m * 10 + (uint64_t)(c - '0');
                digits++;
                if (frac >= 0) frac++;
            } else if (c == '.' && frac < 0) {
                frac = 0;
            } else {
                break;
            }
        }
        if (j == t.len && digits > 0 && digits <= 15 && bp_digit(t.s[t.len - 1])) {
            static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                           1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
            double x = (double)m;
            if (frac > 0) x /= POW10[frac]; /* frac <= digits <= 15 */
            *v = t.s[0] == '-' ? -x : x;
            return 1;
        }
    }
    if (memchr(t.s, '_', (size_t)t.len) != NULL) return -1;
    int neg = t.len > 0 && t.s[0] == '-';
    bp_text w = (t.len > 0 && (t.s[0] == '-' || t.s[0] == '+')) ? bp_sub(t, 1, t.len) : t;
    if (eq_nocase(w, "inf") || eq_nocase(w, "infinity")) {
        *v = neg ? -INFINITY : INFINITY;
        return 1;
    }
    if (eq_nocase(w, "nan")) {
        *v = NAN;
        return 1;
    }
    return bp_num(t, v);
}

int bp_results_table(const bp_chunk *ch, const int64_t *at, int64_t nb, int64_t *used, int64_t *examined,
                     int64_t *status, bp_out *out) {
    for (int64_t b = 0; b < nb; b++) {
        examined[b] = 1;
        if (at[b] < 0 || at[b] >= ch->n) {
            status[b] = BP_DECLINE;
            continue;
        }
        /* the header: the nearer of w[-1], w[-2] that holds a `|` (then it is not blank either) */
        bp_text header;
        int found = 0;
        for (int64_t k = -1; k >= -2 && !found; k--) {
            int r = bp_line(ch, at[b], k, &header);
            found = r == BP_LINE && header.len > 0 && memchr(header.s, '|', (size_t)header.len) != NULL;
        }
        if (!found) continue;

        /* the header's plan (tables._plan): its cell count and, per column, the last cell naming it */
        bp_text hin = inner(header);
        int64_t width = cell_count(hin);
        int64_t cell_of[NCOLS];
        for (int c = 0; c < NCOLS; c++) cell_of[c] = -1;
        int64_t named = 0;
        int result = 0;
        {
            int64_t j = 0;
            int32_t a = 0;
            for (;;) {
                int32_t e = a;
                while (e < hin.len && hin.s[e] != '|') e++;
                int col = column_of(bp_strip(bp_sub(hin, a, e)));
                if (col >= 0) {
                    named++;
                    result |= is_result(col);
                    cell_of[col] = j; /* {name: cell} of the fields: the later cell wins */
                }
                if (e >= hin.len) break;
                a = e + 1;
                j++;
            }
        }
        if (named < 2 || !result) continue;
        /* the columns to read, by cell (at most NCOLS) */
        int64_t want_cell[NCOLS];
        int want_col[NCOLS];
        int nwant = 0;
        for (int c = 0; c < NCOLS; c++) {
            if (cell_of[c] < 0) continue;
            int p = nwant++;
            while (p > 0 && want_cell[p - 1] > cell_of[c]) {
                want_cell[p] = want_cell[p - 1];
                want_col[p] = want_col[p - 1];
                p--;
            }
            want_cell[p] = cell_of[c];
            want_col[p] = c;
        }
        int vllm = has_vllm(header);

        /* the rows */
        int64_t first = out->n; /* this block's records (dropped where it DECLINEs or needs more) */
        int more = 0, decline = 0;
        int64_t k = 1;
        bp_text s;
        for (;;) {
            int r = bp_line(ch, at[b], k, &s);
            if (r == BP_PAST) {
                more = 1;
                break;
            }
            if (r == BP_NONE) break;
            examined[b] = k + 1;
            if (memchr(s.s, '|', (size_t)s.len) == NULL) {
                /* _BORDER: ^\s*\+[-=+:]+\+?\s*$ (a line with a `|` is never one) */
                bp_text t = bp_strip(s);
                int border = t.len >= 2 && t.s[0] == '+';
                for (int32_t j = 1; border && j < t.len; j++)
                    border = t.s[j] == '-' || t.s[j] == '=' || t.s[j] == '+' || t.s[j] == ':';
                if (!border) break;
                k++;
                continue;
            }
            bp_text in = inner(s);
            if (cell_count(in) != width) break;
            if (!vllm && has_vllm(s)) vllm = 1;
            int64_t rec = bp_add(out, b, k);
            if (rec < 0) return -1;
            int64_t j = 0;
            int32_t a = 0;
            for (int w = 0; w < nwant;) { /* the wanted cells, in order */
                int32_t e = a;
                while (e < in.len && in.s[e] != '|') e++;
                for (; w < nwant && want_cell[w] == j; w++) {
                    bp_text cell = bp_strip(bp_sub(in, a, e));
                    if (want_col[w] == METHOD) {
                        bp_span(out, rec, 0, ch, cell);
                    } else {
                        double v;
                        int got = cell_value(cell, &v);
                        if (got < 0) decline = 1;
                        else if (got) *bp_f(out, rec, want_col[w]) = v;
                    }
                }
                if (e >= in.len) break;
                a = e + 1;
                j++;
            }
            if (decline) break;
            k++;
        }
        if (more || decline) {
            out->n = first;
            status[b] = more ? BP_MORE : BP_DECLINE;
            continue;
        }
        if (out->n == first) continue; /* no rows: ([], 0) */
        for (int64_t r = first; r < out->n; r++) bp_code(out, r, 0, vllm ? 1 : 0);
        used[b] = k;
    }
    return 0;
}
