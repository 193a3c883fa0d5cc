/* nvidia_smi.query_csv compiled: the CSV rows of `nvidia-smi --query-gpu`, their fields named by the echoed command
 * (_QUERY), a header line (_header) or the portable query (PORTABLE_QUERY: 12 cells, the third `GPU-...`). The
 * Python function in nvidia_smi.py is the reference. */
#include <math.h>
#include <string.h>

#include "blockpass.h"
#include "smi.h"

enum {
    F_INDEX, F_USED, F_TOTAL, F_FREE, F_UTIL, F_TEMP, F_POWER, F_CAP, F_FAN, F_SM, F_SM_MAX, F_GEN, F_WIDTH, NF
};
enum { S_NAME, S_UUID, S_BUS, S_DRIVER, S_PSTATE, S_PERSISTENCE, S_TIMESTAMP, NS };
const char bp_smi_query_csv_columns[] =
    "index,memory_used_mib,memory_total_mib,memory_free_mib,util_pct,temp_c,power_w,power_cap_w,fan_pct,"
    "sm_clock_mhz,sm_clock_max_mhz,pcie_gen,pcie_width"
    "|name,uuid,bus_id,driver_version,pstate,persistence,timestamp|";

#define STR 100       /* a column id >= STR: string column id - STR */
#define MAX_FIELDS 64 /* more fields than this: DECLINE */

/* nvidia_smi.QUERY_FIELDS: field -> column */
static const struct {
    const char *field;
    int col;
} QUERY_FIELDS[] = {
    {"index", F_INDEX},
    {"name", STR + S_NAME},
    {"gpu_name", STR + S_NAME},
    {"uuid", STR + S_UUID},
    {"gpu_uuid", STR + S_UUID},
    {"pci.bus_id", STR + S_BUS},
    {"gpu_bus_id", STR + S_BUS},
    {"driver_version", STR + S_DRIVER},
    {"memory.used", F_USED},
    {"memory.total", F_TOTAL},
    {"memory.free", F_FREE},
    {"utilization.gpu", F_UTIL},
    {"temperature.gpu", F_TEMP},
    {"power.draw", F_POWER},
    {"power.draw.instant", F_POWER},
    {"power.draw.average", F_POWER},
    {"power.limit", F_CAP},
    {"enforced.power.limit", F_CAP},
    {"pstate", STR + S_PSTATE},
    {"fan.speed", F_FAN},
    {"persistence_mode", STR + S_PERSISTENCE},
    {"clocks.sm", F_SM},
    {"clocks.current.sm", F_SM},
    {"clocks.max.sm", F_SM_MAX},
    {"clocks.max.graphics", F_SM_MAX},
    {"pcie.link.gen.current", F_GEN},
    {"pcie.link.gen.gpucurrent", F_GEN},
    {"pcie.link.width.current", F_WIDTH},
    {"timestamp", STR + S_TIMESTAMP},
};
#define NQ ((int)(sizeof(QUERY_FIELDS) / sizeof(*QUERY_FIELDS)))

/* nvidia_smi.PORTABLE_QUERY, as columns */
static const int PORTABLE[] = {F_INDEX, STR + S_NAME, STR + S_UUID, F_USED, F_TOTAL, F_SM, F_SM_MAX, F_GEN, F_WIDTH,
                               STR + S_DRIVER, F_TEMP, F_POWER};
#define NPORTABLE ((int)(sizeof(PORTABLE) / sizeof(*PORTABLE)))

#define NOT_KNOWN (-1) /* a field QUERY_FIELDS does not name */



/* The column of field name `t`, lower-cased (QUERY_FIELDS.get(t.lower())), or NOT_KNOWN. */
static int column_of(bp_text t) {
    char low[32];
    if (t.len >= (int32_t)sizeof(low)) return NOT_KNOWN;
    for (int32_t j = 0; j < t.len; j++) low[j] = (char)((t.s[j] >= 'A' && t.s[j] <= 'Z') ? t.s[j] + 32 : t.s[j]);
    for (int q = 0; q < NQ; q++)
        if ((int32_t)strlen(QUERY_FIELDS[q].field) == t.len && memcmp(QUERY_FIELDS[q].field, low, (size_t)t.len) == 0)
            return QUERY_FIELDS[q].col;
    return NOT_KNOWN;
}

/* The next comma-separated cell of `t` from *at (t.split(",")): returns 0 when none is left. */
static int next_cell(bp_text t, int32_t *at, bp_text *cell) {
    if (*at > t.len) return 0;
    int32_t a = *at, e = a;
    while (e < t.len && t.s[e] != ',') e++;
    *cell = bp_sub(t, a, e);
    *at = e + 1;
    return 1;
}

/* _field: a token stripped, a trailing `[unit]` (\s*\[.*?\]\s*$) taken off, lower-cased (by column_of). */
static bp_text field_name(bp_text token) {
    bp_text t = bp_strip(token);
    if (t.len < 2 || t.s[t.len - 1] != ']') return t;
    int32_t q = 0;
    while (q < t.len - 1 && t.s[q] != '[') q++;
    if (q >= t.len - 1) return t;
    while (q > 0 && bp_space(t.s[q - 1])) q--; /* the match starts with the whitespace before the first `[` */
    return bp_sub(t, 0, q);
}

/* _header(line): the fields' count and columns (the first MAX_FIELDS), and whether it is a header. */
typedef struct {
    int n, known;
    int col[MAX_FIELDS];
} fields;

