"""The controlled trial: the protocol the original investigation did by hand, step by step or in one call.

    trial = Trial("params/local.yaml")
    trial.kill_old_server()          # stop what spectrial left on the port; refuse anything else there
    trial.verify_gpus_free()         # and fingerprint the host
    trial.run_arm("baseline")        # launch -> ready -> verify env -> warm up -> benchmark -> stop
    trial.run_arm("eagle3")          # each arm: `restarts` server starts (spectrial.protocol.session)
    trial.compare()                  # figures per arm, comparison with the baseline, drift; the record's status

The readers (spectrial.readers) say what the record means: `headline(trial.manifest)` (the answer),
`explain(trial.manifest)` (why: break-even, cycle cost, acceptance needed, roofline).

Every step writes into the same run record (`outputs/<run-id>/manifest.json`); each is safe to re-run in a
kernel (a re-run arm replaces its earlier starts, which stay in the record marked `superseded`), and a server
is stopped on any exception, KeyboardInterrupt included. `run_trial(params)` and `spectrial trial` run the
same steps in one call, the arms' starts in `order` (interleaved A B A B by default); the record always
ends `ok` or `failed` with the reason.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from spectrial.analysis import energy, roofline, validity
from spectrial.analysis.figures import (
    add_category_comparisons,
    add_comparisons,
    arm_figures,
    category_figures,
    category_table,
    merge_stats,
    verdict_cycle_ms,
    with_figures,
)
from spectrial.errors import (
    ConfigError,
    ConnectionLost,
    MeasurementRejected,
    RecordWriteError,
    RunFailed,
    SpectrialError,
)
from spectrial.hosts.gpu import GpuStatus
from spectrial.models.weights import streamed
from spectrial.params import Arm, TrialParams, load_params
from spectrial.protocol.session import MeasuredStart, Session, WindowPlan, lost_requests, schedule
from spectrial.record.store import RunRecord, RunResult, opened
from spectrial.schema import ArmRecord, BandwidthBound, Manifest, RequestRecord, StartSummary
from spectrial.secrets import mask_launch
from spectrial.servers import configcheck
from spectrial.servers.lifecycle import KillReport


class TrialResult(RunResult):
    """What a trial produced: the run folder, its manifest, per-arm results and per-request rows."""

    @property
    def arms(self) -> list[ArmRecord]:
        return self.manifest.arms

    def table(self) -> pd.DataFrame:
        """One row per arm with every figure (ARM_COLUMNS; `spectrial.readers.headline` has the compact one)."""
        return arms_table(self.manifest.arms)

    def categories(self) -> pd.DataFrame:
        """One row per arm and workload category (empty unless the workload has two categories or more)."""
        return category_table(self.manifest.arms)


ARM_COLUMNS = ["arm", "method", "status", "steps", "synthetic", "tok_s", "tok_s_ci_low", "tok_s_ci_high",
               "speedup", "speedup_ci_low", "speedup_ci_high", "verdict", "pays", "accept_len",
               "break_even_accept_len", "break_even_ci_low", "break_even_ci_high", "accepted", "drafted",
               "draft_accept_rate", "alpha", "cycle_ms", "ms_per_token", "engine_cycle_ms", "draft_ms_per_cycle",
               "ttft_p50_ms", "tpot_p50_ms", "itl_p50_ms", "e2el_p50_ms", "output_tok_s", "request_rate",
               "goodput", "starts", "env_ok"]


MEASURED_COLUMNS = ["arm", "method", "status", "starts", "tok_s", "tok_s_ci_low", "tok_s_ci_high", "accept_len",
                    "draft_accept_rate", "cycle_ms", "ttft_p50_ms", "itl_p50_ms", "e2el_p50_ms", "env_ok"]


def arms_table(arms: list[ArmRecord]) -> pd.DataFrame:
    """The arms of a manifest as a table (columns ARM_COLUMNS; `spectrial trial --wide`)."""
    rows = []
    for a in arms:
        row = {"arm": a.name, **{c: getattr(a, c, None) for c in ARM_COLUMNS[1:]}}
        sv = a.serving
        for name in ("ttft", "tpot", "itl", "e2el"):
            dist = getattr(sv, f"{name}_ms") if sv else None
            row[f"{name}_p50_ms"] = dist.p50 if dist else None
        for name in ("output_tok_s", "request_rate", "goodput"):
            row[name] = getattr(sv, name) if sv else None
        row["cycle_ms"] = verdict_cycle_ms(a) if a.status == "ok" else a.cycle_ms  # the verdict's clock (one voice)
        row["env_ok"] = a.env_check.ok if a.env_check else None
        row["starts"] = len(a.starts) or None
        rows.append(row)
    return pd.DataFrame(rows, columns=ARM_COLUMNS)


def arm_entry(params: TrialParams, arm: Arm, argv: list[str], env: dict[str, str]) -> ArmRecord:
    """The static part of an arm's record: method, settings, exact argv and env (masked)."""
    spec, shown = arm.speculative, mask_launch(argv, env)
    return ArmRecord(name=arm.name, method=arm.method, status="pending",
                     steps=params.arm_steps(arm) if spec else None, topk=params.arm_topk(arm) if spec else None,
                     draft_tokens=params.arm_draft_tokens(arm) if spec else None,
                     draft=params.arm_draft(arm) if spec else None, synthetic=arm.synthetic_accept is not None,
                     synthetic_accept=arm.synthetic_accept, argv=shown.argv, env=shown.env)


