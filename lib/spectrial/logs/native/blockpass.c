/* The shared part of spectrial's compiled block readers (declared and explained in blockpass.h). */
#define _GNU_SOURCE
#include "blockpass.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int bp_version(void) { return 1; }

int bp_line(const bp_chunk *ch, int64_t at, int64_t k, bp_text *t) {
    if (k >= BP_MAX_BLOCK_LINES || k < -BP_CONTEXT) return BP_NONE;
    int64_t i = at + k;
    if (i < 0) return BP_NONE;
    if (i >= ch->n) return ch->final ? BP_NONE : BP_PAST;
    int32_t a = ch->offs[i], b = ch->offs[i + 1];
    while (b > a && (ch->data[b - 1] == '\n' || ch->data[b - 1] == '\r')) b--; /* rstrip("\r\n") */
    t->s = ch->data + a;
    t->len = b - a;
    return BP_LINE;
}

static int grow(void **p, int64_t cap, size_t size) {
    void *q = realloc(*p, (size_t)cap * size);
    if (q == NULL) return 0;
    *p = q;
    return 1;
}

int64_t bp_add(bp_out *out, int64_t block, int64_t offset) {
    if (out->n == out->cap) {
        int64_t cap = out->cap ? 2 * out->cap : 256;
        if (!grow((void **)&out->block, cap, sizeof(int64_t)) || !grow((void **)&out->offset, cap, sizeof(int64_t)) ||
            !grow((void **)&out->f, cap * (out->nf ? out->nf : 1), sizeof(double)) ||
            !grow((void **)&out->s, cap * (out->ns ? out->ns : 1) * 2, sizeof(int32_t)) ||
            !grow((void **)&out->c, cap * (out->nc ? out->nc : 1), sizeof(int32_t)))
            return -1;
        out->cap = cap;
    }
    int64_t r = out->n++;
    out->block[r] = block;
    out->offset[r] = offset;
    for (int j = 0; j < out->nf; j++) out->f[r * out->nf + j] = NAN;
    for (int j = 0; j < 2 * out->ns; j++) out->s[r * out->ns * 2 + j] = -1;
    for (int j = 0; j < out->nc; j++) out->c[r * out->nc + j] = -1;
    return r;
}

void bp_free(bp_out *out) {
    free(out->block);
    free(out->offset);
    free(out->f);
    free(out->s);
    free(out->c);
    out->block = out->offset = NULL;
    out->f = NULL;
    out->s = out->c = NULL;
    out->n = out->cap = 0;
}

bp_text bp_lstrip(bp_text t) {
    while (t.len > 0 && bp_space(t.s[0])) {
        t.s++;
        t.len--;
    }
    return t;
}

bp_text bp_rstrip(bp_text t) {
    while (t.len > 0 && bp_space(t.s[t.len - 1])) t.len--;
    return t;
}

bp_text bp_strip(bp_text t) { return bp_rstrip(bp_lstrip(t)); }

bp_text bp_sub(bp_text t, int32_t a, int32_t b) {
    if (a > t.len) a = t.len;
    if (b > t.len) b = t.len;
    if (b < a) b = a;
    t.s += a;
    t.len = b - a;
    return t;
}

int bp_eq(bp_text t, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)t.len == n && memcmp(t.s, lit, n) == 0;
}

int bp_starts(bp_text t, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)t.len >= n && memcmp(t.s, lit, n) == 0;
}

int bp_ends(bp_text t, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)t.len >= n && memcmp(t.s + t.len - n, lit, n) == 0;
}

int32_t bp_find(bp_text t, const char *lit) {
    size_t n = strlen(lit);
    if (n == 0) return 0;
    const uint8_t *p = memmem(t.s, (size_t)t.len, lit, n);
    return p ? (int32_t)(p - t.s) : -1;
}

/* The length of a decimal number (text.NUM's first branch: [-+]?(digits[.digits*]|.digits)([eE][-+]?digits)?) at
 * the start of s, as the regex matches it (greedy; the exponent only where digits follow); 0: none. */
