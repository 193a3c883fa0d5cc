/* What the nvidia-smi block readers (smi_table.c, smi_query_csv.c) share: nvidia_smi.py's _unquote and its parts. */
#ifndef SPECTRIAL_SMI_H
#define SPECTRIAL_SMI_H

#include "blockpass.h"

static inline int32_t skip_ws(bp_text t, int32_t i) { return bp_skip_space(t, i); }
static inline int ch_is(bp_text t, int32_t i, uint8_t c) { return i >= 0 && i < t.len && t.s[i] == c; }

/* _unquote: _QUOTE (^\s*(?:>\s?)+) taken off, then strip(). */
static inline bp_text unquote(bp_text s) {
    int32_t i = skip_ws(s, 0);
    if (ch_is(s, i, '>')) {
        while (ch_is(s, i, '>')) {
            i++;
            if (i < s.len && bp_space(s.s[i])) i++;
        }
        s = bp_sub(s, i, s.len);
    }
    return bp_strip(s);
}

#endif