class Trial:
    """One trial run: its record and session, and the protocol steps as methods (see the module docstring)."""

    def __init__(self, params: TrialParams | str | Path, overrides: dict[str, Any] | None = None, *,
                 run_id: str | None = None, progress: bool = True) -> None:
        if not isinstance(params, TrialParams):
            params = load_params(params, overrides)
        elif overrides:
            params = load_params(data=params.model_dump(mode="json"), overrides=overrides)
        self.params = params
        from spectrial.protocol.plan import make_plan

        self.plan = make_plan(params, launches=False)  # a budget that cannot decide is refused before anything
        self.record = RunRecord(params.output_dir, params.name, kind="trial", run_id=run_id, params=params)
        self.record.manifest.plan = self.plan.record
        self.session = Session(params, self.record, progress)
        if progress:
            from spectrial.progress import note

            for line in self.plan.lines():
                note(line)
        self.starts: dict[str, list[MeasuredStart]] = {a.name: [] for a in params.arms}
        self.failures: dict[str, list[str]] = {}  # per step ("kill_old_server", "arm baseline", ...): what failed
        self.intervals: dict[str, dict[str, Any]] = {}  # a decide run's confidence sequences, per arm
        self._decide_repeats: int | None = None  # a decide run's requests per start (its allocation)
        self._active: str | None = None  # the arm whose start is running ("arm NAME"), for failure reasons
        self.closed = False

    # --- record --------------------------------------------------------------------------------------------
    @property
    def manifest(self) -> Manifest:
        return self.record.manifest

    @property
    def run_dir(self) -> Path:
        return self.record.dir

    def arm(self, name: str) -> Arm:
        """The arm called `name` (ConfigError naming the known ones otherwise)."""
        for a in self.params.arms:
            if a.name == name:
                return a
        raise ConfigError(f"arms: no arm named {name!r}; this trial has {[a.name for a in self.params.arms]}",
                          parameter="arms")

    @property
    def baseline_arms(self) -> list[str]:
        return [a.name for a in self.params.arms if not a.speculative]

    @property
    def experiment_arms(self) -> list[str]:
        return [a.name for a in self.params.arms if a.speculative]

    def _ensure_arms(self) -> None:
        """The arms' static records, once every command is fixed (prepare)."""
        specs = self.session.prepare()
        have = {a.name for a in self.manifest.arms}
        for a in self.params.arms:
            if a.name not in have:
                s = specs[a.name]
                self.manifest.arms.append(arm_entry(self.params, a, s.argv, s.env))
        self.record.save()

    # --- the protocol steps --------------------------------------------------------------------------------
    def kill_old_server(self) -> KillReport:
        """Stop the server spectrial left on the port (found by its recorded process group and session);
        refuse, naming pid and command line, when another program holds it."""
        with self._failing(["prepare"]):
            self._ensure_arms()
        with self._failing(["kill_old_server"]):
            return self.session.kill_old_server()

    def verify_gpus_free(self) -> GpuStatus:
        """Wait until the GPUs are free (or record that the host has none), then fingerprint the host; returns the
        head's GPUs as found."""
        with self._failing(["prepare"]):
            self._ensure_arms()
        with self._failing(["verify_gpus_free"]):
            gpus = self.session.verify_gpus_free()
            self.session.fingerprint()
            return gpus

    def run_arm(self, name: str) -> ArmRecord:
        """All `restarts` server starts of one arm (the preamble first if it has not run); re-running an arm
        replaces its earlier starts. Returns the arm's record, figures filled in."""
        self.run_arms([name])
        return self.manifest.arm(name)  # type: ignore[return-value]

    def run_arms(self, names: list[str] | None = None) -> list[ArmRecord]:
        """Starts of the named arms (default all) in `order`: interleaved A B A B, blocked or random."""
        arms = [self.arm(n) for n in names] if names is not None else list(self.params.arms)
        with self._failing(["prepare"]):
            self._ensure_arms()
        with self._failing([f"arm {a.name}" for a in arms], active=lambda: self._active):
            self.session.open()
            for a in arms:  # a re-run replaces the arm's earlier starts
                self.intervals.pop(a.name, None)
                for s in self.manifest.live_starts(a.name):
                    s.superseded = True
                self.starts[a.name] = []
                self.failures.pop(f"arm {a.name}", None)
                entry = self.manifest.arm(a.name)
                if entry is not None:
                    entry.status, entry.reason = "running", None
            p = self.params
            if p.decide is not None and names is None:
                self._run_decide(arms)
            else:
                for arm, restart in schedule(arms, p.restarts, p.order, p.seed):
                    self._start(arm, restart)
        return [self.manifest.arm(a.name) for a in arms]  # type: ignore[misc]

    def _start(self, arm: Arm, restart: int) -> MeasuredStart | None:
        """One start of `arm` (its figures refreshed whatever happens); None when it failed to run."""
        p = self.params
        self._active = f"arm {arm.name}"
        try:
            repeats = self._decide_repeats or p.repeats
            buckets = p.context_buckets()  # context-length buckets: each its own window, shortest first
            plans = [WindowPlan(p.concurrency, repeats, p.seed + restart + 7 * i, cat)
                     for i, (_, cat) in enumerate(buckets)] or [WindowPlan(p.concurrency, repeats, p.seed + restart)]
            m = self.session.start(arm, restart, plans)
            self.starts[arm.name].append(m)
            if m.record.status != "ok":
                self._fail(f"arm {arm.name}", f"start {restart + 1}: {m.record.reason}")
            elif lost := lost_requests(m):
                self._fail(f"arm {arm.name}", f"start {restart + 1}: {lost}")
            return m
        except (KeyboardInterrupt, ConfigError, MeasurementRejected, RecordWriteError, ConnectionLost):  # end the run
            raise
        except SpectrialError as exc:
            self._fail(f"arm {arm.name}", f"start {restart + 1}: {exc}")
            return None
        else:
            self._active = None
        finally:
            self._summarise([arm])

    def _run_decide(self, arms: list[Arm]) -> None:
        """Rounds of one start of the baseline and of every arm not yet settled (in `order`), a sequence per
        speculative arm over the paired rounds (spectrial.analysis.sequential: the group-sequential design by default, with
        this host's earlier spread as a prior), until every arm is decided or the budget is spent; the record's
        `decide` says how many starts, the design and why it stopped, and the arms' intervals are the sequences'."""
        import time

        from spectrial.analysis.figures import median
        from spectrial.analysis.sequential import ArmSequence, GroupSequential, PairedSequence, decide
        from spectrial.progress import note
        from spectrial.schema import DecideArmRecord, DecideRecord

        p, d = self.params, self.params.decide
        assert d is not None
        base = next((a for a in arms if not a.speculative), None)
        spec = [a for a in arms if a.speculative]
        if base is None or not spec:
            raise ConfigError("decide: needs a baseline arm (method none) and at least one speculative arm",
                              parameter="decide")
        history, prior, repeats, why, found = self._decide_history()

        def sequences(prior: Any) -> dict[str, ArmSequence]:
            if d.method == "confidence-sequence":
                return {a.name: PairedSequence(level=p.confidence, margin=d.margin) for a in spec}
            return {a.name: GroupSequential(level=p.confidence, margin=d.margin, max_rounds=d.max_rounds,
                                            min_rounds=d.min_rounds, prior=prior) for a in spec}

        seqs = sequences(prior)
        first = next(iter(seqs.values()))
        rec = DecideRecord(level=p.confidence, margin=d.margin, min_rounds=d.min_rounds, max_rounds=d.max_rounds,
                           max_minutes=d.max_minutes, method=first.method(),  # type: ignore[attr-defined]
                           arms=[DecideArmRecord(arm=a.name, first_look=getattr(seqs[a.name], "first_look", None))
                                 for a in spec],
                           history=history, prior_sd_log=prior.sd_log if prior else None,
                           prior_df=prior.df if prior else None, requests_per_start=repeats, allocation=why)
        self.manifest.decide = rec
        self._decide_repeats = repeats
        t0 = time.monotonic()
        for rnd in range(d.max_rounds):
            open_arms = {s.arm for s in rec.arms if s.decided_at is None}
            order = [a for a in arms if not a.speculative or a.name in open_arms]
            if p.order == "random":
                random.Random(p.seed + rnd).shuffle(order)
            rates: dict[str, float | None] = {}
            for arm in order:
                m = self._start(arm, rnd)
                rec.starts += 1
                rates[arm.name] = median(r.tok_s for w in (m.windows if m else []) for r in w.requests if r.ok)
            rec.rounds = rnd + 1
            if rnd == 0 and prior is not None and (moved := _moved(found, rates.get(base.name), p.drift_tolerance)):
                prior = None  # the host is not where its history was: today's rounds alone
                seqs = sequences(None)
                rec.history = f"{history}; not used: {moved}"
                rec.prior_sd_log = rec.prior_df = None
                rec.method = next(iter(seqs.values())).method()  # type: ignore[attr-defined]
                for s in rec.arms:
                    s.first_look = getattr(seqs[s.arm], "first_look", None)
            for s in rec.arms:
                if s.arm not in open_arms:
                    continue
                b, a = rates.get(base.name), rates.get(s.arm)
                if b and a:
                    seqs[s.arm].add(b, a)  # type: ignore[attr-defined]
                q = seqs[s.arm]
                ci = q.interval()
                s.rounds, s.estimate, s.status = q.n, q.estimate(), q.status()
                s.ci_low, s.ci_high = ci if ci else (None, None)
                s.prior_dropped_at = getattr(q, "prior_dropped_at", None)
                s.looks.append({"round": rnd + 1, "n": q.n, "estimate": s.estimate, "low": s.ci_low,
                                "high": s.ci_high, "status": s.status})
                if s.status != "undecided":
                    s.decided_at = rnd + 1
            rec.elapsed_s = round(time.monotonic() - t0, 2)
            round_s = rec.elapsed_s / rec.rounds
            stop, why_stop = decide(seqs, min_rounds=d.min_rounds, max_rounds=d.max_rounds, elapsed_s=rec.elapsed_s,
                                    max_s=d.max_minutes * 60 if d.max_minutes else None, round_s=round_s,
                                    rounds=rec.rounds)
            rec.stopped = why_stop
            self.record.save()
            if self.session.progress:
                note(self._decide_line(rec, seqs, round_s, stop), enabled=True)
            if stop:
                break
        for s in rec.arms:
            q = seqs[s.arm]
            rec.fixed_design_rounds[s.arm] = q.fixed_design_rounds()  # type: ignore[attr-defined]
            self.intervals[s.arm] = {"low": s.ci_low, "high": s.ci_high, "level": p.confidence,
                                     "estimate": s.estimate if s.ci_low is not None else None,
                                     "verdict": _sequence_verdict(s.status, d.margin),
                                     "basis": f"{_basis(d.method)} over {q.n} paired rounds"}
        self.record.save()

    def _decide_history(self) -> tuple[str, Any, int, str, Any]:
        """What this host's earlier runs give a decide run: the prior spread (or why none) and the requests per
        start (the optimal allocation, or `repeats`)."""
        from spectrial.analysis.sequential import allocate
        from spectrial.protocol.earlier import earlier

        p, d = self.params, self.params.decide
        assert d is not None
        found = None
        if d.history == "auto" and self.manifest.fingerprint_key:
            found = earlier(p.output_dir, self.manifest.params, fingerprint_key=self.manifest.fingerprint_key,
                            exclude=self.record.run_id)
        prior = found.prior if found is not None else None
        if d.history == "off":
            history = "history off (decide.history): today's rounds alone"
        elif found is None:
            history = "no fingerprint yet: today's rounds alone"
        elif prior is None:
            history = f"{found.describe()}: no start-to-start spread in them (one start per arm): today's rounds alone"
        else:
            history = (f"{found.describe()}: prior spread {prior.sd_log:.1%} per round ({prior.df} df), dropped "
                       "if today's starts spread more")
        if isinstance(d.repeats, int):
            return history, prior, d.repeats, "decide.repeats as given", found
        if d.repeats is None or found is None:
            return history, prior, p.repeats, "`repeats` as given", found
        alloc = allocate(found.overhead_s, found.request_s, found.within_sd_log,
                         prior.sd_log / 2 ** 0.5 if prior else None, found.requests_per_start, default=p.repeats,
                         lo=max(p.validity.min_requests, 1), hi=max(8 * p.repeats, p.validity.min_requests))
        return history, prior, alloc.requests, alloc.reason, found

    def _decide_line(self, rec: Any, seqs: dict[str, Any], round_s: float, stop: bool) -> str:
        """The progress line after a round: the round, each arm's interval so far, starts left and the ETA."""
        d = self.params.decide
        assert d is not None
        parts = []
        for s in rec.arms:
            q = seqs[s.arm]
            if s.ci_low is not None and s.estimate is not None:
                iv = f"{s.estimate:.2f}x [{s.ci_low:.2f}, {s.ci_high:.2f}] {s.status}"
            else:
                first = getattr(q, "first_look", None)
                iv = (f"{s.estimate:.2f}x, no interval before round {first}" if s.estimate and first
                      else "no interval yet")
            parts.append(f"{s.arm} {iv}" + (" (settled)" if s.decided_at else ""))
        open_arms = len([s for s in rec.arms if s.decided_at is None])
        left_rounds = 0 if stop else d.max_rounds - rec.rounds
        if d.max_minutes and not stop:
            left_rounds = min(left_rounds, max(0, int((d.max_minutes * 60 - rec.elapsed_s) // max(round_s, 1e-9))))
        starts_left = left_rounds * (1 + open_arms)
        eta = f", ETA at most {_duration(left_rounds * round_s)}" if starts_left else ""
        head = "decided" if stop else f"round {rec.rounds}/{d.max_rounds}"
        return f"decide {head}: {'; '.join(parts)}; {starts_left} start(s) left at most{eta}"

    def table_of(self, names: list[str] | None = None, wide: bool = False) -> pd.DataFrame:
        """What the named arms (default all) measured so far: MEASURED_COLUMNS, rounded (`wide`: ARM_COLUMNS)."""
        t = arms_table([a for a in self.manifest.arms if names is None or a.name in names])
        return t if wide else t[MEASURED_COLUMNS].round(3)

    def requests_by_arm(self) -> dict[str, list[RequestRecord]]:
        """The measured requests of every arm (the starts that count)."""
        return {name: [r for m in ms for w in m.windows for r in w.requests] for name, ms in self.starts.items()
                if ms}

    def categories(self, names: list[str] | None = None) -> pd.DataFrame:
        """Per workload category of the named arms (default all): tok/s, accept length, break-even, speed-up
        and verdict against the baseline's requests of the same category (filled by `compare`)."""
        return category_table([a for a in self.manifest.arms if names is None or a.name in names])

    def compare(self) -> pd.DataFrame:
        """Figures of every arm run so far, the comparison with the baseline and the drift check; sets the
        record's status (ok, or failed with the reasons). Returns the arms table."""
        from spectrial.protocol.drift import check_drift

        with self._failing(["compare"]), self.record.step("compare"):
            self._summarise(self.params.arms)
            base = add_comparisons(self.manifest.arms, self.requests(), self.params.confidence, self.params.seed,
                                   intervals=self.intervals, greedy=self.params.sampling.greedy,
                                   setting=self.session.setting())
            add_category_comparisons(self.manifest.arms, self.requests(), self.params.confidence, self.params.seed,
                                     base)
            self.manifest.drift = check_drift(self.manifest, self.params.drift_dir or self.params.output_dir,
                                              self.params.drift_tolerance)
        self._write_requests()
        not_run = [a.name for a in self.manifest.arms if a.status in ("pending", "not run")]
        problems = self._problems() + [f"arm {n}: not run" for n in not_run]
        self.record.finish("failed" if problems else "ok", "\n".join(problems) or None)
        return arms_table(self.manifest.arms)

    def result(self) -> TrialResult:
        from spectrial.analysis.serving import requests_frame

        return TrialResult(self.record.dir, self.manifest, requests_frame(self.requests()))

    def close(self) -> None:
        """Close the host connections (idempotent); the record keeps what was measured."""
        if not self.closed:
            self.session.close()
            self.closed = True

    def __enter__(self) -> Trial:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def abandon(self, exc: BaseException) -> None:
        """The run stopped on `exc` outside a step that marked it: the arms not finished and the run say failed
        and why (a record already final is left as it is); the host connections are closed."""
        if self.manifest.status in ("pending", "running"):
            self._fail("trial", f"{self._where()}{describe_exc(exc)}")
            self._stopped(exc)
        self.close()

    # --- internals -----------------------------------------------------------------------------------------
    def requests(self) -> list[RequestRecord]:
        """Every measured request of the starts that count."""
        return [r for ms in self.starts.values() for m in ms for w in m.windows for r in w.requests]

    def _fail(self, key: str, text: str) -> None:
        self.failures.setdefault(key, []).append(text)

    def _problems(self) -> list[str]:
        return list(dict.fromkeys(f"{k}: {t}" for k, texts in self.failures.items() for t in texts))

    @contextlib.contextmanager
    def _failing(self, keys: list[str], active: Callable[[], str | None] | None = None) -> Iterator[None]:
        """Record an exception that escapes a step under `keys` (a re-run of the step clears them) — or only under
        the one `active()` names when it names one (the arm whose start was running: the arms that finished keep
        their ok); the arms not finished and the run are marked failed, and the exception goes on."""
        for k in keys:
            self.failures.pop(k, None)
        try:
            yield
        except BaseException as exc:
            now = active() if active is not None else None
            where = self._where()
            for k in ([now] if now else keys):
                self._fail(k, f"{where}{describe_exc(exc)}")
            self._stopped(exc)
            raise

    def _where(self) -> str:
        """The protocol step that was running (the last recorded step not finished ok), as a prefix."""
        st = next((s for s in reversed(self.manifest.steps) if s.ok is not True), None)
        return f"{st.name}: " if st is not None and st.ok is False else ""

    def _stopped(self, exc: BaseException) -> None:
        """The run stopped on `exc`: the arms not finished (or with fewer starts than planned) and the run are
        marked failed; arms that finished keep their ok."""
        planned = None if self.params.decide is not None else self.params.restarts
        for a in self.manifest.arms:
            done = len([s for s in self.manifest.live_starts(a.name) if s.status == "ok"])
            if a.status in ("pending", "running"):
                a.status, a.reason = "failed", f"trial stopped ({describe_exc(exc)})"
            elif a.status == "ok" and planned is not None and 0 < done < planned:
                a.status, a.reason = "failed", f"stopped after {done} of {planned} starts ({describe_exc(exc)})"
        self.record.finish("failed", "\n".join(self._problems()) or describe_exc(exc), best_effort=True)
        with contextlib.suppress(SpectrialError, OSError):
            self._write_requests()

    def _bandwidth_bound(self) -> BandwidthBound | None:
        """The memory-bandwidth bound of the baseline's decode (issue 39): the weights and KV cache one step reads
        over the memory's bandwidth, at the run's concurrency and the baseline's mean context. None without a
        baseline; a bound with a `note` (and no figure) where it cannot be computed."""
        p, m = self.params, self.manifest
        base = next((a for a in p.arms if not a.speculative), None)
        if base is None:
            return None
        bb = (m.bandwidth or BandwidthBound()).model_copy(update={"concurrency": p.concurrency})
        engine, host = getattr(self.session, "engine", None), getattr(self.session, "host", None)
        gpus = [g.name for g in m.host.gpus.gpus if g.name] if m.host.gpus is not None else []
        if p.bandwidth_gb_s is not None:
            bb.bandwidth_gb_s, bb.bandwidth_source = p.bandwidth_gb_s, "params bandwidth_gb_s"
        elif gpus:
            table = roofline.load_hardware()
            key = roofline.match_gpu(gpus[0], table)
            if key is None:
                bb.note = (f"the GPU ({gpus[0]}) is not in params/hardware.yaml: add its bandwidth there, or set "
                           "bandwidth_gb_s")
                return bb
            n = min(engine.ranks() if engine is not None else 1, len(gpus))
            bb.bandwidth_gb_s = table[key].bandwidth_gb_s * n
            bb.bandwidth_source = f"datasheet: {n} x {table[key].name} ({table[key].bandwidth_gb_s:g} GB/s each)"
        elif bb.host is not None and bb.host.bandwidth_gb_s:
            bb.bandwidth_gb_s, bb.bandwidth_source = bb.host.bandwidth_gb_s, bb.host.how
        else:
            bb.note = "the host's memory bandwidth is unknown" + (f" ({bb.host.error})" if bb.host and bb.host.error
                                                                   else "") + ": set bandwidth_gb_s"
            return bb
        path = (m.engine.models or {}).get("model")
        got = streamed(path) if path and host is not None and host.is_local else None
        info = m.model_info
        if got is not None:
            bb.weights_bytes, bb.kv_bytes_per_token, bb.weights_source = got.weights_bytes, got.kv_bytes_per_token, \
                got.how
        elif bb.weights_bytes is not None:
            pass  # a record read back (a replay): the weights it measured stand
        elif info is not None and info.params_b and info.bits_per_weight:
            bb.weights_bytes = roofline.weight_bytes(info.params_b, info.bits_per_weight, info.active_params_b)
            bb.weights_source = "model_info (params_b x bits_per_weight)"
        else:
            bb.note = ("the model's size is unknown" + (f" (its files are on {host.name})" if host is not None and
                                                        not host.is_local else "") +
                       ": set model_info.params_b and bits_per_weight")
            return bb
        if not gpus and p.bandwidth_gb_s is None and bb.host and bb.host.cache_bytes \
                and bb.weights_bytes <= bb.host.cache_bytes:
            bb.note = (f"the weights ({bb.weights_bytes / 1e6:.1f} MB) fit in the CPU's last-level cache "
                       f"({bb.host.cache_bytes / 2**20:.0f} MiB): decode need not stream them from memory, no bound")
            return bb
        reqs = [r for st in self.starts.get(base.name, []) for w in st.windows for r in w.requests if r.ok]
        if reqs:
            bb.context_tokens = float(np.mean([(r.prompt_len or 0) + r.tokens / 2 for r in reqs]))
        bb.bound_tok_s, bb.bytes_per_step = roofline.bandwidth_bound(
            bb.weights_bytes, bb.bandwidth_gb_s, kv_bytes_per_token=bb.kv_bytes_per_token,
            context_tokens=bb.context_tokens, concurrency=p.concurrency)
        return bb

    def _summarise(self, arms: list[Arm]) -> None:
        """Fill the figures of `arms` from their starts that count."""
        bound = self.manifest.bandwidth = self._bandwidth_bound()
        for arm in arms:
            a = self.manifest.arm(arm.name)
            if a is None:
                continue
            mine = self.manifest.live_starts(arm.name)
            if not mine:
                if a.status == "running":
                    a.status, a.reason = "failed", "never started"
                continue
            a.starts = [StartSummary(restart=s.restart, order=s.order, status=s.status, tok_s=s.tok_s,
                                     ready_s=s.ready_s, reason=s.reason) for s in mine]
            checks = [s.env_check for s in mine if s.env_check]
            if checks:
                a.env_check = checks[-1] if all(c.ok for c in checks) else next(c for c in checks if not c.ok)
            a.config_check = configcheck.over_starts([s.config_check for s in mine if s.config_check])
            a.energy = energy.arm_energy([s.energy for s in mine if s.status == "ok"], self.params.confidence)
            a.fingerprint_changes = sorted({c for s in mine for c in s.fingerprint_changes})
            a.throttled_samples = sum(s.throttled_samples for s in mine)
            failed = [s for s in mine if s.status != "ok"]
            if len(failed) == len(mine):
                a.status = "failed"
                a.reason = "; ".join(str(s.reason) for s in failed) or "never started"
                continue
            measured = self.starts.get(arm.name, [])
            reqs = [r for m in measured for w in m.windows for r in w.requests]
            stats = merge_stats([w.stats for m in measured for w in m.windows])
            p = self.params
            figs = arm_figures(reqs, stats, arm.speculative, p.confidence, p.seed,
                               k=p.arm_steps(arm) if arm.speculative else None, synthetic=arm.synthetic_accept,
                               concurrency=p.concurrency, slo=p.slo.limits(), setting=self.session.setting())
            figs.categories = category_figures(reqs, arm.speculative, p.confidence, p.seed,
                                               windows=[(w.plan.category, w.stats) for m in measured
                                                        for w in m.windows if w.plan.category])
            if a.config_check is not None:
                figs.validity = validity.with_check(figs.validity, validity.resolved_config(a.config_check))
            figs.validity = validity.with_check(figs.validity, validity.bandwidth_bound(figs, arm.speculative, bound))
            if bound is not None and not arm.speculative and figs.tok_s and bound.bound_tok_s:
                bound.baseline_share = figs.tok_s / bound.bound_tok_s
            a = with_figures(a, figs)
            a.status = "ok" if a.tok_s else "failed"
            a.reason = ("; ".join(f"start {s.restart + 1}: {s.reason}" for s in failed) or None) \
                if a.status == "ok" else "no successful request"
            self._put(a)
        self.record.save()

    def _put(self, arm: ArmRecord) -> None:
        """Replace the arm of the same name in the record."""
        arms = self.manifest.arms
        arms[next(i for i, a in enumerate(arms) if a.name == arm.name)] = arm

    def _write_requests(self) -> None:
        """requests.csv (with how each stream was delivered) and stream.csv (every token event)."""
        from spectrial.analysis.serving import write_requests

        write_requests(self.record, self.requests(), {a.name: a.accept_len for a in self.manifest.arms})

    # --- all in one ----------------------------------------------------------------------------------------
    def run(self, raise_on_failure: bool = True) -> TrialResult:
        """Every step in one call: kill, verify free, fingerprint, all arms in `order`, compare."""
        try:
            self.kill_old_server()
            self.verify_gpus_free()
            self.run_arms()
            self.compare()
        except BaseException as exc:  # between the steps too (a Ctrl-C lands anywhere): never left "running"
            self.abandon(exc)
            raise
        finally:
            self.close()
        result = self.result()
        if self.manifest.status != "ok" and raise_on_failure:
            raise RunFailed(f"trial {self.record.run_id} failed (record: {self.record.dir}):\n"
                            f"{self.manifest.reason}", result)
        return result


def describe_exc(exc: BaseException) -> str:
    from spectrial import interrupts

    return interrupts.describe(exc)


def _moved(found: Any, rate: float | None, tolerance: float) -> str | None:
    """Why this host's history no longer describes it: the first baseline start of a decide run outside the band of
    the earlier baselines (spectrial.protocol.drift's band for one start); None when it is inside (or nothing to judge)."""
    import math

    from spectrial.protocol.drift import prediction_band

    values = [v for b in (found.baselines if found is not None else []) for v in b.start_medians]
    if not values or not rate:
        return None
    center, half, _, basis = prediction_band(values, 1, tolerance, len(found.baselines))
    if abs(math.log(rate) - center) <= half:
        return None
    return (f"this run's first baseline start ({rate:.1f} tok/s) lies outside the band of the earlier baselines "
            f"({math.exp(center - half):.1f}-{math.exp(center + half):.1f} tok/s: {basis}); the host changed")


def _basis(method: str) -> str:
    return "group-sequential repeated intervals" if method == "group-sequential" else "confidence sequence"


def _duration(secs: float) -> str:
    return f"{secs:.0f} s" if secs < 120 else f"{secs / 60:.0f} min" if secs < 7200 else f"{secs / 3600:.1f} h"


def _sequence_verdict(status: str, margin: float | None) -> str:
    """A confidence sequence's status as a verdict (the words of `figures.verdict_of`)."""
    from spectrial.analysis.figures import NOT_DISTINGUISHABLE

    if status in ("faster", "slower"):
        return status
    if status == "equivalent":
        return f"equivalent within ±{margin:.0%}"
    if status == "inconsistent":
        return "inconsistent: no constant speed-up fits every round (it drifted during the run)"
    return NOT_DISTINGUISHABLE


def run_trial(params: TrialParams | str | Path, overrides: dict[str, Any] | None = None, *,
              run_id: str | None = None, progress: bool = True, raise_on_failure: bool = True) -> TrialResult:
    """Run the whole protocol for `params` (a TrialParams or a YAML path plus dotted overrides)."""
    with opened(lambda: Trial(params, overrides, run_id=run_id, progress=progress)) as trial:
        return trial.run(raise_on_failure)
