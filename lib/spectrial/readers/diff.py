"""`spectrial diff RUN_A RUN_B`: whether two runs can be compared at all, the most consequential measured change,
then what differs, most consequential first.

Two separate statements open the output:
- comparability (`comparability`): "not comparable: different GPU, model and engine build" when the machine, the
  model or the engine build differ (or one run does not record them), "comparable: only NCCL_PROTO differs" when
  only launch settings (environment variables, flags) differ: the experiment itself;
- the change (`headline`): like with like, each speculative arm's speed-up against its own run's baseline (with
  intervals; "a measured change" only when they do not overlap), the arm whose speed-up moved most first; tok/s
  across runs only when no arm has a speed-up in both.

Order of consequence of the detailed lines (what most often explains a different number):
   -1 acceptance that moved beyond its intervals between arms of the same draft, depth, sampling and workload (a
      bug signal: acceptance must not depend on parallelism, the engine or the machine; spectrial.record.acceptance)
    0 environment that did not reach the server (variables missing from worker processes), env requested
    1 engine build / version / source diff, model files (paired by file name; "not recorded" when a run has no
      identity for one)
    2 machine state (driver, GPUs, clocks, kernel, governor, throttling)
    3 launch commands (argv per arm)
    4 other parameters (compared after filling the defaults of the params model, so a default that an older
      schema did not write is no difference)
    5 results (speed-up and tok/s per arm, with the baseline's own move)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import JsonValue

from spectrial.analysis.catalogue import figure
from spectrial.errors import RecordDamaged
from spectrial.hosts.fingerprint import stable_view
from spectrial.protocol.drift import argv_changes, dict_changes
from spectrial.record import comparable as cmp
from spectrial.record.acceptance import AcceptShift, accept_shifts
from spectrial.record.comparable import Category
from spectrial.record.store import load_record, read_requests, trial_params
from spectrial.schema import ArmRecord, HostFingerprint, Manifest

# what a change is stated in, as the figure catalogue labels it (spectrial.analysis.catalogue)
SPEEDUP, TOK_S = figure("speedup").label, figure("tok_s").label


@dataclass(order=True)
class Finding:
    severity: int
    text: str


def _env_reach(arm: ArmRecord) -> dict[str, int]:
    """Per variable: in how many server processes it was missing or wrong."""
    out: dict[str, int] = {}
    for p in arm.env_check.processes if arm.env_check else []:
        for k in list(p.get("missing", [])) + list((p.get("wrong") or {}).keys()):
            out[k] = out.get(k, 0) + 1
    return out


class DiffResult(list[Finding]):
    """The findings of `diff_runs` (a list, most consequential first) with the runs' `comparability` and the most
    consequential measured change (`headline`, a `Change` or None when no arm was measured in both)."""

    def __init__(self, findings: list[Finding], comparability: Verdict, headline: Change | None = None
                 ) -> None:
        super().__init__(findings)
        self.comparability = comparability
        self.headline = headline


@dataclass(frozen=True)
class Change:
    """One arm's change between the runs: its speed-up against its own run's baseline (`what` = "speed-up"), or
    its tok/s when no speed-up is recorded in both (`what` = "tok/s"), with the intervals when recorded."""

    arm: str
    what: str
    a: float
    b: float
    ci_a: tuple[float, float] | None = None
    ci_b: tuple[float, float] | None = None

    @property
    def rel(self) -> float:
        return self.b / self.a - 1 if self.a else 0.0

    @property
    def measured(self) -> bool | None:
        """True: the intervals do not overlap (a measured change); False: they overlap; None: no intervals."""
        if self.ci_a is None or self.ci_b is None:
            return None
        return self.ci_b[1] < self.ci_a[0] or self.ci_b[0] > self.ci_a[1]

    def _fmt(self, v: float, ci: tuple[float, float] | None) -> str:
        if self.what == SPEEDUP:
            return f"{v:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")
        return f"{v:.2f} tok/s" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")

    def text(self) -> str:
        """'draft-simple: speed-up against its own run's baseline 1.16x [1.11, 1.20] -> 0.88x [0.71, 1.17]
        (-24.1 %; intervals overlap: within the noise)'."""
        note = {None: "no intervals recorded: cannot say whether it is measured",
                True: "intervals do not overlap: a measured change",
                False: "intervals overlap: within the noise"}[self.measured]
        what = "speed-up against its own run's baseline" if self.what == SPEEDUP else \
            "tok/s across the runs (no speed-up recorded in both)"
        return (f"{self.arm}: {what} {self._fmt(self.a, self.ci_a)} -> {self._fmt(self.b, self.ci_b)} "
                f"({self.rel * 100:+.1f} %; {note})")


