"""Running a sweep: server starts that each measure every concurrency level, in grid or guided order.

    prepare (engine, models, every arm's argv) -> kill old server -> GPUs free -> fingerprint
    grid:   baseline + every setting, `restarts` starts each, interleaved (trial.schedule)
    guided: baseline + probes (the deepest setting of each scenario of unknown acceptance, a second depth for the
            cycle model, the predicted best of each synthetic rate) -> fit (sweep.model: one cycle model for
            every scenario) -> measure the unmeasured setting that, at the top of the model's error, would hold
            the best measured tok/s outside its CI, then the model's predicted best -> refit -> ... until
            nothing is left that could change the answer beyond the noise, or the budget ends (sweep.guided)
    -> figures per point (trial.arm_figures), speed-up against the baseline of the same host fingerprint and
       concurrency (trial.add_comparisons), best setting per scenario and concurrency against the runner-up
       (analysis.compare_arms at confirm_level), the final model's prediction for every point.

One server start = one setting; inside it, one benchmark window per concurrency level (counters before and
after each window, as a trial scopes an arm). The baseline is measured once per host fingerprint key: if the
fingerprint changes during the sweep, a new baseline is measured before the next setting.
"""

from __future__ import annotations

import math
import secrets as _rnd
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pandas as pd

from spectrial import analysis
from spectrial.bench import load_prompts, run_requests
from spectrial.engines import ArmStats, Engine, get_engine
from spectrial.errors import ConfigError, SpectrialError
from spectrial.fingerprint import compare as fp_compare
from spectrial.fingerprint import engine_identity, file_identity, fingerprint_key, host_fingerprint
from spectrial.gpu import GpuSampler
from spectrial.group import HostGroup
from spectrial.host import Host, get_host
from spectrial.params import Arm, TrialParams
from spectrial.records import RunRecord
from spectrial.secrets import mask_argv, mask_env, secret_values
from spectrial.server import Server, stop_previous
from spectrial.sweep.guided import cv_errors, margin, noise, run_guided
from spectrial.sweep.model import SweepModel, fit_sweep_model, relative_errors
from spectrial.sweep.params import Setting, SweepParams, load_sweep_params
from spectrial.sweep.result import WINDOW_COUNTERS, SweepFailed, SweepResult
from spectrial.trial import add_comparisons, arm_figures, merge_stats, schedule


@dataclass
class _Point:
    """One measured (or planned) grid point: a setting (None for a baseline) at one concurrency level."""

    id: str
    arm: Arm
    setting: Setting | None
    concurrency: int
    requests: list[dict[str, Any]] = field(default_factory=list)
    stats: list[ArmStats] = field(default_factory=list)
    start_orders: list[int] = field(default_factory=list)
    phase: str | None = None
    prediction: dict[str, Any] | None = None
    fingerprint_key: str | None = None
    failed: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return bool(self.figures.get("tok_s"))


def _point_id(arm: Arm, c: int) -> str:
    return f"{arm.name}@c{c}"


