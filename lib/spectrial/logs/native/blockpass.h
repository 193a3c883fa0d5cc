/* spectrial's compiled block readers: the shared part (see native/blocks.py, which calls them through ctypes).
 *
 * A block reader `bp_<name>` mirrors a BlockFormat's Python function (the reference: tests hold each reader to it
 * block by block) over every marker line of a chunk at once and answers what Blocks holds: per marker `used`,
 * `examined` and `status` (0, BP_DECLINE: leave this block to the Python function, BP_MORE: the block runs past a
 * chunk that is not the last), per record its block, its offset from the marker line and its columns. A reader
 * reads a line as a Window gives it (no newline); it is asked only about plain ASCII blocks (the driver checks the
 * lines from the marker to `examined` afterwards and hands any other block to the Python function), and whatever
 * it is not sure to read as Python does (an odd number, an unusual layout) it DECLINEs.
 *
 * Every read is bounded by the chunk: bp_line() answers a line or says that there is none. */
#ifndef SPECTRIAL_BLOCKPASS_H
#define SPECTRIAL_BLOCKPASS_H

#include <stddef.h>
#include <stdint.h>

#define BP_DECLINE 1 /* formats.DECLINE */
#define BP_MORE 2    /* formats.MORE */
#define BP_MAX_BLOCK_LINES 20000 /* chunks.MAX_BLOCK_LINES: w[k] for k >= this is None */
#define BP_CONTEXT 64            /* chunks.CONTEXT: w[-k] for k > this is None */

/* A chunk's lines: line i is data[offs[i] .. offs[i+1]) with its newline (the input's last line may have none). */
typedef struct {
    const uint8_t *data;
    const int32_t *offs;
    int64_t n;
    int32_t final; /* the input ends with this chunk */
    int32_t head;  /* local line 0 is the input's first line (nothing above it) */
} bp_chunk;

/* Records found: columns of floats (NaN: absent), text spans into the chunk's data (-1: absent) and codes
 * (indexes into a list of names the caller holds; -1: absent). Allocated by bp_add, released by bp_free. */
typedef struct {
    int64_t n, cap;
    int32_t nf, ns, nc;
    int64_t *block, *offset;
    double *f;
    int32_t *s;
    int32_t *c;
} bp_out;

/* What a Window's w[k] is at the marker line `at`. */
typedef struct {
    const uint8_t *s;
    int32_t len;
} bp_text;

enum { BP_NONE = 0, BP_LINE = 1, BP_PAST = 2 };

/* Local line at + k as w[k]: BP_LINE (into *t, without its newline), BP_NONE (None: before the input, more than
 * BP_CONTEXT above, BP_MAX_BLOCK_LINES or more below, past the end of the last chunk) or BP_PAST (past the end of
 * a chunk that is not the last: the Python function would raise NeedMore). */
int bp_line(const bp_chunk *ch, int64_t at, int64_t k, bp_text *t);

/* A new record (every column absent); its index, or -1 when memory runs out. */
int64_t bp_add(bp_out *out, int64_t block, int64_t offset);
void bp_free(bp_out *out);

static inline double *bp_f(bp_out *out, int64_t rec, int col) { return out->f + rec * out->nf + col; }
static inline void bp_span(bp_out *out, int64_t rec, int col, const bp_chunk *ch, bp_text t) {
    out->s[(rec * out->ns + col) * 2] = (int32_t)(t.s - ch->data);
    out->s[(rec * out->ns + col) * 2 + 1] = (int32_t)(t.s - ch->data) + t.len;
}
static inline void bp_code(bp_out *out, int64_t rec, int col, int32_t code) { out->c[rec * out->nc + col] = code; }

/* Python's ASCII whitespace (str.strip() on plain text: tab, newline, \v, \f, \r, space). */
static inline int bp_space(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static inline int bp_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bp_text bp_strip(bp_text t);
bp_text bp_lstrip(bp_text t);
bp_text bp_rstrip(bp_text t);
bp_text bp_sub(bp_text t, int32_t a, int32_t b); /* t[a:b], clamped like Python's slice of non-negative indexes */
int bp_eq(bp_text t, const char *lit);           /* t == lit */
int bp_starts(bp_text t, const char *lit);
int bp_ends(bp_text t, const char *lit);
int32_t bp_find(bp_text t, const char *lit); /* t.find(lit) */

/* The length of text.NUM matched at s[0..len) (greedy, as Python's regex takes it:
 * [-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)? | [-+]?(?:inf|Inf|INF|nan|NaN)); 0 where it does not
 * match there. */
int32_t bp_num_len(const uint8_t *s, int32_t len);
int32_t bp_skip_space(bp_text t, int32_t i); /* the first index from i that is not whitespace */
int bp_at(bp_text t, int32_t i, const char *lit); /* t[i:].startswith(lit), false for i outside t */

/* text.num(): the number at the start of `t` ("12.5 ms" -> 12.5), as Python reads it. Returns 1 with *v set, 0
 * where num() gives None (*v NaN where it gives NaN), -1 where Python's reading is not certain here (an `_`, a very
 * long number): the reader then DECLINEs the block. */
int bp_num(bp_text t, double *v);

/* Lower-case ASCII `t` with each run of whitespace made one space, stripped (re.sub(r"\s+", " ", t.lower()).strip()),
 * into buf (cap bytes); its length, or -1 when it does not fit. */
int32_t bp_norm(bp_text t, char *buf, int32_t cap);

#endif