static int header(bp_text line, fields *h) {
    int32_t at = 0;
    bp_text cell;
    h->n = h->known = 0;
    while (next_cell(line, &at, &cell)) {
        bp_text f = field_name(cell);
        int col = column_of(f);
        /* QUERY_FIELDS holds "timestamp" too; a known field counts */
        if (col != NOT_KNOWN) h->known++;
        if (h->n < MAX_FIELDS) h->col[h->n] = col;
        h->n++;
    }
    int need = h->n / 2 > 2 ? h->n / 2 : 2;
    return h->known >= need;
}

/* _QUERY.search: --query-gpu[= ]\s*([A-Za-z0-9_.,]+); the group, or len -1. */
static bp_text query_group(bp_text t) {
    bp_text none = {NULL, -1};
    for (int32_t i = 0; i + 11 <= t.len; i++) {
        if (memcmp(t.s + i, "--query-gpu", 11) != 0) continue;
        int32_t j = i + 11;
        if (!(ch_is(t, j, '=') || ch_is(t, j, ' '))) continue;
        j = skip_ws(t, j + 1);
        int32_t e = j;
        while (e < t.len) {
            uint8_t c = t.s[e];
            if (!(bp_digit(c) || ((c | 32) >= 'a' && (c | 32) <= 'z') || c == '_' || c == '.' || c == ',')) break;
            e++;
        }
        if (e > j) return bp_sub(t, j, e);
    }
    return none;
}

static void clear_span(bp_out *out, int64_t rec, int col) {
    out->s[(rec * out->ns + col) * 2] = -1;
    out->s[(rec * out->ns + col) * 2 + 1] = -1;
}

/* _value(col, cell) into the record's column (None: absent); -1: DECLINE. */
static int put(bp_out *out, int64_t rec, int col, bp_text cell, const bp_chunk *ch) {
    bp_text v = bp_strip(cell);
    int none = v.len == 0 || v.s[0] == '[';
    if (!none && (v.len == 3 || v.len == 2)) {
        char up[3];
        for (int32_t j = 0; j < v.len; j++) up[j] = (char)((v.s[j] >= 'a' && v.s[j] <= 'z') ? v.s[j] - 32 : v.s[j]);
        none = (v.len == 3 && memcmp(up, "N/A", 3) == 0) || (v.len == 2 && memcmp(up, "NA", 2) == 0);
    }
    if (col >= STR) {
        if (none)
            clear_span(out, rec, col - STR);
        else
            bp_span(out, rec, col - STR, ch, v);
        return 0;
    }
    double x = 0;
    int got = none ? 0 : bp_num(v, &x);
    if (got < 0) return -1;
    *bp_f(out, rec, col) = got ? x : NAN;
    return 0;
}

int bp_smi_query_csv(const bp_chunk *ch, const int64_t *at, int64_t nb, int64_t *used, int64_t *examined,
                     int64_t *status, bp_out *out) {
    for (int64_t b = 0; b < nb; b++) {
        int64_t n0 = out->n;
        bp_text s, first = {(const uint8_t *)"", 0};
        examined[b] = 1;
        if (bp_line(ch, at[b], 0, &s) == BP_LINE) first = unquote(s);
        fields f;
        int nf = 0, k = 0, decline = 0, more = 0;
        const int *col = f.col;
        bp_text group = query_group(first);
        if (group.len >= 0) {
            int32_t pos = 0;
            bp_text name;
            while (next_cell(group, &pos, &name)) { /* [f.lower() for f in group.split(",") if f] */
                if (name.len == 0) continue;
                if (nf < MAX_FIELDS) f.col[nf] = column_of(name);
                nf++;
            }
            k = 1;
            bp_text second = {(const uint8_t *)"", 0};
            int r = bp_line(ch, at[b], 1, &s);
            if (r == BP_PAST) {
                status[b] = BP_MORE;
                continue;
            }
            if (r == BP_LINE) {
                second = unquote(s);
                examined[b] = 2;
            }
            fields h;
            if (header(second, &h) && h.n == nf) k = 2;
        } else if (header(first, &f)) {
            nf = f.n;
            k = 1;
        } else {
            int32_t pos = 0;
            int n = 0;
            bp_text cell, third = {NULL, 0};
            while (next_cell(first, &pos, &cell)) {
                if (n == 2) third = bp_strip(cell);
                n++;
            }
            if (n == NPORTABLE && bp_starts(third, "GPU-")) {
                nf = NPORTABLE;
                col = PORTABLE;
            }
        }
        if (nf > MAX_FIELDS) {
            status[b] = BP_DECLINE;
            continue;
        }
        if (nf == 0) continue;
        int mapped = 0;
        for (int j = 0; j < nf; j++) mapped |= col[j] != NOT_KNOWN;
        int rows = 0;
        for (;;) {
            int r = bp_line(ch, at[b], k, &s);
            if (r == BP_PAST) {
                more = 1;
                break;
            }
            if (r == BP_NONE) break;
            if (examined[b] < k + 1) examined[b] = k + 1;
            bp_text t = unquote(s);
            int32_t pos = 0;
            int n = 0, any = 0;
            bp_text cell;
            while (next_cell(t, &pos, &cell)) {
                n++;
                any |= bp_strip(cell).len > 0;
            }
            if (n != nf || !any) break;
            rows++;
            if (mapped) {
                int64_t rec = bp_add(out, b, k);
                if (rec < 0) return -1;
                pos = 0;
                for (int j = 0; next_cell(t, &pos, &cell); j++) {
                    if (col[j] != NOT_KNOWN && put(out, rec, col[j], cell, ch) < 0) decline = 1;
                }
                if (decline) break;
            }
            k++;
        }
        if (more || decline) {
            out->n = n0;
            status[b] = more ? BP_MORE : BP_DECLINE;
            continue;
        }
        used[b] = rows ? k : 0;
    }
    return 0;
}