def _ci(lo: float | None, hi: float | None) -> tuple[float, float] | None:
    return (lo, hi) if lo is not None and hi is not None else None


def headline(a: Manifest, b: Manifest) -> Change | None:
    """The most consequential measured change, like with like: per arm in both runs, its speed-up against its own
    run's baseline; measured changes (intervals apart) first, then the largest move. Tok/s across the runs only
    when no arm has a speed-up in both runs."""
    arms_b = {x.name: x for x in b.arms}
    pairs = [(x, arms_b[x.name]) for x in a.arms if x.name in arms_b]
    changes = [Change(x.name, SPEEDUP, x.speedup, y.speedup, _ci(x.speedup_ci_low, x.speedup_ci_high),
                      _ci(y.speedup_ci_low, y.speedup_ci_high))
               for x, y in pairs if x.speculative and x.speedup and y.speedup]
    if not changes:
        changes = [Change(x.name, TOK_S, x.tok_s, y.tok_s, _ci(x.tok_s_ci_low, x.tok_s_ci_high),
                          _ci(y.tok_s_ci_low, y.tok_s_ci_high)) for x, y in pairs if x.tok_s and y.tok_s]
    if not changes:
        return None
    return max(changes, key=lambda c: (c.measured is True, abs(c.rel)))


def diff_runs(run_a: str | Path, run_b: str | Path) -> DiffResult:
    """Findings between two run records, most consequential first; `.comparability` holds the verdict."""
    a, b = load_record(run_a), load_record(run_b)
    f: list[Finding] = []
    arms_a = {x.name: x for x in a.arms}
    arms_b = {x.name: x for x in b.arms}
    common = [n for n in arms_a if n in arms_b]
    for n in sorted(set(arms_a) ^ set(arms_b)):
        f.append(Finding(3, f"arm {n} only in {'A' if n in arms_a else 'B'}"))
    for n in common:
        xa, xb = arms_a[n], arms_b[n]
        ra, rb = _env_reach(xa), _env_reach(xb)
        for var in sorted(set(ra) | set(rb)):
            if ra.get(var, 0) != rb.get(var, 0):
                side, cnt = ("B", rb[var]) if rb.get(var, 0) > ra.get(var, 0) else ("A", ra[var])
                f.append(Finding(0, f"{var} missing from {cnt} server process(es) of arm {n} in run {side}"))
        for t in dict_changes(xa.env or {}, xb.env or {}, f"arm {n} env"):
            f.append(Finding(0, t))
        for t in argv_changes(xa.argv or [], xb.argv or []):
            f.append(Finding(3, f"arm {n}: {t}"))
        ca, cb = xa.config_check, xb.config_check
        if ca is not None and cb is not None:  # what the engines resolved, read back (servers.configcheck)
            for t in dict_changes(ca.facts(), cb.facts(), f"arm {n} resolved config"):
                f.append(Finding(1, t))
        for side, c in (("A", ca), ("B", cb)):
            if c is not None and c.ok is False:
                f.append(Finding(0, f"arm {n} in run {side}: the engine resolved another configuration than "
                                    f"asked: {c.summary}"))
    ea, eb = a.engine, b.engine
    for k, va, vb in (("version", ea.version, eb.version), ("commit", ea.commit, eb.commit),
                      ("diff_hash", ea.diff_hash, eb.diff_hash), ("binary", ea.binary, eb.binary)):
        if va != vb:
            f.append(Finding(1, f"engine {k}: {va!r} -> {vb!r}"))
    ia, ib = ea.binary_identity, eb.binary_identity
    if ia is not None and ib is not None and (ia.head_tail_sha256, ia.size) != (ib.head_tail_sha256, ib.size):
        f.append(Finding(1, f"engine binary changed: {ia.path} size {ia.size} -> {ib.size}, "
                            f"hash {ia.head_tail_sha256} -> {ib.head_tail_sha256}"))
    f += [Finding(1, t) for t in _model_files(a, b)]
    fa, fb = a.host.fingerprint, b.host.fingerprint
    if fa is not None or fb is not None:
        for t in dict_changes(stable_view(fa or HostFingerprint()), stable_view(fb or HostFingerprint()), "host"):
            f.append(Finding(2, t.replace("host.gpus.", "GPU ")))
    for n in common:
        ta, tb = arms_a[n].throttled_samples, arms_b[n].throttled_samples
        if ta != tb:
            f.append(Finding(2, f"arm {n}: throttled GPU samples {ta} -> {tb}"))
    skip = {"output_dir", "state_dir", "work_dir", "port", "name", "drift_dir"}
    pa = {k: v for k, v in _filled_params(a).items() if k not in skip and k != "arms"}
    pb = {k: v for k, v in _filled_params(b).items() if k not in skip and k != "arms"}
    f += [Finding(4, t) for t in dict_changes(pa, pb, "params")]
    for n in common:
        xa, xb = arms_a[n], arms_b[n]
        if xa.speculative and (xa.verdict or xb.verdict) and (xa.verdict != xb.verdict or xa.speedup != xb.speedup):
            f.append(Finding(5, f"arm {n}: speed-up against its own run's baseline {_judged(xa)} -> {_judged(xb)}"))
        if xa.tok_s and xb.tok_s and xa.tok_s != xb.tok_s:
            c = Change(n, TOK_S, xa.tok_s, xb.tok_s, _ci(xa.tok_s_ci_low, xa.tok_s_ci_high),
                       _ci(xb.tok_s_ci_low, xb.tok_s_ci_high))
            note = {None: "no intervals", True: "intervals do not overlap", False: "intervals overlap"}[c.measured]
            line = f"arm {n}: {xa.tok_s:.2f} -> {xb.tok_s:.2f} tok/s ({c.rel * 100:+.1f} %; {note})"
            ba, bb = _base(a, xa), _base(b, xb)
            if xa.speculative and ba is not None and bb is not None and ba.tok_s and bb.tok_s:
                named = "" if ba.name == bb.name else f" ({ba.name} -> {bb.name})"
                line += (f"; its run's baseline{named} moved {ba.tok_s:.2f} -> {bb.tok_s:.2f} tok/s "
                         f"({(bb.tok_s / ba.tok_s - 1) * 100:+.1f} %)")
            f.append(Finding(5, line))
    if a.status != b.status:
        f.append(Finding(5, f"status: {a.status} -> {b.status}"))
    f += [Finding(-1 if x.flagged else 5, x.text()) for x in _shifts(run_a, run_b, a, b)]
    return DiffResult(sorted(f, key=lambda x: x.severity), comparability(a, b), headline(a, b))


