"""The answer first: does speculation pay here, by how much, how sure — one line per arm, read from the record.

`headline(manifest) -> Headline` reads the figures `spectrial.analysis.figures` put on the arms (it computes nothing of
its own but what would decide an undecided arm), so the CLI, notebook 02, report.html and `spectrial sweep` say
the same thing:

    Speculation pays here: eagle3 k=3 is 2.59x faster [2.56, 2.67] than the baseline
    eagle3 k=3: 2.59x [2.56, 2.67] faster — accept length 3.46 vs break-even 1.33 [1.30, 1.35]
    draft k=2: 1.04x [0.95, 1.15] not distinguishable — accept length 2.10 vs break-even 2.02 [1.83, 2.21];
        could see differences of 9 % or more; needs ~14 more starts per arm to detect 5 % (or `decide: true`)

`Headline.text()` (plain lines), `.markdown()`, `.table()` (compact, rounded, with units), `.rich()` (a rich
renderable that fits the terminal).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import pandas as pd
from pydantic import BaseModel, Field

from spectrial.analysis.catalogue import figure
from spectrial.analysis.figures import NO_SPREAD, NOT_DISTINGUISHABLE, TOO_FEW, pick_baseline, positive
from spectrial.analysis.validity import is_invalid, problems
from spectrial.readers.points import load_of, load_order
from spectrial.record.store import as_manifest
from spectrial.schema import ArmRecord, DecideRecord, Manifest, PointRecord
from spectrial.sweep.params import Load

# column labels as the figure catalogue declares them (spectrial.analysis.catalogue)
TOK_S, SPEEDUP, ACCEPT, BREAK_EVEN, TTFT, ITL = (figure(n).label for n in (
    "tok_s", "speedup", "accept_len", "break_even_accept_len", "ttft_ms", "itl_ms"))


DETECT = 0.05  # the difference an undecided arm is told how to detect


class ArmLine(BaseModel):
    """One arm as the headline states it (figures from the record; `needs` is what would decide it)."""

    arm: str
    method: str = "none"
    k: int | None = None
    synthetic: bool = False
    status: str = "ok"
    reason: str | None = None
    baseline: bool = False
    tok_s: float | None = None
    tok_s_ci: tuple[float, float] | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    verdict: str | None = None
    pays: str | None = None
    accept_len: float | None = None
    break_even: float | None = None
    break_even_ci: tuple[float, float] | None = None
    starts: int = 0
    requests: int = 0
    min_detectable: float | None = None
    needs: str | None = None
    against: str | None = None  # the arm's baseline where it is not the headline's
    failed_requests: int = 0
    ttft_p50_ms: float | None = None
    itl_p50_ms: float | None = None
    e2el_p50_ms: float | None = None
    output_tok_s: float | None = None
    goodput: float | None = None
    invalid: list[str] = Field(default_factory=list)  # failed checks that void the verdict, as sentences
    warnings: list[str] = Field(default_factory=list)  # failed checks that do not (spectrial.analysis.validity)
    accept_len_request_mean: float | None = None
    uncontrolled: str | None = None  # an observe-only record's arm: why nothing is compared (no baseline beside it)

    @property
    def checks(self) -> str | None:
        """The checks in a word or two for a table column."""
        if self.invalid:
            return "invalid"
        n = len(self.warnings)
        return f"{n} warning{'s' if n > 1 else ''}" if n else ("ok" if self.status == "ok" else None)

    @property
    def label(self) -> str:
        return self.arm + (f" (k={self.k}{', synthetic' if self.synthetic else ''})" if self.k and not self.baseline
                           else "")

    def sentence(self) -> str:
        """The arm in one sentence (several clauses for an undecided one)."""
        if self.status != "ok":
            return f"{self.label}: {self.status} — {self.reason or 'no reason recorded'}"
        if self.uncontrolled:
            ci = f" [{self.tok_s_ci[0]:.1f}, {self.tok_s_ci[1]:.1f}]" if self.tok_s_ci else ""
            acc = f", accept length {self.accept_len:.2f}" if self.accept_len is not None else ""
            return (f"{self.label} ({self.method}): {_n(self.tok_s, 1)} tok/s{ci} per request{acc}, "
                    f"{self.requests} requests; {self.uncontrolled}")
        if self.baseline:
            ci = f" [{self.tok_s_ci[0]:.1f}, {self.tok_s_ci[1]:.1f}]" if self.tok_s_ci else ""
            n = f"; {self.starts} start(s), {self.requests} requests" if self.requests else ""
            return f"{self.label}: {_n(self.tok_s, 1)} tok/s{ci} decode rate per request (the baseline{n})"
        if self.method == "none":
            return f"{self.label}: another baseline, {_n(self.tok_s, 1)} tok/s per request"
        if self.tok_s is None:
            return f"{self.label}: no decode rate recorded"
        if self.speedup is None:
            return f"{self.label}: {_n(self.tok_s, 1)} tok/s per request; {self.verdict or 'no baseline to compare with'}"
        ci = f" [{self.speedup_ci[0]:.2f}, {self.speedup_ci[1]:.2f}]" if self.speedup_ci else ""
        verdict = self.verdict or "not judged"
        if verdict == NO_SPREAD:
            verdict = "single measurements, no interval"
        s = f"{self.label}: {self.speedup:.2f}x{ci} {verdict}" + (f" (against {self.against})" if self.against else "")
        if self.accept_len is not None and self.break_even is not None:
            be = f" [{self.break_even_ci[0]:.2f}, {self.break_even_ci[1]:.2f}]" if self.break_even_ci else ""
            s += f" — accept length {self.accept_len:.2f} vs break-even {self.break_even:.2f}{be}"
        if self.accept_len_request_mean is not None and self.accept_len is not None:
            s += f" (per-request mean {self.accept_len_request_mean:.2f})"
        if self.failed_requests:
            s += f" ({self.failed_requests} measured request(s) failed: the run is marked failed)"
        if self.invalid:
            return s + "; not valid: " + "; ".join(self.invalid)
        if self.pays == "undecided":
            if self.min_detectable:
                s += f"; this run could see differences of {(self.min_detectable - 1) * 100:.0f} % or more"
            if self.needs:
                s += f"; {self.needs}"
        return s


class Headline(BaseModel):
    """What was found (the title), one line per arm, and how a decide run ended."""

    title: str
    baseline: str | None = None
    baseline_tok_s: float | None = None
    arms: list[ArmLine] = Field(default_factory=list)
    decided: str | None = None
    partial: str | None = None  # a sweep its budget stopped: what it did not measure here
    environment: str | None = None  # what the environment checks verified (spectrial.servers.envcheck.verified)
    drift: str | None = None  # the baseline moved beyond earlier runs of this host (spectrial.protocol.drift; None: it did not)
    bound: str | None = None  # the baseline against the memory-bandwidth bound (its bandwidth_bound check)
    config: str | None = None  # what the engines resolved of the arms' settings (their config checks)
    energy: str | None = None  # joules per output token per arm (their energy figures)
    context: list[str] = Field(default_factory=list)  # per arm across context buckets (spectrial.readers.context)

    def lines(self) -> list[str]:
        out = [self.title]
        if self.drift:
            out.append(self.drift)
        if self.partial:
            out.append(self.partial)
        if self.decided:
            out.append(self.decided)
        if self.environment:
            out.append(self.environment)
        out += [x for x in (self.config, self.bound, self.energy) if x]
        out += [a.sentence() for a in self.arms]
        out += [f"Context: {x}" for x in self.context]
        return out

    def text(self) -> str:
        return "\n".join(self.lines())

    def markdown(self, heading: str | None = None) -> str:
        """The title (bold, or as a heading of `heading`, e.g. "##"), the decide line, one bullet per arm."""
        body = [f"{heading} {self.title}" if heading else f"**{self.title}**", ""]
        if self.drift:
            body += [f"**{_md(self.drift)}**", ""]
        if self.partial:
            body += [_md(self.partial), ""]
        if self.decided:
            body += [self.decided, ""]
        if self.environment:
            body += [_md(self.environment), ""]
        body += [y for x in (self.config, self.bound, self.energy) if x for y in (_md(x), "")]
        body += [f"- {_md(a.sentence())}" for a in self.arms]
        if self.context:
            body += ["", "Across context lengths:", ""] + [f"- {_md(x)}" for x in self.context]
        return "\n".join(body)

    def table(self, terminal: bool = False) -> pd.DataFrame:
        """Compact, rounded, units in the column names: what a report shows (`terminal`: fewer, shorter columns,
        the verdict in one word; the sentences below the table say the rest)."""
        rows = []
        for a in self.arms:
            verdict = "baseline" if a.baseline else (_short(a.verdict) if terminal else a.verdict) \
                if a.status == "ok" else a.status
            row = {"arm": a.label, TOK_S if terminal else f"decode {TOK_S}": _r(a.tok_s, 1),
                   f"{SPEEDUP} [CI]": None if a.speedup is None or a.baseline else f"{a.speedup:.2f}x" + (
                       f" [{a.speedup_ci[0]:.2f}, {a.speedup_ci[1]:.2f}]" if a.speedup_ci else ""),
                   "verdict": verdict, ACCEPT if terminal else f"{ACCEPT} len": _r(a.accept_len, 2),
                   BREAK_EVEN: None if a.break_even is None else f"{a.break_even:.2f}" + (
                       f" [{a.break_even_ci[0]:.2f}, {a.break_even_ci[1]:.2f}]" if a.break_even_ci else ""),
                   TTFT: _r(a.ttft_p50_ms, 1), ITL: _r(a.itl_p50_ms, 2), "checks": a.checks}
            if not terminal:
                row = {**{k.replace(TTFT, "TTFT p50 ms").replace(ITL, "ITL p50 ms"): v
                          for k, v in row.items()}, "E2E p50 ms": _r(a.e2el_p50_ms, 0),
                       "out tok/s": _r(a.output_tok_s, 1), "starts": a.starts}
            rows.append(row)
        df = pd.DataFrame(rows)
        return df.dropna(axis=1, how="all") if len(df) else df

    def rich(self) -> Any:
        """A rich renderable that fits the terminal without breaking a name, number or interval: the title, the
        decide line, the environment line, the compact table (`_FitTable`), then one sentence per arm."""
        from rich.console import Group

        parts: list[Any] = [_Para(self.title, style="bold")]
        if self.drift:
            parts.append(_Para(self.drift, style="bold yellow"))
        if self.partial:
            parts.append(_Para(self.partial, style="yellow"))
        if self.decided:
            parts.append(_Para(self.decided))
        if self.environment:
            parts.append(_Para(self.environment, style="green" if self.environment.startswith(
                "environment verified") else "red"))
        if self.config:
            parts.append(_Para(self.config, style="red" if "otherwise than asked" in self.config else "green"))
        if self.bound:
            parts.append(_Para(self.bound, style="red" if "impossible" in self.bound else None))
        if self.energy:
            parts.append(_Para(self.energy))
        parts.append(_FitTable(self.table(terminal=True)))
        parts += [_Para("• " + a.sentence(), indent="  ") for a in self.arms if not a.baseline]
        parts += [_Para("Context: " + x) for x in self.context]
        return Group(*parts)

    def print(self, console: Any = None) -> None:
        from rich.console import Console

        (console or Console()).print(self.rich())


# --- the terminal: wrap and fit without breaking a name, number or interval -------------------------------
_ATOM = re.compile(r"\S*\[[^\[\]\n]*\]\S*|\S+")  # a word, or an interval "[0.63, 0.84]" with what clings to it


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    """`text` in lines of at most `width` columns, broken only between words; an interval ("[0.63, 0.84]") is one
    word. Continuation lines start with `indent`. A word longer than a line gets a line of its own."""
    return _fill(_ATOM.findall(text), width, " ", indent)


def _fill(atoms: Sequence[str], width: int, sep: str, indent: str = "", first: str = "") -> list[str]:
    """`atoms` joined by `sep` in lines of at most `width` columns (the first line starts with `first`, the others
    with `indent`), broken only between atoms; an atom too long for any line is wrapped between its words."""
    lines: list[str] = []
    cur = first
    for atom in atoms:
        if cur.strip() and len(cur) + len(sep) + len(atom) > width:
            lines.append(cur.rstrip())
            cur = indent
        if not cur.strip() and len(cur) + len(atom) > width and " " in atom:
            parts = wrap(atom, width - len(cur), "")
            lines += [cur + x for x in parts[:-1]]
            cur = indent + parts[-1]
            continue
        cur = f"{cur}{sep}{atom}" if cur.strip() else cur + atom
    if cur.strip():
        lines.append(cur)
    return lines or [""]


class _Para:
    """A paragraph for rich that wraps at render time (`wrap`), never inside a word or an interval."""

    def __init__(self, text: str, style: str = "", indent: str = "") -> None:
        self.text, self.style, self.indent = text, style, indent

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.text import Text

        for line in wrap(self.text, options.max_width, self.indent):
            yield Text(line, style=self.style, no_wrap=True, overflow="fold")


# terminal columns left out, in this order, when the table would not fit: the serving figures, then the accept
# length and break-even (each speculative arm's sentence below the table gives both), then the checks
_DROP = (ITL, TTFT, BREAK_EVEN, ACCEPT, "checks")


def _cell_lines(col: str, text: str, narrow: bool) -> list[str]:
    """A cell on one line, or (narrow) split where it may be: a label before its "(k=...)", a figure before its
    interval, a verdict between its words."""
    if not narrow:
        return [text]
    if col == "arm":
        name, sep, rest = text.partition(" (")
        return [name, "(" + rest] if sep else [text]
    if " [" in text:
        value, _, ci = text.partition(" [")
        return [value, "[" + ci]
    if col == "verdict":
        return text.split() or [text]
    return [text]


class _FitTable:
    """The compact table fitted to the terminal's width at render time: every cell on one line if that fits, else
    cells split where they may be (`_cell_lines`), else columns left out (`_DROP`), else one block per arm. No
    layout folds a word: a column is as wide as its widest line."""

    GAP = 2  # columns between two columns (rich's padding on each side)

    DECIMALS: ClassVar[dict[str, int]] = {TOK_S: 1, ACCEPT: 2, TTFT: 1, ITL: 2}  # as the sentences

    def __init__(self, df: pd.DataFrame) -> None:
        self.cols = [str(c) for c in df.columns]
        self.rows = [[self._cell(c, v) for c, v in zip(self.cols, row, strict=True)]
                     for row in df.itertuples(index=False)]

    def _cell(self, col: str, v: Any) -> str:
        if v is None or (isinstance(v, float) and pd.isna(v)):
            return "—"
        if isinstance(v, float) and col in self.DECIMALS:
            return f"{v:.{self.DECIMALS[col]}f}"
        return str(v)

    def layouts(self) -> Iterator[tuple[bool, list[str]]]:
        """Candidate layouts, fullest first: (narrow, columns)."""
        yield False, self.cols
        for k in range(len(_DROP) + 1):
            yield True, [c for c in self.cols if c not in _DROP[:k]]

    def width(self, narrow: bool, cols: list[str]) -> int:
        idx = [self.cols.index(c) for c in cols]
        widths = [max([len(w) for w in (c.split() if narrow else [c])]
                      + [len(x) for r in self.rows for x in _cell_lines(c, r[i], narrow)]) for c, i in zip(cols, idx,
                                                                                                    strict=True)]
        return sum(widths) + self.GAP * (len(cols) - 1)

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.table import Table
        from rich.text import Text

        if not self.rows:
            return
        fit = next(((n, c) for n, c in self.layouts() if self.width(n, c) <= options.max_width), None)
        if fit is None:  # one block per arm: its label, then "column value" pairs wrapped between them
            for r in self.rows:
                yield from (Text(x, no_wrap=True) for x in wrap(r[0], options.max_width, "  "))
                pairs = [f"{c} {v}" for c, v in zip(self.cols[1:], r[1:], strict=True) if v != "—"]
                yield from (Text(x, no_wrap=True) for x in _fill(pairs, options.max_width, "; ", "  ", "  "))
            return
        narrow, cols = fit
        t = Table(show_header=True, header_style="bold", expand=False, pad_edge=False, box=None,
                  padding=(0, self.GAP // 2))
        for c in cols:
            t.add_column("\n".join(c.split()) if narrow else c, no_wrap=True,
                         justify="left" if c in ("arm", "verdict") else "right")
        for r in self.rows:
            t.add_row(*["\n".join(_cell_lines(c, r[self.cols.index(c)], narrow)) for c in cols])
        yield t


def fit_table(df: pd.DataFrame) -> Any:
    """A rich renderable of any compact table, fitted to the terminal as the headline's is (`_FitTable`: cells
    split only where they may be, columns left out in the order of `_DROP`, else one block per row)."""
    return _FitTable(df)


def paragraph(text: str, style: str = "", indent: str = "") -> Any:
    """A rich renderable of `text` wrapped to the terminal between words, an interval kept whole (`wrap`)."""
    return _Para(text, style=style, indent=indent)


def _short(verdict: str | None) -> str | None:
    """A verdict in one word for a terminal column."""
    if verdict is None:
        return None
    if verdict == NOT_DISTINGUISHABLE:
        return "undecided"
    if verdict.startswith("equivalent"):
        return verdict.replace("equivalent within ", "equal ")
    if verdict in (NO_SPREAD, TOO_FEW):
        return "no interval"
    if is_invalid(verdict):
        return "invalid"
    return verdict.split(":")[0].split(" (")[0]


def _n(x: float | None, nd: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _r(x: float | None, nd: int) -> float | None:
    return None if x is None else round(float(x), nd)


def _md(text: str) -> str:
    return text.replace("*", r"\*").replace("_", r"\_")


def _pair(lo: Any, hi: Any) -> tuple[float, float] | None:
    lo, hi = positive(lo), positive(hi)
    return (lo, hi) if lo is not None and hi is not None else None


def _needs(a: ArmRecord, starts: int, decided_run: bool | DecideRecord | None = False) -> str | None:
    """What would decide an undecided arm: how many more starts (or requests, with one start per arm) a fixed
    design needs to detect a DETECT difference, from the width of its interval; in a decide run (its
    `DecideRecord`), how many more rounds, since a decide run only ever adds rounds (one start of every arm)."""
    from spectrial.analysis.sequential import rounds_to_detect

    if isinstance(decided_run, DecideRecord) and any(x.arm == a.name for x in decided_run.arms):
        return _needs_rounds(a, decided_run)
    ci = _pair(a.speedup_ci_low, a.speedup_ci_high)
    if ci is None:
        return "needs at least 2 requests per arm for an interval"
    per_start = starts >= 2
    n = starts if per_start else (a.requests_ok or 0)
    if n < 2:
        return None
    total = rounds_to_detect(ci[0], ci[1], n, effect=DETECT, level=a.ci_level or 0.95)
    if total is None:
        return None
    more = max(total - n, 1)
    unit = "starts per arm" if per_start else "requests per arm (and 2+ starts to see start-to-start drift)"
    how = "raise `decide.max_rounds` or `decide.max_minutes`" if decided_run else "or `decide: true`"
    return f"needs ~{more} more {unit} to detect {DETECT * 100:.0f} % ({how})"


def _needs_rounds(a: ArmRecord, d: DecideRecord) -> str | None:
    """An undecided arm of a decide run: its interval still unbounded (fewer rounds than its design's first
    look), or how many more rounds (and starts) its sequence's interval says a fixed design would need to detect
    DETECT, the rounds as the unit (`rounds_to_detect`)."""
    from spectrial.analysis.sequential import rounds_to_detect

    s = next((x for x in d.arms if x.arm == a.name), None)
    rounds = s.rounds if s is not None else d.rounds
    settled = ("faster", "slower", "equivalent", "inconsistent")  # a settled arm leaves the later rounds
    per_round = 1 + max(1, len([x for x in d.arms if not x.status.startswith(settled)]))  # the baseline, open arms
    how = "raise `decide.max_rounds` or `decide.max_minutes`"
    ci = _pair(a.speedup_ci_low, a.speedup_ci_high)
    if ci is None:
        first = getattr(s, "first_look", None)
        if first is not None and rounds < first:
            return (f"no interval yet: its first possible decision is at round {first}; {rounds} round(s) "
                    f"measured ({how})")
        return f"no interval yet after {rounds} round(s) of paired starts ({how})"
    if rounds < 2:
        return None
    total = rounds_to_detect(ci[0], ci[1], rounds, effect=DETECT, level=a.ci_level or d.level)
    if total is None:
        return None
    more = max(total - rounds, 1)
    return (f"needs ~{more} more rounds ({more * per_round} starts: one per arm and round) to detect "
            f"{DETECT * 100:.0f} % ({how})")


def arm_line(a: ArmRecord, base: ArmRecord | None, decided_run: bool | DecideRecord | None = False) -> ArmLine:
    starts = len([s for s in a.starts if s.status == "ok"]) or len(a.starts) or len(a.start_orders if isinstance(a, PointRecord) else [])
    sv = a.serving
    line = ArmLine(arm=a.name, method=a.method, k=a.steps, synthetic=bool(a.synthetic),
                   status=a.status, reason=a.reason, baseline=base is not None and a.name == base.name,
                   tok_s=a.tok_s, tok_s_ci=_pair(a.tok_s_ci_low, a.tok_s_ci_high), speedup=a.speedup,
                   speedup_ci=_pair(a.speedup_ci_low, a.speedup_ci_high), verdict=a.verdict, pays=a.pays,
                   accept_len=a.accept_len if a.speculative else None,
                   break_even=a.break_even_accept_len if a.speculative else None,
                   break_even_ci=_pair(a.break_even_ci_low, a.break_even_ci_high) if a.speculative else None,
                   starts=starts, requests=a.requests_ok or 0, min_detectable=a.min_detectable_ratio,
                   failed_requests=a.requests_failed or 0,
                   ttft_p50_ms=sv.ttft_ms.p50 if sv and sv.ttft_ms else None,
                   itl_p50_ms=sv.itl_ms.p50 if sv and sv.itl_ms else None,
                   e2el_p50_ms=sv.e2el_ms.p50 if sv and sv.e2el_ms else None,
                   output_tok_s=sv.output_tok_s if sv else None, goodput=sv.goodput if sv else None,
                   accept_len_request_mean=a.accept_len_request_mean if a.speculative else None)
    for c in problems(a.validity):
        (line.invalid if c.severity == "invalid" else line.warnings).append(c.summary)
    if base is not None and a is not base and base.validity is not None:
        line.invalid += [f"baseline: {c.summary}" for c in problems(base.validity) if c.severity == "invalid"]
    if base is not None and a.baseline_arm not in (None, base.name):
        line.against = a.baseline_arm
    if line.pays == "undecided" and not (a.verdict or "").startswith("equivalent"):
        line.needs = _needs(a, starts, decided_run)
    return line


def headlines(source: Manifest | Any) -> list[Headline]:
    """Every headline of a record: one for a trial, one per session of a hand-made record that has several
    (each judged against its own session's baseline), one per scenario and concurrency of a sweep."""
    m = as_manifest(source)
    if m.points:
        return sweep_headlines(m)
    sessions = list(dict.fromkeys(a.session for a in m.arms if a.session is not None))
    if len(sessions) > 1:
        out = []
        for s in sessions:
            h = headline(m, arms=[a for a in m.arms if a.session == s])
            out.append(h.model_copy(update={"title": f"session {s}: {h.title}"}))
        out[0].environment = environment_line(m)  # the record's, said once
        return out
    return [headline(m)]


def headline(source: Manifest | Any, arms: Sequence[ArmRecord] | None = None) -> Headline:
    """The headline of a record (or of `arms` of it, e.g. one concurrency level of a sweep, one session): the
    arms as `spectrial.analysis.figures` judged them against their baseline (re-judged when `arms` is a subset whose
    reference differs)."""
    m = as_manifest(source) if source is not None else None
    if m is not None and m.kind == "observe":
        return observed_headline(m)
    arms_given = arms
    arms = list(arms if arms is not None else m.arms)  # type: ignore[union-attr]
    base = pick_baseline(arms)
    if base is not None and any(a.status == "ok" and a.baseline_arm is None and a.verdict is None for a in arms):
        from spectrial.analysis.figures import (
            add_comparisons,  # arms never compared (built by hand): the one comparison
        )

        add_comparisons(arms, None, base=base)
    lines = [arm_line(a, base, m.decide if m is not None else None) for a in arms]
    lines.sort(key=lambda x: (not x.baseline, x.status != "ok"))
    spec = [x for x in lines if x.method != "none" and x.status == "ok" and x.speedup is not None]
    decided = None
    if m is not None and m.decide is not None and len(arms) == len(m.arms):
        d = m.decide
        lead = "Sampled until decided" if d.stopped.startswith("decided") else "Sampled in rounds of one start per arm"
        decided = (f"{lead}: {d.rounds} round(s), {d.starts} starts; {d.stopped}"
                   + (" (a fixed design with the same precision: "
                      + ", ".join(f"{k} ~{v} rounds" for k, v in d.fixed_design_rounds.items() if v) + ")"
                      if any(d.fixed_design_rounds.values()) else ""))
    return Headline(title=_title(base, spec, lines), baseline=base.name if base else None,
                    baseline_tok_s=base.tok_s if base else None, arms=lines, decided=decided,
                    environment=environment_line(m) if m is not None and arms_given is None else None,
                    drift=drift_line(m) if m is not None and arms_given is None else None,
                    bound=bound_line(base) if arms_given is None else None,
                    config=config_line(m) if m is not None and arms_given is None else None,
                    energy=energy_line(arms) if arms_given is None else None,
                    context=context_lines(m) if m is not None and arms_given is None else [])


def context_lines(m: Manifest) -> list[str]:
    """Each speculative arm across the workload's context buckets (none without buckets)."""
    from spectrial.readers.context import verdict_lines

    return verdict_lines(m)


def energy_line(arms: Sequence[ArmRecord]) -> str | None:
    """Joules per output token of each arm with power readings (its `energy` figures), in one line; None where
    no arm has any."""
    def one(a: ArmRecord) -> str | None:
        e = a.energy
        if e is None or e.j_per_token is None:
            return None
        ci = f" [{e.j_per_token_ci[0]:.3g}, {e.j_per_token_ci[1]:.3g}]" if e.j_per_token_ci else ""
        acc = f", {e.j_per_accepted:.3g} J per accepted draft token" if e.j_per_accepted is not None else ""
        return f"{a.name} {e.j_per_token:.3g} J per output token{ci}{acc}"
    parts = [x for x in map(one, arms) if x]
    if not parts:
        return None
    src = next(a.energy.source for a in arms if a.energy is not None and a.energy.j_per_token is not None)
    return f"Energy ({src}): " + "; ".join(parts)


def bound_line(base: ArmRecord | None) -> str | None:
    """The baseline against the memory-bandwidth bound, in one line: its `bandwidth_bound` check's summary (the one
    computation, spectrial.analysis.validity); None where the record has no such check or it could not judge."""
    check = next((c for c in (base.validity.checks if base is not None and base.validity else [])
                  if c.name == "bandwidth_bound"), None)
    if check is None or check.ok is None:
        return None
    return f"Bandwidth bound: the baseline at {check.summary}"


def config_line(m: Manifest) -> str | None:
    """What the engines resolved of the arms' settings, in one line (the arms' config checks,
    spectrial.servers.configcheck); None where the record has none."""
    checks = [(a.name, a.config_check) for a in m.arms if a.config_check is not None and a.config_check.ok is not None]
    if not checks:
        return None
    bad = [(n, c) for n, c in checks if c.ok is False]
    if bad:
        return "Resolved configuration: " + "; ".join(f"arm {n}: {c.summary}" for n, c in bad)
    read = sorted({s.key for _, c in checks for s in c.settings if s.state == "match"})
    return f"Resolved configuration: as asked in all {len(checks)} arm(s) ({', '.join(read)} read back)"


def drift_line(m: Manifest) -> str | None:
    """A flagged baseline drift in one line (the record's `drift`, spectrial.protocol.drift); None when not flagged."""
    d = m.drift
    if d is None or not d.flagged:
        return None
    return f"Drift: {d.headline or d.message}; numbers from those runs cannot be compared with this one's"


def environment_line(m: Manifest) -> str | None:
    """What the record's environment checks verified, in one line (`spectrial.servers.envcheck.verified`: the one
    computation; None when no variable was requested)."""
    from spectrial.servers.envcheck import verified

    return verified(m.starts).line


UNCONTROLLED = "uncontrolled: no baseline beside it"


def observed_headline(m: Manifest) -> Headline:
    """An observe-only record (spectrial.protocol.observe): one arm of a server measured as it was, nothing compared; the
    title says so first, then what was measured."""
    lines = []
    for a in m.arms:
        line = arm_line(a, None)
        line.uncontrolled, line.verdict = UNCONTROLLED, UNCONTROLLED
        lines.append(line)
    where = f" at {m.observed.url}" if m.observed is not None else ""
    ok = [x for x in lines if x.status == "ok"]
    if ok:
        x = ok[0]
        acc = f", accept length {x.accept_len:.2f}" if x.accept_len is not None else ""
        what = f"{x.label} ({x.method}) {_n(x.tok_s, 1)} tok/s per request{acc}"
    else:
        what = "nothing measured" + (f" ({lines[0].reason})" if lines and lines[0].reason else "")
    title = f"Uncontrolled: no baseline beside it — the server{where} as it is: {what}; no speed-up can be concluded"
    return Headline(title=title, arms=lines)


def sweep_headlines(source: Manifest | Any) -> list[Headline]:
    """A sweep's headlines: per scenario (synthetic acceptance) and concurrency, its settings against the baseline
    of that concurrency; each title says where. A sweep its budget stopped (`partial`) says so in each title, and
    lists the settings it did not measure there (why, and the model's prediction) among the arms."""
    from spectrial.sweep.result import not_measured, sweep_status

    m = as_manifest(source)
    partial = sweep_status(m) == "partial"
    left = not_measured(m) if partial else []
    stopped_by = m.budget.stopped_by if m.budget is not None else None
    out = []
    levels = sorted({load_of(p) for p in m.points}, key=load_order)
    scenarios = list(dict.fromkeys(p.scenario for p in m.points if p.method != "none"))
    for sc in scenarios:
        for c in levels:
            mine = [x for x in left if x.synthetic_accept == sc]
            names = {x.setting for x in mine}
            pts = [p for p in m.points if load_of(p) == c and (p.method == "none" or p.scenario == sc)
                   and (p.status != "not measured" or p.setting in names)]
            if not any(p.method != "none" and p.status != "not measured" for p in pts):
                continue
            h = headline(None, arms=pts)
            where = c.text() + (f", forced acceptance {sc:g}" if sc is not None else "")
            title, note = f"{where}: {h.title}", h.partial
            if partial:
                title += f" (partial sweep: {len(mine)} setting(s) not measured)" if mine else " (partial sweep)"
                note = f"Partial: stopped by the {stopped_by or 'budget'}" + _not_measured_here(mine, c)
            out.append(h.model_copy(update={"title": title, "partial": note}))
    if out:
        out[0].environment = environment_line(m)  # the record's, said once
    return out


def _not_measured_here(left: Sequence[Any], level: Load) -> str:
    """The settings a partial sweep did not measure at one load `level`, each named once: first those that could be
    faster than the best measured there (at a request rate, where the model predicts nothing, every one), then those
    predicted not to beat it ("" when none)."""
    def can(x: Any) -> bool:
        return level.rate is not None or level.concurrency in x.could_beat_at

    could = [x.setting for x in left if can(x)]
    rest = [x.setting for x in left if not can(x)]
    text = ""
    if could:
        text += ("; not measured here and could be faster than the best measured (so the best here is not "
                 f"confirmed): {', '.join(could)}")
    if rest:
        text += (f"; {'also ' if could else ''}not measured here, predicted not to beat the best beyond the noise: "
                 f"{', '.join(rest)}")
    return text


def _title(base: ArmRecord | None, spec: list[ArmLine], lines: list[ArmLine]) -> str:
    if base is None:
        failed = [x.arm for x in lines if x.status != "ok"]
        return "No baseline completed: nothing to compare" + (f" (failed: {', '.join(failed)})" if failed else "")
    if not spec:
        others = [x for x in lines if x.method != "none"]
        if not others:
            return f"Only the baseline was measured ({_n(base.tok_s, 1)} tok/s per request)"
        why = "; ".join(f"{x.label}: {x.reason or x.verdict or ('no decode rate' if x.tok_s is None else 'not compared')}"
                        for x in others)
        return f"No speculative arm could be compared with the baseline ({why})"

    def ci(x: ArmLine) -> str:
        return f" [{x.speedup_ci[0]:.2f}, {x.speedup_ci[1]:.2f}]" if x.speedup_ci else ""

    invalid = [x for x in spec if is_invalid(x.verdict)]
    if invalid and len(invalid) == len(spec):
        why = sorted({w.split(":")[0] if w.startswith("baseline") else w for x in invalid for w in x.invalid})
        return "Not valid: the measurement failed its checks, so no arm is called faster or slower (" \
            + "; ".join(why)[:300] + ")"
    faster = sorted((x for x in spec if x.pays == "yes"), key=lambda x: -(x.speedup or 0))
    if faster:
        b = faster[0]
        return f"Speculation pays here: {b.label} is {b.speedup:.2f}x faster{ci(b)} than the baseline"
    best = max(spec, key=lambda x: x.speedup or 0)
    if all(x.pays == "no" for x in spec):
        return (f"Speculation does not pay here: every arm is slower than the baseline (best: {best.label} "
                f"{best.speedup:.2f}x{ci(best)})")
    equiv = [x for x in spec if (x.verdict or "").startswith("equivalent")]
    if equiv and len(equiv) == len([x for x in spec if x.pays != "no"]):
        return f"No difference that matters: {', '.join(x.label for x in equiv)} {equiv[0].verdict} of the baseline"
    if all(x.verdict in (NO_SPREAD, TOO_FEW, None) for x in spec):
        return (f"Not judged: single measurements without an interval (best: {best.label} {best.speedup:.2f}x "
                "the baseline)")
    undecided = [x for x in spec if x.pays == "undecided" and x not in invalid]
    slower = [x for x in spec if x.pays == "no"]
    return (f"Not decided: {len(undecided)} arm(s) {NOT_DISTINGUISHABLE}"
            + (f", {len(slower)} slower" if slower else "")
            + (f", {len(invalid)} with an invalid measurement" if invalid else "") + f" (best: {best.label} {best.speedup:.2f}x{ci(best)})")


__all__ = ["ArmLine", "Headline", "arm_line", "fit_table", "headline", "headlines", "observed_headline", "paragraph",
           "sweep_headlines", "wrap"]