class _Sweep:
    """One sweep session: host, engine, record and everything measured so far."""

    def __init__(self, sweep: SweepParams, record: RunRecord, progress: bool) -> None:
        self.sweep, self.record, self.progress = sweep, record, progress
        self.params: TrialParams = sweep.trial_params()
        self.levels = sweep.concurrency_levels()
        self.settings = sweep.settings()
        self.arms: dict[str, Arm] = {a.name: a for a in self.params.arms}
        self.setting_of: dict[str, Setting] = {sweep.arm(s).name: s for s in self.settings}
        self.points: dict[str, _Point] = {}
        for arm in self.params.arms:
            for c in self.levels:
                self.points[_point_id(arm, c)] = _Point(_point_id(arm, c), arm, self.setting_of.get(arm.name), c)
        self.baselines: dict[str, str] = {}  # fingerprint key -> baseline arm name
        self.decisions: list[dict[str, Any]] = []
        self.durations: list[float] = []
        self.t0 = time.monotonic()
        self.stopped_by: str | None = None
        self.failures: list[str] = []
        self.host: Host | None = None
        self.group: HostGroup | None = None
        self.engine: Engine | None = None
        self.prompts: list[dict[str, str]] = []
        self.fp_key = ""
        self.eng_identity: dict[str, Any] = {}

    # --- session ---------------------------------------------------------------------------------------
    def open(self) -> None:
        """The trial's preamble: prepare the engine, kill the old server, GPUs free, fingerprint."""
        p, rec = self.params, self.record
        self.host = get_host(p.host, **p.ssh.connect_options())
        self.group = HostGroup.from_params(p, self.host)
        rec.set(host={"name": self.host.name})
        self.engine = get_engine(p.engine, p, self.host)
        with rec.step("prepare"):
            rec.manifest["engine"] = {"name": p.engine, **self.engine.prepare()}
            if self.group.workers:
                rec.manifest["nodes"] = self.group.prepare(self.engine)
            rec.manifest["engine"].update(self.engine.version())
            rec.manifest["launch"] = [self._arm_entry(a) for a in p.arms]
        self.prompts = load_prompts(p.prompts)
        with rec.step("kill_old_server") as st:
            st["report"] = stop_previous(self.host, p.port, self.host.expand(p.state_dir), p.stop_grace_s)
            if self.group.workers:
                st["nodes"] = self.group.stop_previous(self.engine, p)
        with rec.step("verify_gpus_free") as st:
            gs, node_gpus = self.group.wait_gpus_free(p)
            if node_gpus:
                st["nodes"] = node_gpus
            st["gpus"] = gs.as_dict()
        with rec.step("fingerprint"):
            fp, node_fps = self.group.fingerprints()
            if node_fps:
                rec.manifest["node_fingerprints"] = node_fps
            eng = rec.manifest["engine"]
            eng.update(engine_identity(self.host, eng.get("binary"), {}))
            models = (eng.get("models") or {}).values()
            rec.manifest["models"] = [file_identity(self.host, m) for m in dict.fromkeys(models) if m.startswith("/")]
            rec.manifest["host"].update(fingerprint=fp, gpus=gs.as_dict())
            self.eng_identity = eng
            self.fp_key = fingerprint_key(fp, eng)
            rec.manifest["fingerprint_key"] = self.fp_key
        rec.manifest["prepare_s"] = round(time.monotonic() - self.t0, 2)
        self.t0 = time.monotonic()  # budget_s and wall_s count from here: builds and model writes are not sweeping

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        if self.host is not None:
            self.host.close()

    def _arm_entry(self, arm: Arm) -> dict[str, Any]:
        assert self.engine is not None
        spec = self.engine.launch_spec(arm)
        s = self.setting_of.get(arm.name)
        return {"arm": arm.name, "method": arm.method, **(s.as_dict() if s else {}),
                "argv": mask_argv(spec.argv), "env": mask_env(spec.env)}

    # --- budget ----------------------------------------------------------------------------------------
    @property
    def n_starts(self) -> int:
        return len(self.record.manifest["starts"])

    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def budget_stop(self, n: int = 1) -> str | None:
        """Why `n` more server starts may not begin (None when they may)."""
        b = self.sweep
        if b.budget_restarts is not None and self.n_starts + n > b.budget_restarts:
            return f"restart budget: {self.n_starts} of {b.budget_restarts} server starts used"
        if b.budget_s is not None:
            est = statistics.mean(self.durations) * n if self.durations else 0.0
            if self.elapsed_s() + est > b.budget_s:
                return (f"time budget: {self.elapsed_s():.0f} s used of {b.budget_s:.0f} s, and a start takes "
                        f"~{est / n:.0f} s")
        return None

    # --- measuring -------------------------------------------------------------------------------------
    def measure(self, arms: list[Arm], phase: str) -> bool:
        """`restarts` starts of each arm (interleaved as `order` says); False when the budget stopped it."""
        p = self.params
        for arm, restart in schedule(arms, p.restarts, p.order, p.seed + self.n_starts):
            if arm.speculative and self.fp_key not in self.baselines \
                    and not self._measure_baseline("baseline (new host fingerprint)"):
                return False
            why = self.budget_stop()
            if why:
                self.stopped_by = why
                return False
            self._one_start(arm, restart, phase if arm.speculative else "baseline")
        return True

    def _measure_baseline(self, phase: str) -> bool:
        name = "baseline" if not self.baselines else f"baseline-{len(self.baselines) + 1}"
        if name not in self.arms:
            arm = Arm(name=name)
            self.arms[name] = arm
            for c in self.levels:
                self.points[_point_id(arm, c)] = _Point(_point_id(arm, c), arm, None, c)
        self.baselines[self.fp_key] = name
        self.decisions.append({"phase": phase, "setting": name, "reason": f"baseline of host fingerprint "
                                                                          f"{self.fp_key}"})
        return self.measure([self.arms[name]], phase)

    def _one_start(self, arm: Arm, restart: int, phase: str) -> None:
        t = time.monotonic()
        try:
            entry = self._start(arm, restart, phase)
            if entry["status"] != "ok":
                self.failures.append(f"{arm.name} start {restart + 1}: {entry.get('reason')}")
        except (KeyboardInterrupt, ConfigError):
            raise
        except SpectrialError as exc:
            self.failures.append(f"{arm.name} start {restart + 1}: {exc}")
            for c in self.levels:
                pt = self.points[_point_id(arm, c)]
                if not pt.requests:
                    pt.failed = str(exc).splitlines()[0][:300]
        self.durations.append(time.monotonic() - t)
        for c in self.levels:
            self._refresh(self.points[_point_id(arm, c)])
        self._check_fingerprint()

    def _start(self, arm: Arm, restart: int, phase: str) -> dict[str, Any]:
        """Launch, verify, benchmark every concurrency level, stop: one server start of `arm`."""
        assert self.engine is not None and self.host is not None
        p, rec, host, engine = self.params, self.record, self.host, self.engine
        spec = engine.launch_spec(arm)
        rec.secrets = sorted(set(rec.secrets) | set(secret_values(spec.env, spec.argv)))
        label = arm.name if p.restarts == 1 else f"{arm.name}#{restart + 1}"
        entry: dict[str, Any] = {"arm": arm.name, "restart": restart, "order": self.n_starts, "phase": phase,
                                 "status": "running", "reason": None, "fingerprint_key": self.fp_key, "windows": []}
        rec.manifest["starts"].append(entry)
        work = f"{host.expand(p.work_dir)}/{rec.run_id}"
        server = Server(host, spec, work_dir=work, state_dir=host.expand(p.state_dir),
                        tag=f"{rec.run_id}:{arm.name}:{restart}:{_rnd.token_hex(3)}", grace_s=p.stop_grace_s,
                        run_id=rec.run_id, arm=arm.name)
        server.spec.name = f"{spec.name}-{restart + 1}" if p.restarts > 1 else spec.name
        server.log_path = f"{work}/{server.spec.name}.log"
        server.exit_path = f"{work}/{server.spec.name}.exit"
        if self.group is not None:
            self.group.attach(server, engine, arm, p)
        fp_before = host_fingerprint(host)
        samples: list[dict[str, Any]] = []
        tags = {"arm": arm.name, "restart": restart, "phase": phase}
        t0 = time.monotonic()
        try:
            with rec.step(f"launch:{label}", **tags):
                server.start()
            with server:
                with rec.step(f"ready:{label}", **tags):
                    entry["ready_s"] = server.wait_ready(p.ready_timeout_s, progress=self.progress)
                with rec.step(f"env_check:{label}", **tags):
                    check = server.verify_env()
                    entry["env_check"] = {"ok": check.ok, "summary": check.summary(), "problems": check.missing}
                    if not check.ok and spec.env and p.env_check == "fail":
                        raise ConfigError(f"env_check: requested variables did not reach the server of {arm.name}: "
                                          f"{check.summary()} (set env_check: warn to continue)")
                sampler = GpuSampler(host, f"{work}/{server.spec.name}.gpu.csv", p.sample_gpu_ms)
                with rec.step(f"benchmark:{label}", **tags), sampler:
                    try:
                        self._windows(server, arm, restart, entry, label)
                    except httpx.HTTPError as exc:
                        raise server.lost(exc) from exc
                    samples = sampler.stop()
                with rec.step(f"stop:{label}", **tags) as st:
                    st["report"] = server.stop()
            ok = any(w.get("requests_ok") for w in entry["windows"])
            entry["status"] = "ok" if ok else "failed"
            if not ok:
                entry["reason"] = "no successful request in any window"
        except BaseException as exc:
            entry["status"] = "failed"
            entry["reason"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            entry["elapsed_s"] = round(time.monotonic() - t0, 3)
            entry["server"] = server.info()
            entry["fingerprint_changes"] = fp_compare(fp_before, host_fingerprint(host))
            entry["throttled_samples"] = sum(1 for s in samples if s.get("throttle"))
            if samples:
                (rec.dir / "gpu").mkdir(exist_ok=True)
                pd.DataFrame(samples).to_csv(rec.add_file(f"gpu/{server.spec.name}.csv"), index=False)
            try:
                rec.write_text(f"logs/{server.spec.name}.log", host.read_text(server.log_path))
            except Exception as exc:  # noqa: BLE001 - a log that never got written is itself a finding
                entry.setdefault("notes", []).append(f"server log not fetched: {exc}")
            for name, text in server.extra_logs().items():
                rec.write_text(f"logs/{name}", text)
            rec.save()
        return entry

    def _windows(self, server: Server, arm: Arm, restart: int, entry: dict[str, Any], label: str) -> None:
        """Warm up once, then one scoped benchmark window per concurrency level."""
        assert self.engine is not None and self.host is not None
        p, engine = self.params, self.engine
        base = {"max_tokens": p.max_tokens, "payload": engine.completion_payload, "stats_fn": engine.request_stats,
                "timeout_s": p.request_timeout_s, "progress": self.progress}
        if p.warmup:
            run_requests(server.base_url, self.prompts, n=p.warmup, phase="warmup", concurrency=1,
                         seed=p.seed + 1000 + restart, label=label, **base)
        for c in self.levels:
            n = c * math.ceil(p.repeats / c)
            with httpx.Client(timeout=10) as client:
                before = engine.snapshot(client, server.base_url)
                before["_log_lines"] = float(_line_count(self.host, server.log_path))
                reqs = run_requests(server.base_url, self.prompts, n=n, concurrency=c,
                                    seed=p.seed + 100 * restart + c, label=f"{label} c{c}", **base)
                after = engine.snapshot(client, server.base_url)
            stats = engine.window_stats(before, after, reqs, self.host.read_text(server.log_path))
            self.add_window(self.points[_point_id(arm, c)], entry, restart, reqs, stats)

    def add_window(self, pt: _Point, entry: dict[str, Any], restart: int, reqs: list[dict[str, Any]],
                   stats: ArmStats) -> None:
        """File one benchmark window under its point and its start entry."""
        for r in reqs:
            r.update(arm=pt.id, restart=restart, concurrency=pt.concurrency, start=entry["order"])
        ok = [r for r in reqs if not r.get("error")]
        rates = [r.get("server_predicted_per_second") or r.get("client_tok_s") for r in ok]
        rates = [x for x in rates if x]
        entry["windows"].append({"concurrency": pt.concurrency, "requests": len(reqs), "requests_ok": len(ok),
                                 "tok_s": statistics.median(rates) if rates else None,
                                 "counters": {k: getattr(stats, k) for k in WINDOW_COUNTERS},
                                 "per_position": stats.per_position, "accept_len": stats.accept_len,
                                 "stats_source": stats.source, "stats_scoped": stats.scoped})
        pt.requests += reqs
        pt.stats.append(stats)
        pt.start_orders.append(entry["order"])
        pt.phase = pt.phase or entry["phase"]
        pt.fingerprint_key = pt.fingerprint_key or entry["fingerprint_key"]

    def _refresh(self, pt: _Point) -> None:
        if not pt.requests:
            return
        figs = arm_figures(pt.requests, merge_stats(pt.stats), pt.arm.speculative, self.params.confidence,
                           self.params.seed)
        pt.figures = figs
        if not figs.get("tok_s"):
            pt.failed = pt.failed or "no successful request"

    def _check_fingerprint(self) -> None:
        """A changed host fingerprint gets its own baseline before the next setting is measured."""
        assert self.host is not None
        last = self.record.manifest["starts"][-1] if self.record.manifest["starts"] else {}
        stable = [c for c in last.get("fingerprint_changes") or [] if "throttling" not in c]
        if not stable:
            return
        key = fingerprint_key(host_fingerprint(self.host), self.eng_identity)
        if key != self.fp_key:
            self.decisions.append({"phase": "fingerprint", "setting": None,
                                   "reason": f"host fingerprint changed ({'; '.join(stable[:3])}): {self.fp_key} -> "
                                             f"{key}; the next setting gets a new baseline"})
            self.fp_key = key

    # --- what the model sees ---------------------------------------------------------------------------
    def model_points(self) -> list[dict[str, Any]]:
        out = []
        for pt in self.points.values():
            if pt.setting is None or not pt.measured:
                continue
            f, s = pt.figures, pt.setting
            out.append({"steps": s.steps, "topk": s.topk, "k": s.k, "scenario": s.synthetic_accept,
                        "concurrency": pt.concurrency, "tok_s": f.get("tok_s"), "accept_len": f.get("accept_len"),
                        "cycle_ms": f.get("cycle_ms"), "draft_ms_per_cycle": f.get("draft_ms_per_cycle"),
                        "per_position": f.get("per_position"), "verify_steps": f.get("verify_steps")})
        return out

    def point(self, arm: Arm, c: int) -> _Point:
        return self.points[_point_id(arm, c)]

    def best_measured(self, scenario: float | None, c: int) -> _Point | None:
        pts = [pt for pt in self.points.values() if pt.setting is not None and pt.measured
               and pt.setting.synthetic_accept == scenario and pt.concurrency == c]
        return max(pts, key=lambda pt: pt.figures["tok_s"]) if pts else None

    def tried(self, s: Setting) -> bool:
        return any(pt.requests or pt.failed for pt in self.points.values() if pt.setting == s)

    # --- strategies ------------------------------------------------------------------------------------
    def run_grid(self) -> None:
        plan = [self.arms["baseline"], *(self.sweep.arm(s) for s in self.settings)]
        self.decisions.append({"phase": "grid", "setting": None,
                               "reason": f"measure all {len(self.settings)} settings and the baseline, "
                                         f"{self.params.restarts} start(s) each, order {self.params.order}"})
        self.baselines[self.fp_key] = "baseline"
        self.measure(plan, "grid")

    def run_guided(self) -> None:
        run_guided(self)

    def margin(self, model: SweepModel) -> float:
        return margin(self, model)

    # --- summary ---------------------------------------------------------------------------------------
    def summarise(self) -> None:
        rec, p = self.record, self.params
        model = fit_sweep_model(self.model_points())
        points: list[dict[str, Any]] = []
        for pt in self.points.values():
            s = pt.setting
            d: dict[str, Any] = {"id": pt.id, "name": pt.id, "arm": pt.arm.name, "setting": pt.arm.name,
                                 "method": pt.arm.method, "concurrency": pt.concurrency,
                                 "scenario": s.synthetic_accept if s else None, **(s.as_dict() if s else
                                 {"steps": None, "topk": None, "draft_tokens": None, "synthetic_accept": None}),
                                 "synthetic": bool(s and s.synthetic_accept is not None),
                                 "k": s.k if s else 0, "phase": pt.phase, "start_orders": pt.start_orders,
                                 "fingerprint_key": pt.fingerprint_key, "prediction": pt.prediction}
            if pt.measured:
                d.update(pt.figures, status="ok", reason=None)
            elif pt.failed or pt.requests:
                d.update(pt.figures, status="failed", reason=pt.failed or "no successful request")
            else:
                d.update(status="not measured", reason=self._why_unmeasured(pt))
            if s is not None:
                pred = model.predict(s.steps, s.topk, s.k, s.synthetic_accept, pt.concurrency)
                d["final_prediction"] = pred
                if pt.prediction and d.get("tok_s"):
                    d["prediction_error"] = pt.prediction["tok_s"] / d["tok_s"] - 1.0
            points.append(d)
        self._compare_with_baselines(points)
        rec.manifest["points"] = points
        rec.manifest["arms"] = [d for d in points if d["status"] != "not measured"]
        rec.manifest["model"] = model.as_dict()
        errs = relative_errors(model, self.model_points())
        rec.manifest["model"]["margin"] = self.margin(model)
        rec.manifest["model"]["noise"] = {str(c): noise(self, c) for c in self.levels}
        cv = [abs(e) for e in cv_errors(self.model_points())]
        rec.manifest["model"]["cv_rel_error"] = {"median_abs": statistics.median(cv) if cv else None,
                                                 "max_abs": max(cv) if cv else None, "n": len(cv)}
        rec.manifest["model"]["in_sample_rel_error"] = {"median_abs": statistics.median(map(abs, errs)) if errs
                                                        else None, "max_abs": max(map(abs, errs)) if errs else None}
        rec.manifest["best"] = self._best(points)
        rec.manifest["decisions"] = self.decisions
        rec.manifest["baselines"] = {k: v for k, v in self.baselines.items()}
        rec.manifest["budget"] = {"budget_s": self.sweep.budget_s, "budget_restarts": self.sweep.budget_restarts,
                                  "wall_s": round(self.elapsed_s(), 2), "restarts": self.n_starts,
                                  "grid_restarts": (1 + len(self.settings)) * p.restarts,
                                  "settings_measured": sum(1 for s in self.settings if self.tried(s)),
                                  "settings": len(self.settings), "stopped_by": self.stopped_by}
        rec.save()

    def _why_unmeasured(self, pt: _Point) -> str:
        if self.sweep.strategy == "guided" and self.stopped_by and self.stopped_by.startswith("confirmed"):
            return ("not needed: even at the top of its predicted range, the best measured setting would lie "
                    "within its CI")
        return f"not measured: {self.stopped_by}" if self.stopped_by else "not measured"

    def _compare_with_baselines(self, points: list[dict[str, Any]]) -> None:
        by_id = {d["id"]: d for d in points}
        for c in self.levels:
            for key, base_name in self.baselines.items():
                base = by_id.get(_point_id(self.arms[base_name], c))
                mine = [d for d in points if d["concurrency"] == c and d["status"] == "ok" and d["method"] != "none"
                        and (d["fingerprint_key"] == key or len(self.baselines) == 1)]
                if base is None or base["status"] != "ok":
                    continue
                reqs = [r for pt in (base, *mine) for r in self.points[pt["id"]].requests if r.get("tok_s")]
                add_comparisons([base, *mine], reqs, self.params.confidence, self.params.seed)
                for d in mine:
                    d["baseline"] = base["id"]

    def _best(self, points: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for scenario in self.sweep.scenarios():
            for c in self.levels:
                mine = sorted((d for d in points if d["method"] != "none" and d["status"] == "ok"
                               and d["scenario"] == scenario and d["concurrency"] == c),
                              key=lambda d: -d["tok_s"])
                if not mine:
                    out.append({"scenario": scenario, "concurrency": c, "best": None,
                                "verdict": "no setting measured"})
                    continue
                b = mine[0]
                row = {"scenario": scenario, "concurrency": c, "best": b["setting"], "steps": b["steps"],
                       "topk": b["topk"], "draft_tokens": b["draft_tokens"], "tok_s": b["tok_s"],
                       "tok_s_ci_low": b.get("tok_s_ci_low"), "tok_s_ci_high": b.get("tok_s_ci_high"),
                       "speedup": b.get("speedup"), "speedup_ci_low": b.get("speedup_ci_low"),
                       "speedup_ci_high": b.get("speedup_ci_high"), "vs_baseline": b.get("verdict"),
                       "measured_settings": len(mine), "runner_up": None, "ratio_to_runner_up": None,
                       "ratio_ci_low": None, "ratio_ci_high": None}
                if len(mine) > 1:
                    r = mine[1]
                    cmp = self._compare(b["id"], r["id"])
                    row.update(runner_up=r["setting"], runner_up_tok_s=r["tok_s"])
                    if cmp is not None:
                        row.update(ratio_to_runner_up=cmp.ratio, ratio_ci_low=cmp.ci_low, ratio_ci_high=cmp.ci_high,
                                   confirm_level=cmp.level,
                                   verdict="confirmed: faster than the runner-up" if cmp.verdict == "faster" else
                                   f"tied with {r['setting']} within the noise ({cmp.verdict})")
                    else:
                        row["verdict"] = "too few requests to compare with the runner-up"
                else:
                    row["verdict"] = "only setting measured at this concurrency"
                out.append(row)
        return out

    def _compare(self, a: str, b: str) -> analysis.Comparison | None:
        def frame(pid: str) -> pd.DataFrame:
            rows = [{"restart": r.get("restart", 0), "tok_s": r["tok_s"]} for r in self.points[pid].requests
                    if r.get("tok_s")]
            return pd.DataFrame(rows, columns=["restart", "tok_s"])

        fa, fb = frame(a), frame(b)
        if len(fa) < 2 or len(fb) < 2:
            return None
        lvl, seed = self.sweep.confirm_level, self.params.seed
        if fa["restart"].nunique() > 1 and fb["restart"].nunique() > 1:
            return analysis.compare_arms(fa, fb, level=lvl, seed=seed, group_col="restart", value_col="tok_s")
        return analysis.compare_arms(fa["tok_s"].to_numpy(), fb["tok_s"].to_numpy(), level=lvl, seed=seed)

    def all_requests(self) -> list[dict[str, Any]]:
        return [r for pt in self.points.values() for r in pt.requests]


def _line_count(host: Host, path: str) -> int:
    """Lines of the server log so far, counted over the whole file (`Server.log_tail` reads only its last
    64 KiB): the window's statistics lines are those after them (spectrial.logs numbers lines from 1)."""
    try:
        return len(host.read_text(path).splitlines())
    except Exception:  # noqa: BLE001 - no log yet: every line is inside the window
        return 0


def run_sweep(params: SweepParams | str | Path, overrides: dict[str, Any] | None = None, *,
              run_id: str | None = None, progress: bool = True, raise_on_failure: bool = True) -> SweepResult:
    """Run a sweep (`params`: SweepParams or a YAML path plus dotted overrides) and write its run record."""
    if not isinstance(params, SweepParams):
        params = load_sweep_params(params, overrides)
    elif overrides:
        params = load_sweep_params(data=_as_data(params), overrides=overrides)
    record = new_record(params, run_id)
    return execute(_Sweep(params, record, progress), raise_on_failure)


def new_record(params: SweepParams, run_id: str | None = None, kind: str = "sweep",
               output_dir: str | Path | None = None) -> RunRecord:
    """The run record of a sweep, with the grid as planned."""
    record = RunRecord(output_dir or params.trial.output_dir, f"{params.trial.name}-{params.strategy}", kind=kind,
                       run_id=run_id, params=flat_params(params))
    record.manifest.update(starts=[], strategy=params.strategy,
                           grid={"settings": [s.as_dict() | {"arm": params.arm(s).name} for s in params.settings()],
                                 "concurrency": params.concurrency_levels(), "scenarios": params.scenarios(),
                                 "restart_fields": ["steps", "topk", "draft_tokens", "synthetic_accept"],
                                 "per_request_fields": ["concurrency"]})
    record.secrets = secret_values(params.trial.env)
    return record


def execute(sw: _Sweep, raise_on_failure: bool = True, drift: bool = True) -> SweepResult:
    """Open the session, run the strategy, summarise, finish the record (failed, with the reason, on errors)."""
    record, params = sw.record, sw.sweep
    try:
        sw.open()
        if params.strategy == "grid":
            sw.run_grid()
        else:
            sw.run_guided()
        with record.step("summarise"):
            sw.summarise()
            if drift:
                from spectrial.drift import check_drift

                record.manifest["drift"] = check_drift(record.manifest,
                                                       params.trial.drift_dir or params.trial.output_dir,
                                                       params.trial.drift_tolerance)
    except BaseException as exc:
        sw.failures.append(f"{type(exc).__name__}: {exc}")
        try:
            sw.summarise()
        except Exception as inner:  # noqa: BLE001 - the original error is the one to report
            sw.failures.append(f"summary failed too: {inner}")
        record.finish("failed", "\n".join(dict.fromkeys(sw.failures)))
        _write_requests(record, sw.all_requests())
        raise
    finally:
        sw.close()
    _write_requests(record, sw.all_requests())
    base_ok = any(d["status"] == "ok" for d in record.manifest["points"] if d["method"] == "none")
    spec_ok = any(d["status"] == "ok" for d in record.manifest["points"] if d["method"] != "none")
    problems = list(dict.fromkeys(sw.failures))
    if not base_ok:
        problems.append("the baseline was not measured")
    if not spec_ok:
        problems.append("no speculative setting was measured")
    record.finish("failed" if problems else "ok", "\n".join(problems) or None)
    result = SweepResult(record.dir, record.manifest, pd.DataFrame(sw.all_requests()))
    if problems and raise_on_failure:
        raise SweepFailed(f"sweep {record.run_id} failed (record: {record.dir}):\n" + "\n".join(problems), result)
    return result


def flat_params(params: SweepParams) -> dict[str, Any]:
    """The params as one flat mapping (trial keys and sweep keys side by side), as records and tools read them."""
    data = params.model_dump(mode="json")
    return {**data.pop("trial"), **data}


def _as_data(params: SweepParams) -> dict[str, Any]:
    return params.model_dump(mode="json")


def _write_requests(record: RunRecord, reqs: list[dict[str, Any]]) -> None:
    if reqs:
        pd.DataFrame(reqs).to_csv(record.add_file("requests.csv"), index=False)
        record.save()