def _shifts(run_a: str | Path, run_b: str | Path, a: Manifest, b: Manifest) -> list[AcceptShift]:
    """Accept length of the arms both runs share draft, depth, sampling and workload with (spectrial.readers.
    acceptance); none when a run's requests.csv is missing or damaged (its other findings still stand)."""
    try:
        return accept_shifts(a, b, read_requests(run_a), read_requests(run_b), a.params.confidence or 0.95)
    except RecordDamaged:
        return []


def _base(m: Manifest, arm: ArmRecord) -> ArmRecord | None:
    """The baseline `arm` was judged against in its own run (the one it names, else the run's first baseline)."""
    named = next((x for x in m.arms if arm.baseline_arm and x.name == arm.baseline_arm), None)
    return named or next((x for x in m.arms if not x.speculative and x.status == "ok" and x.tok_s), None)


def _filled_params(m: Manifest) -> dict[str, JsonValue]:
    """The run's params with every default filled by the params model of its kind (`model_validate`), so that a
    default an older schema did not write is not an "added" parameter; the params as recorded when the model
    does not accept them (a hand-made or much older record)."""
    from pydantic import ValidationError

    from spectrial.errors import ConfigError
    from spectrial.sweep.params import SweepParams

    try:
        if m.kind == "sweep":
            return SweepParams.model_validate(m.params.as_dict()).model_dump(mode="json")
        return trial_params(m).model_dump(mode="json")
    except (ConfigError, ValidationError, ValueError, TypeError):
        return m.params.as_dict()


def _model_files(a: Manifest, b: Manifest) -> list[str]:
    """Model files of the two runs, paired by path, else by file name (a model set rebuilt in another folder):
    changed (both identities recorded and different), not recorded (a run has no identity for it), or only in
    one run."""
    fa, fb = {x.path: x for x in a.models}, {x.path: x for x in b.models}
    pairs = [(p, p) for p in fa if p in fb]
    left_a, left_b = [p for p in fa if p not in fb], [p for p in fb if p not in fa]
    for p in list(left_a):
        same = [q for q in left_b if Path(q).name == Path(p).name]
        if len(same) == 1:
            pairs.append((p, same[0]))
            left_a.remove(p)
            left_b.remove(same[0])
    out = []
    for pa, pb in pairs:
        x, y = fa[pa], fb[pb]
        name = pa if pa == pb else f"{Path(pa).name} ({pa} -> {pb})"
        ida, idb = (x.head_tail_sha256, x.size), (y.head_tail_sha256, y.size)
        if x.head_tail_sha256 is None or y.head_tail_sha256 is None:
            side = "A and B" if x.head_tail_sha256 is None and y.head_tail_sha256 is None else \
                "A" if x.head_tail_sha256 is None else "B"
            if pa != pb or side != "A and B":
                out.append(f"model file {name}: identity not recorded in run {side}")
        elif ida != idb:
            out.append(f"model file {name} changed: hash {x.head_tail_sha256} -> {y.head_tail_sha256}, size "
                       f"{x.size} -> {y.size}")
    out += [f"model file {p} only in run A" for p in left_a]
    out += [f"model file {p} only in run B" for p in left_b]
    return out


