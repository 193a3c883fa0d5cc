/* spectrial's compiled chunk pass: a chunk's lines found and classified in one pass over its bytes (see
 * chunks.Chunk, whose numpy/arrow reading it replaces where the library is on; the tests hold the two alike). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The length of the valid UTF-8 sequence at s[0..len) (1-4), or 0 where it is not valid (as arrow's validation
 * reads it: no overlong forms, no surrogates, nothing past U+10FFFF). */
static int utf8_seq(const uint8_t *s, int64_t len) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return (len >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
    if (c < 0xF0) {
        if (len < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && s[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
        return 3;
    }
    if (c < 0xF5) {
        if (len < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && s[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && s[1] >= 0x90) return 0; /* past U+10FFFF */
        return 4;
    }
    return 0;
}

/* The lines of data[0..len): offs[0..n] their starts and the end (a last line without a newline counts), and per
 * line: bad[i] (not plain: a byte of 0x80 or more, \r, ESC, 0x1c-0x1f, or a pasted colour code `?[` / `^[[`),
 * colour[i] (an ESC or a pasted colour code starts on it) and nonblank[i] (more than its line ending: longer than
 * one byte, and not a lone "\r\n"). *utf8 = whether the data is valid UTF-8. Returns n, or -1 where more than
 * cap lines would be needed (offs holds cap + 1 entries). */
int64_t cp_lines(const uint8_t *data, int64_t len, int32_t *offs, int64_t cap, uint8_t *bad, uint8_t *colour,
                 uint8_t *nonblank, int32_t *utf8) {
    int64_t n = 0, start = 0;
    int ok = 1;
    uint8_t b = 0, col = 0;
    uint8_t special[256]; /* the bytes the loop looks at; the others are skipped in a tight loop */
    for (int c = 0; c < 256; c++) special[c] = (uint8_t)(c >= 0x80 || (c < 0x20 && c != '\t') || c == '?' || c == '^');
    offs[0] = 0;
    for (int64_t j = 0; j < len;) {
        while (j < len && !special[data[j]]) j++;
        if (j >= len) break;
        uint8_t c = data[j];
        if (c >= 0x80) {
            b = 1;
            int k = ok ? utf8_seq(data + j, len - j) : 1;
            if (k == 0) {
                ok = 0;
                k = 1;
            }
            for (int q = 1; q < k; q++)
                if (data[j + q] == '\n') k = q; /* never: a continuation byte is not a newline */
            j += k;
            continue;
        }
        if (c < 0x20) {
            if (c == '\n') {
                if (n >= cap) return -1;
                int64_t l = j + 1 - start;
                bad[n] = b;
                colour[n] = col;
                nonblank[n] = (uint8_t)(l > 2 || (l == 2 && data[start] != '\r'));
                offs[++n] = (int32_t)(j + 1);
                start = j + 1;
                b = col = 0;
            } else if (c == '\r' || c >= 0x1c) {
                b = 1;
            } else if (c == 0x1b) {
                b = col = 1;
            }
        } else if (c == '?' && j + 1 < len && data[j + 1] == '[') {
            b = col = 1;
        } else if (c == '^' && j + 2 < len && data[j + 1] == '[' && data[j + 2] == '[') {
            b = col = 1;
        }
        j++;
    }
    if (start < len) { /* a last line without its newline */
        if (n >= cap) return -1;
        int64_t l = len - start;
        bad[n] = b;
        colour[n] = col;
        nonblank[n] = (uint8_t)(l > 2 || (l == 2 && data[start] != '\r'));
        offs[++n] = (int32_t)len;
    }
    *utf8 = ok;
    return n;
}

/* The first marker on each line from `first` to n - 1 (driver.Markers.find): the leftmost occurrence of any of the nm
 * markers (marker k is blob[moffs[k] .. moffs[k+1]), at least 2 bytes, no newline; given longest first, so at a
 * tie the longest wins). Writes the lines holding one (ascending) and its marker; returns how many, or -1 where
 * memory runs out. */
int64_t cp_markers(const uint8_t *data, const int32_t *offs, int64_t n, int64_t first, const uint8_t *blob,
                   const int32_t *moffs, int32_t nm, int64_t *out_line, int32_t *out_marker) {
    int32_t *head = (int32_t *)malloc(65536 * sizeof(int32_t));
    int32_t *next = (int32_t *)malloc((size_t)(nm > 0 ? nm : 1) * sizeof(int32_t));
    if (head == NULL || next == NULL) {
        free(head);
        free(next);
        return -1;
    }
    for (int32_t k = 0; k < 65536; k++) head[k] = -1;
    for (int32_t k = nm - 1; k >= 0; k--) { /* chains in the given order: longest first */
        const uint8_t *m = blob + moffs[k];
        int32_t key = m[0] | (m[1] << 8);
        next[k] = head[key];
        head[key] = k;
    }
    int64_t found = 0;
    for (int64_t i = first < 0 ? 0 : first; i < n; i++) {
        const uint8_t *p = data + offs[i], *end = data + offs[i + 1];
        int32_t hit = -1;
        for (; p + 1 < end && hit < 0; p++) {
            for (int32_t k = head[p[0] | (p[1] << 8)]; k >= 0; k = next[k]) {
                int32_t len = moffs[k + 1] - moffs[k];
                if (end - p >= len && memcmp(p, blob + moffs[k], (size_t)len) == 0) {
                    hit = k;
                    break;
                }
            }
        }
        if (hit >= 0) {
            out_line[found] = i;
            out_marker[found] = hit;
            found++;
        }
    }
    free(head);
    free(next);
    return found;
}

/* The lines of data[0..len) (newlines, and a last line without one): a segment's own line count, at memchr's
 * speed (Python's bytes.count(b"\n") reads a byte at a time: 12 ms for 31 MB, measured). */
int64_t cp_count_lines(const uint8_t *data, int64_t len) {
    int64_t n = 0;
    const uint8_t *p = data, *end = data + len;
    while (p < end) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL) return n + 1;
        n++;
        p = nl + 1;
    }
    return n;
}
