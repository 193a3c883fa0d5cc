"""Fan a trial or a sweep out over parallel units, and merge them back (`cluster:` in the params).

    trial   the speculative arms are spread over `units` blocks (round-robin); each block runs with every
            baseline arm, interleaved, on its own host: an ordinary trial (`spectrial trial`) there. More units
            than speculative arms replicate arms on other units (their speed-ups are pooled per fingerprint key).
    grid    the settings are spread over the units the same way; each unit is an ordinary grid sweep of its
            settings with its own baseline (every concurrency level on each start, as on one host).
    guided  the guided search (`spectrial.sweep.guided.decide`, unchanged) asked again whenever a unit is free:
            each answer (its probes, or the one setting that could beat the best) is one unit with a baseline;
            the search reads the points of every finished unit; a setting in flight counts as tried.

The loop submits up to `max_parallel` units, polls them, cancels one stuck pending (Slurm's reason quoted) or
over the pool's time limit, and on `on_unit_failure: stop` cancels the rest. Any interrupt (Ctrl-C, SIGTERM,
SIGHUP) cancels every unit still queued or running, waits for each to stop its servers and write its record,
and leaves the merged record `failed` and why. The merged record (kind `cluster-trial` / `cluster-sweep`)
holds each unit (job, host, state, Slurm's reason), the comparisons of every unit against its own baseline,
the pooled speed-ups per fingerprint key, and what is missing.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from typing import Any, Literal

import yaml

from spectrial import interrupts
from spectrial.cluster.executor import Executor, JobState, UnitJob
from spectrial.cluster.merge import pool_speedups, sweep_best, sweep_points, unit_comparisons
from spectrial.errors import ConfigError
from spectrial.hosts.connect import get_host
from spectrial.params import Arm, TrialParams
from spectrial.params.cluster import ClusterParams, blocks
from spectrial.record.store import RunRecord, list_runs, load_record, opened, settle_record
from spectrial.schema import ClusterRecord, Manifest, SweepDecision, UnitRecord, utc_now
from spectrial.secrets import secret_values
from spectrial.servers.lifecycle import stop_previous
from spectrial.sweep.params import flat_params

Kind = Literal["trial", "sweep"]
FAILED_STATES = {"CANCELLED": "cancelled", "TIMEOUT": "timeout", "NODE_FAIL": "node_fail", "FAILED": "failed",
                 "OUT_OF_MEMORY": "failed", "PREEMPTED": "cancelled", "BOOT_FAIL": "node_fail",
                 "DEADLINE": "timeout"}


def make_executor(cluster: ClusterParams, port: int, stop_grace_s: float) -> Executor:
    if cluster.executor == "slurm":
        from spectrial.cluster.slurm import SlurmExecutor

        return SlurmExecutor(cluster)
    from spectrial.cluster.pool import PoolExecutor

    return PoolExecutor(cluster, port, stop_grace_s)


def unit_hosts(t: TrialParams) -> list[dict[str, str | None]]:
    """A Slurm unit's `hosts:`: the head is the batch step's node (`local`); the other nodes are `srun:NODE`
    (given, or the allocation's with nodes_per_unit 2+, filled by the batch script). SSH around the scheduler is
    refused."""
    if not t.hosts:
        return []
    others = [n for n in t.hosts[1:] if not n.host.startswith("srun:")]
    if others or t.hosts[0].host != "local":
        raise ConfigError(f"hosts: on Slurm a unit's head is its batch node ('local') and the other nodes are "
                          f"nodes of its allocation: 'srun:NODE', or leave hosts out and set "
                          f"cluster.slurm.nodes_per_unit; got {[n.host for n in t.hosts]}", parameter="hosts")
    return [n.model_dump(mode="json") for n in t.hosts]


def start_estimate_s(params: TrialParams, most: int = 50) -> float | None:
    """What one server start took here before: the median start of the latest records in `output_dir` of the
    same engine and model (None without any)."""
    took = []
    for run in list_runs(params.output_dir)[-most:]:
        with contextlib.suppress(Exception):
            m = load_record(run, settle=False)
            if m.params.engine == params.engine and m.params.model == params.model:
                took += [s.elapsed_s for s in m.live_starts() if s.status == "ok" and s.elapsed_s]
    return statistics.median(took) if took else None


class ClusterRun:
    """One trial or sweep as parallel units, and the merged record."""

    def __init__(self, kind: Kind, params: Any, record: RunRecord, executor: Executor, progress: bool = True) -> None:
        self.kind = kind
        self.params = params  # TrialParams or SweepParams
        self.trial: TrialParams = params if kind == "trial" else params.trial_params()
        assert self.trial.cluster is not None
        self.cluster: ClusterParams = self.trial.cluster
        self.record, self.executor, self.progress = record, executor, progress
        self.units_dir = record.dir / "units"
        self.jobs: dict[str, tuple[UnitJob, str]] = {}  # unit name -> (job, handle) once submitted
        self.queue: list[UnitJob] = []
        self.pending_since: dict[str, float] = {}
        self.manifests: dict[str, Manifest] = {}
        self.notes: list[str] = []
        self.stopped: str | None = None
        self.t0 = time.monotonic()
        self.kill_wait: float | None = None
        record.manifest.cluster = ClusterRecord(executor=executor.name, max_parallel=executor.slots)
        record.add_secrets(secret_values(self.trial.env))
        record.save()

    # --- units ---------------------------------------------------------------------------------------------
    @property
    def units(self) -> list[UnitRecord]:
        assert self.record.manifest.cluster is not None
        return self.record.manifest.cluster.units

    def unit(self, name: str) -> UnitRecord:
        return next(u for u in self.units if u.name == name)

    def add_unit(self, arms: list[str], round_: int = 0) -> UnitJob:
        """Write the unit's params (an ordinary trial or sweep, `host: local` on a Slurm node, no `cluster:`) and
        queue it."""
        i = len(self.units)
        name = f"u{i}"
        run_id = f"{self.record.run_id}-{name}"
        data = self._unit_params(arms, i)
        path = self.units_dir / f"{run_id}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        job = UnitJob(name=name, run_id=run_id, kind=self.kind, params_path=path, output_dir=self.units_dir,
                      log_path=self.units_dir / f"{run_id}.log", arms=arms, host=str(data.get("host", "local")),
                      port=int(data.get("port", 0)), round=round_, env={"SPECTRIAL_UNIT": name})
        self.units.append(UnitRecord(name=name, run_id=run_id, kind=self.kind, arms=arms, round=round_,
                                     executor=self.executor.name, port=job.port,
                                     partition=self.cluster.slurm.partition if self.executor.name == "slurm"
                                     else None))
        self.queue.append(job)
        return job

    def _unit_params(self, arms: list[str], index: int) -> dict[str, Any]:
        t = self.trial
        data: dict[str, Any] = t.model_dump(mode="json", exclude={"cluster"})
        data["name"] = f"{t.name}-u{index}"
        data["output_dir"] = str(self.units_dir)
        if self.executor.name == "slurm":  # the node runs its servers; several units may share one node
            data["host"], data["hosts"] = "local", unit_hosts(t)  # the port: one free there (the batch script)
        if self.kill_wait is not None and t.stop_grace_s > self.kill_wait / 2:
            data["stop_grace_s"] = max(1.0, self.kill_wait / 2)  # stopped before Slurm's SIGKILL
        if self.kind == "trial":
            keep = {a.name for a in t.arms if not a.speculative} | set(arms)
            data["arms"] = [a.model_dump(mode="json") for a in t.arms if a.name in keep]
            return data
        sweep = self.params
        by_name = {sweep.arm(s).name: sweep.arm(s) for s in sweep.settings()}
        flat = flat_params(sweep)
        flat.update({k: v for k, v in data.items() if k in ("name", "output_dir", "host", "hosts", "port",
                                                              "stop_grace_s")})
        flat.pop("cluster", None)
        flat["strategy"] = "grid"
        flat["arms"] = [Arm(name="baseline").model_dump(mode="json")] + \
            [by_name[a].model_dump(mode="json") for a in arms]
        flat["grid"] = {"concurrency": sweep.concurrency_levels()}
        flat["budget_s"] = flat["budget_restarts"] = None
        return flat

    # --- the loop ------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Bad input before anything is submitted: the executor's refusal (Slurm's words), a time limit shorter
        than one server start."""
        if self.executor.name == "slurm":
            from spectrial.cluster.slurm import SlurmExecutor

            assert isinstance(self.executor, SlurmExecutor)
            limit = self.cluster.slurm.time_limit_seconds()
            est = start_estimate_s(self.trial)
            if limit < 60:
                raise ConfigError(f"cluster.slurm.time_limit: {self.cluster.slurm.time_limit!r} is under a minute, "
                                  "Slurm's granularity; give at least one server start of every arm",
                                  parameter="cluster.slurm.time_limit")
            if est is not None and limit < est:
                raise ConfigError(f"cluster.slurm.time_limit: {self.cluster.slurm.time_limit!r} ({limit} s) is "
                                  f"shorter than one server start here ({est:.0f} s, the median of earlier "
                                  f"records in {self.trial.output_dir}); raise it", parameter="cluster.slurm.time_limit")
            self.kill_wait = self.executor.kill_wait_s()

    def say(self, text: str) -> None:
        if self.progress:
            print(f"cluster: {text}", file=sys.stderr, flush=True)

    def submit_ready(self) -> None:
        while self.queue and self.running_count() < self.executor.slots and not self.stopped:
            job = self.queue.pop(0)
            handle = self.executor.submit(job)
            self.jobs[job.name] = (job, handle)
            u = self.unit(job.name)
            u.job_id, u.state, u.submitted_at = handle, "pending", utc_now()
            u.host = job.host if self.executor.name == "pool" else None
            u.port = job.port
            self.pending_since[job.name] = time.monotonic()
            self.say(f"unit {job.name} ({', '.join(job.arms)}) submitted: {self.executor.name} {handle}")
        self.record.save()

    def running_count(self) -> int:
        return sum(1 for u in self.units if u.state in ("pending", "running") and u.name in self.jobs)

    def poll_once(self) -> list[str]:
        """Poll every unit in flight; returns the units that ended now."""
        ended = []
        for name, (job, handle) in list(self.jobs.items()):
            u = self.unit(name)
            if u.state not in ("pending", "running"):
                continue
            st = self.executor.poll(handle)
            u.scheduler_state, u.host = st.scheduler_state, st.host or u.host
            if st.phase == "pending":
                u.scheduler_reason = st.reason
                waited = time.monotonic() - self.pending_since[name]
                hopeless = getattr(self.executor, "never_runs", lambda r: False)(st.reason)
                if hopeless or waited > self.cluster.slurm.pending_timeout_s:
                    why = (f"pending {waited:.0f} s, Slurm's reason: {st.reason or '?'}"
                           + (" (it never runs: fix the request)" if hopeless else
                              f" (over cluster.slurm.pending_timeout_s {self.cluster.slurm.pending_timeout_s:.0f} s)"))
                    self.executor.cancel(handle, why)
                    u.state, u.reason = "pending_timeout", why
                    self._ended(job, st)
                    ended.append(name)
                continue
            if st.phase == "running":
                if u.state != "running":
                    self.say(f"unit {name} running on {st.host or '?'}")
                u.state = "running"
                limit = self.cluster.unit_timeout_s
                if limit and (st.elapsed_s or 0) > limit and self.executor.name == "pool":
                    self.executor.cancel(handle, f"over cluster.unit_timeout_s ({limit:.0f} s)")
                continue
            self._ended(job, st)
            ended.append(name)
        self.record.save()
        return ended

    def _ended(self, job: UnitJob, st: JobState) -> None:
        """A unit's job is over: what Slurm (or the pool) says and what its own record says."""
        u = self.unit(job.name)
        u.scheduler_state = st.scheduler_state or u.scheduler_state
        u.exit_code, u.finished_at = st.exit_code, utc_now()
        u.elapsed_s = st.elapsed_s
        if st.reason and not u.scheduler_reason:
            u.scheduler_reason = st.reason
        m = None
        if (job.run_dir / "manifest.json").is_file():
            if st.scheduler_state == "CANCELLED" and st.reason:  # cancelled before it could say so itself (the
                with contextlib.suppress(Exception):  # signal came before its handlers, or SIGKILL after the grace)
                    settle_record(job.run_dir, reason=f"cancelled: {st.reason}")
            with contextlib.suppress(Exception):
                m = load_record(job.run_dir)  # a unit SIGKILLed mid-run is settled: failed, "abandoned"
        left = self._stop_what_it_left(job, st)
        if m is not None:
            self.manifests[job.name] = m
            u.record_status, u.fingerprint_key = m.status, m.fingerprint_key
            u.port = m.params.port if m.params.port is not None else u.port
            if m.controller is not None and m.controller.job is not None and m.controller.job.node:
                u.host = m.controller.job.node
            elif u.host is None and m.controller is not None:
                u.host = m.controller.host
        if u.state == "pending_timeout":
            pass
        elif st.scheduler_state in FAILED_STATES and st.scheduler_state != "FAILED":
            u.state = FAILED_STATES[st.scheduler_state]
            u.reason = (f"Slurm: {st.scheduler_state}" if self.executor.name == "slurm" else st.scheduler_state) + \
                (f" ({st.reason})" if st.reason else "") + (f"; its record: {m.reason.splitlines()[0]}"
                                                            if m is not None and m.reason else "")
            if st.scheduler_state == "NODE_FAIL" and (m is None or m.status in ("running", "pending")):
                u.reason += ("; the node stopped answering while the unit ran: Slurm stops what is left of it "
                             "when the node comes back (its record then says failed and why)")
        elif m is None:
            u.state, u.reason = "failed", (f"no record was written (exit {st.exit_code}; log: {job.log_path})")
        elif m.status in ("ok", "partial") and st.exit_code in (0, 3, None):
            u.state, u.reason = "ok", m.reason if m.status == "partial" else None
        else:
            u.state = "failed"
            u.reason = (m.reason or f"exit {st.exit_code}").splitlines()[0][:500]
        if left:
            u.reason = f"{u.reason}; {left}" if u.reason else left
        self.say(f"unit {u.name} {u.state}" + (f": {u.reason}" if u.reason and u.state != "ok" else ""))
        if u.state != "ok" and self.cluster.on_unit_failure == "stop" and not self.stopped:
            self.stop(f"unit {u.name} {u.state} (on_unit_failure: stop)")

    def _stop_what_it_left(self, job: UnitJob, st: JobState) -> str | None:
        """A pool unit that died by a signal (SIGKILL after its grace, the OOM killer) could not stop its servers,
        which run in their own sessions: the fan-out runs the unit's kill step on its host and port (the recorded
        process group, as the unit's next run would), so that nothing of it outlives the cluster run. Slurm stops
        what a job left itself (its cgroup)."""
        if self.executor.name != "pool" or st.exit_code is None or st.exit_code == 0:
            return None
        # a unit that exited on its own after a failure should have stopped its servers: the kill step still
        # runs (it finds nothing when the unit did), and what it stops is said, so that a unit's miss is visible
        how = f"it died by signal {-st.exit_code}" if st.exit_code < 0 else f"it exited {st.exit_code}"
        t = self.trial
        try:
            host = get_host(job.host, **t.ssh.connect_options())
            report = stop_previous(host, job.port, host.expand(t.state_dir), t.stop_grace_s)
        except Exception as exc:  # refused (another run holds the port) or the host is gone: say so
            return (f"{how} and what it left on {job.host} port {job.port} was not "
                    f"stopped ({str(exc).splitlines()[0][:300]}): `spectrial trial` on that host and port stops it")
        if not report.stopped:
            return None
        return (f"{how}; the fan-out stopped the {len(report.stopped)} server "
                f"process(es) it left on {job.host} port {job.port}")

    def stop(self, why: str) -> None:
        """Cancel every unit queued or in flight (each stops its servers and writes its record)."""
        self.stopped = why
        for job in self.queue:
            u = self.unit(job.name)
            u.state, u.reason = "not run", f"not started: {why}"
        self.queue.clear()
        for name, (_job, handle) in self.jobs.items():
            if self.unit(name).state in ("pending", "running"):
                self.executor.cancel(handle, why)

    def wait_all(self, timeout_s: float | None = None) -> None:
        """Poll until no unit is in flight (and nothing is queued)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        poll_s = self.cluster.slurm.poll_s if self.executor.name == "slurm" else 0.5
        while self.running_count() or (self.queue and not self.stopped):
            self.submit_ready()
            self.poll_once()
            if deadline is not None and time.monotonic() > deadline:
                return
            if self.running_count():
                time.sleep(poll_s)

    # --- the strategies -----------------------------------------------------------------------------------
    def run_blocks(self) -> None:
        """A trial or a grid sweep: every block a unit, all queued at once."""
        if self.kind == "trial":
            spec = [a.name for a in self.trial.arms if a.speculative]
        else:
            spec = [self.params.arm(s).name for s in self.params.settings()]
        if not spec:
            raise ConfigError("arms: a cluster run spreads speculative arms over units; this one has none",
                              parameter="arms")
        jobs = [self.add_unit(b) for b in blocks(spec, self.cluster.n_units())]
        self.notes += self.executor.check(jobs)
        self.wait_all()

    def run_guided(self) -> None:
        """The guided search over units: ask `decide` whenever a unit is free (see the module). Each unit carries
        its own baseline, so a unit bundles up to `cluster.picks_per_unit` of the search's answers (each asked
        with the ones before counted as tried) while more settings are untried than units may run."""
        from spectrial.sweep.guided import Measure, Stop, decide

        sweep = self.params
        decisions = self.record.manifest.decisions
        checked = False
        while True:
            while self.running_count() < self.executor.slots and not self.stopped:
                arms: list[str] = []
                stop: Stop | None = None
                while not arms or len(arms) < self._bundle():
                    step = decide(self.view(set(arms)))
                    if isinstance(step, Stop):
                        stop = step
                        break
                    assert isinstance(step, Measure)
                    for p in step.picks:
                        arms.append(sweep.arm(p.setting).name)
                        decisions.append(SweepDecision(phase=step.phase, setting=sweep.arm(p.setting).name,
                                                       reason=p.reason, score=step.score))
                if not arms:
                    if stop is not None and not self.running_count():
                        decisions.append(SweepDecision(phase="stop", reason=stop.reason))
                    break
                job = self.add_unit(arms, round_=len({u.round for u in self.units}))
                if not checked:
                    self.notes += self.executor.check([job])
                    checked = True
                self.submit_ready()
            if not self.running_count():
                return
            while not self.poll_once() and self.running_count():
                time.sleep(self.cluster.slurm.poll_s if self.executor.name == "slurm" else 0.5)

    def _bundle(self) -> int:
        """Settings one guided unit takes: picks_per_unit while the untried settings outnumber the free units."""
        tried = {a for u in self.units for a in u.arms}
        untried = len(self.params.settings()) - len(tried)
        return self.cluster.picks_per_unit if untried > self.executor.slots else 1

    def view(self, pending: set[str] | None = None) -> Any:
        """The guided search's view of every finished unit, on one scale: each unit's points as if measured beside
        the reference baseline (the first finished unit's): tok/s times (reference baseline tok/s / the unit's
        baseline tok/s), times divided by it, so that the cycle-cost model is fitted to speed-ups and not to which
        host (or moment) a unit had; the settings tried, in flight or `pending` count as tried."""
        from spectrial.sweep.guided import SweepView
        from spectrial.sweep.model import MeasuredPoint, fit_sweep_model

        sweep = self.params
        of = {sweep.arm(s).name: s for s in sweep.settings()}
        measured, base_cycle, ref = [], {}, {}
        for name, m in self.manifests.items():
            if self.unit(name).state != "ok":
                continue
            own = {pt.concurrency: pt for pt in m.points if pt.method == "none" and pt.tok_s}
            for c, b in own.items():
                if c not in ref:
                    ref[c] = b.tok_s or 0.0
                    if b.cycle_ms:
                        base_cycle[c] = b.cycle_ms
            for pt in m.points:
                s = of.get(pt.arm)
                if pt.method == "none" or s is None or not pt.tok_s or pt.concurrency not in own:
                    continue
                r = ref[pt.concurrency] / (own[pt.concurrency].tok_s or ref[pt.concurrency])

                def scaled(x: float | None, f: float) -> float | None:
                    return x * f if x is not None else None

                measured.append(MeasuredPoint(steps=s.steps, topk=s.topk, k=s.k, scenario=s.synthetic_accept,
                                              concurrency=pt.concurrency, tok_s=pt.tok_s * r,
                                              accept_len=pt.accept_len, cycle_ms=scaled(pt.cycle_ms, 1 / r),
                                              draft_ms_per_cycle=scaled(pt.draft_ms_per_cycle, 1 / r),
                                              per_position=tuple(pt.per_position) if pt.per_position else None,
                                              verify_steps=pt.verify_steps, tok_s_ci_low=scaled(pt.tok_s_ci_low, r),
                                              name=pt.arm))
        tried = frozenset(of[a] for u in self.units for a in u.arms if a in of) | \
            frozenset(of[a] for a in (pending or set()) if a in of)
        n_starts = sum(len(m.starts) for m in self.manifests.values())
        return SweepView(sweep=sweep, settings=tuple(sweep.settings()), levels=tuple(sweep.concurrency_levels()),
                         measured=tuple(measured), tried=tried, baseline_cycle_ms=base_cycle, n_starts=n_starts,
                         model=fit_sweep_model(tuple(measured)))

    def execute(self) -> None:
        try:
            self.check()
            if self.kind == "sweep" and self.params.strategy == "guided":
                self.run_guided()
            else:
                self.run_blocks()
        except BaseException as exc:
            self.abandon(exc)
            raise
        finally:
            self.executor.close()
        self.merge()
        missing = self.record.manifest.cluster.missing if self.record.manifest.cluster else []
        measured = any(u.state == "ok" for u in self.units)
        if not measured:
            self.record.finish("failed", "no unit finished: " + "; ".join(
                f"{u.name}: {u.state} ({u.reason})" for u in self.units))
        elif missing:
            self.record.finish("partial", "missing: " + "; ".join(missing))
        else:
            self.record.finish("ok")

    def abandon(self, exc: BaseException) -> None:
        """Stopped by `exc` (an interrupt, an error): cancel every unit, wait for each to stop its servers and
        write its record, merge what finished, and say failed and why."""
        if self.record.manifest.status not in ("pending", "running"):
            return
        why = interrupts.describe(exc)
        with contextlib.suppress(Exception):
            self.stop(why)
            grace = (self.kill_wait or 30.0) + 30.0
            self.wait_all(timeout_s=grace)
            for u in self.units:
                if u.state in ("pending", "running"):
                    u.state, u.reason = "cancelled", f"{why}; still in flight after {grace:.0f} s"
            self.merge()
        self.record.finish("failed", f"cluster run stopped: {why}", best_effort=True)

    # --- the merged record ---------------------------------------------------------------------------------
    def merge(self) -> None:
        c = self.record.manifest.cluster
        assert c is not None
        ok = [(u, self.manifests[u.name]) for u in self.units if u.name in self.manifests]
        c.comparisons = [x for u, m in ok for x in unit_comparisons(u, m)]
        c.pooled = pool_speedups([x for x in c.comparisons if self.unit(x.unit).state == "ok"],
                                 self.trial.confidence)
        groups: dict[str, list[str]] = {}
        for u in self.units:
            if u.fingerprint_key:
                groups.setdefault(u.fingerprint_key, []).append(u.name)
        c.fingerprint_groups, c.comparable = groups, len(groups) <= 1
        measured = {x.arm for x in c.comparisons if x.status == "ok" and self.unit(x.unit).state == "ok"}
        c.missing, said = [], set()
        for u in self.units:
            lost = [a for a in u.arms if a not in measured and a not in said]
            said.update(lost)
            if lost:
                why = f"{u.state}, {u.reason}" if u.state != "ok" and u.reason else u.state
                c.missing.append(f"{', '.join(lost)} (unit {u.name}: {why})")
        c.starts = sum(len(m.live_starts()) for m in self.manifests.values())
        r = self.trial.restarts
        c.one_host_starts = len(self.trial.arms) * r if self.kind == "trial" else (len(self.params.settings()) + 1) * r
        c.wall_s = round(time.monotonic() - self.t0, 2)
        c.unit_s = round(sum(u.elapsed_s or 0 for u in self.units), 2)
        if self.kind == "sweep":
            m = self.record.manifest
            m.points = sweep_points([(u, mm) for u, mm in ok if u.state == "ok"])
            m.best = sweep_best(m.points)
        with contextlib.suppress(Exception):
            self.record.save()


def run_cluster(kind: Kind, params: Any, *, run_id: str | None = None, progress: bool = True) -> Manifest:
    """Run a trial (TrialParams) or sweep (SweepParams) whose params have `cluster:` as parallel units; returns
    the merged record."""
    trial: TrialParams = params if kind == "trial" else params.trial_params()
    assert trial.cluster is not None
    flat = params.model_dump(mode="json") if kind == "trial" else flat_params(params)

    def make() -> ClusterRun:
        record = RunRecord(trial.output_dir, f"{trial.name}-cluster", kind=f"cluster-{kind}", run_id=run_id,
                           params=flat)
        return ClusterRun(kind, params, record, make_executor(trial.cluster, trial.port, trial.stop_grace_s),
                          progress)

    with opened(make) as run:
        run.execute()
        return run.record.manifest
