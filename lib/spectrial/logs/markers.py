"""Finding each line's format: the leftmost (at a tie, the longest) marker string on the line decides.

One Aho-Corasick pass per group of markers over a chunk's bytes (ahocorasick_rs: a SIMD prefilter for
groups of up to ~40 strings), or, without that package, one RE2 union pass over the chunk's lines.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spectrial.logs.chunks import Chunk
from spectrial.logs.formats import Format
from spectrial.logs.text import ahocorasick_rs

# ahocorasick_rs (optional) finds the marker lines several times faster than the RE2 union
GROUP = 42  # markers per automaton: small sets get its fast SIMD prefilter (measured: 2 x 41 beat 1 x 82 by 2.4x)


class Markers:
    """The markers of `formats`, and a search for the first one on each line of a chunk."""

    def __init__(self, formats: Sequence[Format]) -> None:
        pairs = [(m, i) for i, f in enumerate(formats) for m in f.markers]
        pairs.sort(key=lambda mi: -len(mi[0]))  # longer markers win at the same position
        self.strings = [m for m, _ in pairs]
        self.union = "|".join(re.escape(m) for m in self.strings)
        self.values = pa.array(self.strings, pa.string())
        self.format_of = np.array([i for _, i in pairs] + [-1], dtype=np.int64)  # [-1]: no marker
        self.automata = _automata(self.strings) if pairs else None

    def find(self, ch: Chunk) -> tuple[np.ndarray, np.ndarray]:
        """Local lines holding a marker, and the format of each line (its first marker's)."""
        if not self.strings or not ch.n:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if self.automata is None:
            mask = pc.match_substring_regex(ch.lines, self.union).to_numpy(zero_copy_only=False)
            idx = np.flatnonzero(mask)
            which = pc.extract_regex(ch.lines.take(pa.array(idx)), f"(?P<m>{self.union})").flatten()[0]
            mid = pc.fill_null(pc.index_in(which, value_set=self.values), -1).to_numpy(zero_copy_only=False)
            return idx, self.format_of[mid]
        found = []
        for automaton, ids in self.automata:
            hits = automaton.find_matches_as_indexes(ch.data)
            arr = np.fromiter(itertools.chain.from_iterable(hits), np.int64, 3 * len(hits)).reshape(-1, 3)
            arr[:, 0] = ids[arr[:, 0]]
            found.append(arr)
        hits = np.concatenate(found) if len(found) > 1 else found[0]
        if len(found) > 1:  # by position; the longest first at a tie
            hits = hits[np.lexsort((hits[:, 1] - hits[:, 2], hits[:, 1]))]
        line = np.searchsorted(ch.offs, hits[:, 1], side="right") - 1
        first = np.ones(len(line), dtype=bool)
        first[1:] = line[1:] != line[:-1]  # a line's leftmost (longest) marker decides its format
        return line[first], self.format_of[hits[first, 0]]


def _automata(markers: list[str]) -> list[tuple[Any, np.ndarray]] | None:
    """Leftmost-longest Aho-Corasick automata over `markers`, each with the indexes of its markers in
    `markers`; None without the package (the RE2 union is used instead)."""
    if ahocorasick_rs is None:
        return None
    groups = -(-len(markers) // GROUP)
    size = -(-len(markers) // groups)
    out = []
    for a in range(0, len(markers), size):
        part = markers[a:a + size]
        automaton = ahocorasick_rs.BytesAhoCorasick([m.encode() for m in part],
                                                   matchkind=ahocorasick_rs.MatchKind.LeftmostLongest)
        out.append((automaton, np.arange(a, a + len(part), dtype=np.int64)))
    return out
