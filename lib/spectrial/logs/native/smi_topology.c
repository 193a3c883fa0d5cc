/* nvidia_smi.topology compiled: `nvidia-smi topo -m`. The device columns are the words of the header line (the
 * marker) before `CPU Affinity`; then, while a line's first word is one of them and it has a word per device, each
 * of its links to another device (not `X`) is a record, with the CPU and NUMA affinity words after the links. The
 * Python function in nvidia_smi.py is the reference. */
#include <string.h>

#include "blockpass.h"

enum { S_SRC, S_DST, S_LINK, S_CPU, S_NUMA, NS };
const char bp_smi_topology_columns[] = "|src,dst,link,cpu_affinity,numa_affinity|";

#define MAX_DEVICES 256 /* more device columns than this: DECLINE */

/* Up to `cap` words of t (t.split()) into w; returns how many t has, counted up to cap + 1. */
static int words(bp_text t, bp_text *w, int cap) {
    int n = 0;
    int32_t i = 0;
    while (n <= cap) {
        while (i < t.len && bp_space(t.s[i])) i++;
        if (i >= t.len) break;
        int32_t a = i;
        while (i < t.len && !bp_space(t.s[i])) i++;
        if (n < cap) w[n] = bp_sub(t, a, i);
        n++;
    }
    return n;
}

static int same(bp_text a, bp_text b) { return a.len == b.len && memcmp(a.s, b.s, (size_t)a.len) == 0; }

int bp_smi_topology(const bp_chunk *ch, const int64_t *at, int64_t nb, int64_t *used, int64_t *examined,
                    int64_t *status, bp_out *out) {
    bp_text dev[MAX_DEVICES], tok[MAX_DEVICES + 3];
    for (int64_t b = 0; b < nb; b++) {
        int64_t n0 = out->n;
        bp_text head = {(const uint8_t *)"", 0}, s;
        examined[b] = 1;
        if (bp_line(ch, at[b], 0, &head) != BP_LINE) head.len = 0;
        int32_t cut = bp_find(head, "CPU Affinity");
        if (cut < 0) cut = head.len > 0 ? head.len - 1 : 0; /* head[:-1] */
        int nd = words(bp_sub(head, 0, cut), dev, MAX_DEVICES);
        if (nd > MAX_DEVICES) {
            status[b] = BP_DECLINE;
            continue;
        }
        if (nd == 0) continue;
        int more = 0;
        int64_t k = 1;
        for (;;) {
            int r = bp_line(ch, at[b], k, &s);
            if (r == BP_PAST) {
                more = 1;
                break;
            }
            if (r == BP_NONE) break;
            examined[b] = k + 1;
            int nt = words(s, tok, nd + 3);
            if (nt < 1 + nd) break; /* also: no words */
            int member = 0;
            for (int j = 0; j < nd && !member; j++) member = same(tok[0], dev[j]);
            if (!member) break;
            for (int j = 0; j < nd; j++) {
                bp_text link = tok[1 + j];
                if (same(dev[j], tok[0]) || (link.len == 1 && link.s[0] == 'X')) continue;
                int64_t rec = bp_add(out, b, k);
                if (rec < 0) return -1;
                bp_span(out, rec, S_SRC, ch, tok[0]);
                bp_span(out, rec, S_DST, ch, dev[j]);
                bp_span(out, rec, S_LINK, ch, link);
                if (nt > 1 + nd) bp_span(out, rec, S_CPU, ch, tok[1 + nd]);
                if (nt > 2 + nd) bp_span(out, rec, S_NUMA, ch, tok[2 + nd]);
            }
            k++;
        }
        if (more) {
            out->n = n0;
            status[b] = BP_MORE;
            continue;
        }
        used[b] = out->n > n0 ? k : 0;
    }
    return 0;
}