def _judged(arm: ArmRecord) -> str:
    """An arm's comparison with its baseline as the record states it (spectrial.analysis.figures)."""
    if arm.speedup is None:
        return "not compared"
    ci = f" [{arm.speedup_ci_low:.2f}, {arm.speedup_ci_high:.2f}]" if arm.speedup_ci_low and arm.speedup_ci_high else ""
    return f"{arm.speedup:.2f}x{ci} {arm.verdict or 'not judged'}"


def format_findings(findings: list[Finding]) -> str:
    """Two statements (when `findings` came from `diff_runs`): whether the runs can be compared, and the most
    consequential measured change; then one line per finding, most consequential first."""
    labels = {-1: "acceptance", 0: "environment", 1: "engine/model", 2: "machine", 3: "launch", 4: "params", 5: "results"}
    verdict = getattr(findings, "comparability", None)
    head = [f"comparability: {verdict.verdict}"] if verdict is not None else []
    if verdict is not None:
        change = getattr(findings, "headline", None)
        head.append("change: " + (change.text() if change is not None else "none to state: no arm measured in both runs")
                    + ("" if verdict.comparable or change is None else " (between runs that are not comparable)"))
    if not findings:
        return "\n".join([*head, "no differences found"])
    return "\n".join([*head, *(f"[{labels[x.severity]}] {x.text}" for x in findings)])


# ------------------------------------------------------------------ comparability
# what must be the same for two numbers to be compared (spectrial.record.comparable: the one answer); the launch
# configuration may differ: it is the experiment (`only`)
REQUIRES: tuple[Category, ...] = ("GPU", "host", "model", "model files", "engine", "engine version",
                                  "engine build", "workload", "sampling", "concurrency")
WORDS: dict[Category, str] = {"model files": "model", "engine": "engine build", "engine version": "engine build"}
UNIT = "GPU (another unit of the same model)"


@dataclass(frozen=True)
class Verdict:
    """Whether two runs measure the same thing (`result`, the one comparison): `differs` names what makes them
    not comparable (machine, model, engine build, workload), `unknown` what only one run records, `only` the
    launch settings that differ (the experiment, when nothing else does)."""

    result: cmp.Comparability

    def _words(self, recorded: bool) -> tuple[str, ...]:
        words: dict[str, list[str]] = {}
        for d in self.result.blocking:
            if (d.recorded == "both") == recorded:
                word = UNIT if d.field == "GPU units" else WORDS.get(d.category, d.category)
                fields = words.setdefault(word, [])
                if d.category == "host" and d.field not in fields:
                    fields.append(d.field)
        # the machine's state says which part moved (driver, topology, CUDA, ...): a user's next question
        return tuple(f"{w} ({', '.join(f)})" if f else w for w, f in words.items())

    @property
    def differs(self) -> tuple[str, ...]:
        return self._words(True)

    @property
    def unknown(self) -> tuple[str, ...]:
        return tuple(w for w in self._words(False) if w not in self.differs)

    @property
    def only(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d.field for d in self.result.of("configuration")))

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(d.text() for d in self.result.blocking)

    @property
    def comparable(self) -> bool:
        return self.result.comparable

    @property
    def verdict(self) -> str:
        """'not comparable: different GPU, model and engine build', 'comparable: only NCCL_PROTO differs', ..."""
        differs, unknown, only = self.differs, self.unknown, self.only
        if differs or unknown:
            parts = []
            if differs:
                parts.append("different " + _and(list(differs)))
            if unknown:
                parts.append(_and(list(unknown)) + " recorded in only one run")
            return "not comparable: " + "; ".join(parts)
        if not only:
            return "comparable: no recorded difference in machine, model, engine build, workload or launch"
        return f"comparable: only {_and(list(only))} differ{'s' if len(only) == 1 else ''}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def comparability(a: Manifest, b: Manifest) -> Verdict:
    """Whether runs `a` and `b` can be compared, and if not, why (see `Verdict.verdict`)."""
    return Verdict(cmp.compare(a, b, require=REQUIRES))