static int32_t number_at(const uint8_t *s, int32_t len) {
    int32_t i = 0;
    if (i < len && (s[i] == '+' || s[i] == '-')) i++;
    int32_t d0 = i;
    while (i < len && bp_digit(s[i])) i++;
    if (i > d0) {
        if (i < len && s[i] == '.') {
            i++;
            while (i < len && bp_digit(s[i])) i++;
        }
    } else {
        if (!(i + 1 < len && s[i] == '.' && bp_digit(s[i + 1]))) return 0;
        i++;
        while (i < len && bp_digit(s[i])) i++;
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        int32_t j = i + 1;
        if (j < len && (s[j] == '+' || s[j] == '-')) j++;
        int32_t e0 = j;
        while (j < len && bp_digit(s[j])) j++;
        if (j > e0) i = j;
    }
    return i;
}

static const char *const SPELLED[] = {"inf", "Inf", "INF", "nan", "NaN"}; /* text.NUM's second branch */

/* The length of the second branch at s ([-+]?(?:inf|Inf|INF|nan|NaN)), 0 where it does not match; *nan: a NaN. */
static int32_t spelled_at(const uint8_t *s, int32_t len, int *nan) {
    int32_t i = (len > 0 && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
    for (int j = 0; j < 5; j++) {
        if (len - i >= 3 && memcmp(s + i, SPELLED[j], 3) == 0) {
            *nan = j >= 3;
            return i + 3;
        }
    }
    return 0;
}

int32_t bp_num_len(const uint8_t *s, int32_t len) {
    int nan;
    int32_t m = number_at(s, len);
    return m > 0 ? m : spelled_at(s, len, &nan);
}

int32_t bp_skip_space(bp_text t, int32_t i) {
    while (i < t.len && bp_space(t.s[i])) i++;
    return i;
}

int bp_at(bp_text t, int32_t i, const char *lit) {
    size_t n = strlen(lit);
    return i >= 0 && i <= t.len && (size_t)(t.len - i) >= n && memcmp(t.s + i, lit, n) == 0;
}

static int to_double(const uint8_t *s, int32_t len, double *v) {
    char buf[80];
    if (len <= 0 || len >= (int32_t)sizeof(buf)) return -1;
    memcpy(buf, s, (size_t)len);
    buf[len] = 0;
    char *end = NULL;
    *v = strtod(buf, &end); /* correctly rounded, as Python's float() (the C locale's decimal point) */
    return end == buf + len ? 1 : -1;
}

int bp_num(bp_text t, double *v) {
    if (memchr(t.s, '_', (size_t)t.len) != NULL) return -1; /* float() reads 1_000 its own way */
    bp_text s = bp_strip(t);
    if (t.len > 0 && bp_digit(t.s[t.len - 1])) { /* float(text) where it parses: the whole text a number */
        int32_t m = number_at(s.s, s.len);
        if (m == s.len) return to_double(s.s, s.len, v);
        /* float(text) fails (ValueError), then the regex: the leading number */
    }
    bp_text l = bp_lstrip(t);
    int32_t m = number_at(l.s, l.len);
    if (m > 0) return to_double(l.s, m, v);
    int nan; /* the regex's second branch, which float() reads as infinity / NaN */
    if (spelled_at(l.s, l.len, &nan) == 0) return 0;
    *v = nan ? NAN : (l.s[0] == '-' ? -INFINITY : INFINITY);
    return 1;
}

int32_t bp_norm(bp_text t, char *buf, int32_t cap) {
    int32_t n = 0;
    int gap = 0;
    for (int32_t j = 0; j < t.len; j++) {
        uint8_t c = t.s[j];
        if (bp_space(c)) {
            gap = 1;
            continue;
        }
        if (gap && n > 0) {
            if (n >= cap) return -1;
            buf[n++] = ' ';
        }
        gap = 0;
        if (n >= cap) return -1;
        buf[n++] = (char)((c >= 'A' && c <= 'Z') ? c + 32 : c);
    }
    return n;
}
