"""The controlled trial: the protocol the original investigation did by hand, as one function.

    kill old server -> verify GPUs free -> fingerprint the host -> for each server start (arms x restarts,
    interleaved A B A B by default): launch -> wait ready -> verify env -> warm up -> benchmark (counters
    before/after, GPU sampled) -> stop -> confirm port/GPUs free -> fingerprint again
    -> per arm: statistics over requests and starts -> compare with the baseline -> drift check

`run_trial(params)` is called by notebook 02 and by `spectrial trial`; it always leaves a run record
(`outputs/<run-id>/manifest.json`), with `status: failed` and the reason when anything goes wrong.
Per arm it reports tok/s (median, IQR, bootstrap CI; request-to-request and restart-to-restart spread
apart), accept length, accepted/drafted, cycle time (= decode time / verify steps), the break-even accept
length (= cycle time / baseline ms per token) and, against the baseline, the speed-up ratio with its
confidence interval and a verdict: faster, slower or not distinguishable at this noise.
"""

from __future__ import annotations

import math
import random
import secrets as _rnd
import statistics
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from spectrial import analysis
from spectrial.bench import load_prompts, run_requests
from spectrial.engines import ArmStats, Engine, get_engine
from spectrial.errors import ConfigError, SpectrialError
from spectrial.fingerprint import compare as fp_compare
from spectrial.fingerprint import engine_identity, fingerprint_key, host_fingerprint
from spectrial.gpu import GpuSampler
from spectrial.group import HostGroup
from spectrial.host import Host, get_host
from spectrial.params import Arm, TrialParams, load_params
from spectrial.records import RunRecord, RunResult
from spectrial.secrets import mask_argv, mask_env, secret_values
from spectrial.server import Server, stop_previous


class TrialFailed(SpectrialError):
    """The trial ran but at least one arm failed; the record says which and why."""

    def __init__(self, message: str, result: TrialResult) -> None:
        super().__init__(message)
        self.result = result


class TrialResult(RunResult):
    """What a trial produced: the run folder, its manifest, per-arm results and per-request rows."""

    @property
    def arms(self) -> list[dict[str, Any]]:
        return self.manifest["arms"]

    def table(self) -> pd.DataFrame:
        """One row per arm with the headline figures."""
        return arms_table(self.arms)


ARM_COLUMNS = ["arm", "method", "status", "steps", "synthetic", "tok_s", "tok_s_ci_low", "tok_s_ci_high",
               "speedup", "speedup_ci_low", "speedup_ci_high", "verdict", "accept_len", "accepted", "drafted",
               "accept_rate", "cycle_ms", "ms_per_token", "break_even_accept_len", "draft_ms_per_cycle",
               "starts", "env_ok"]


def arms_table(arms: list[dict[str, Any]]) -> pd.DataFrame:
    """The arms of a manifest as a table (columns ARM_COLUMNS)."""
    rows = []
    for a in arms:
        row = {"arm": a.get("name"), **{c: a.get(c) for c in ARM_COLUMNS[1:]}}
        row["env_ok"] = (a.get("env_check") or {}).get("ok")
        row["starts"] = len(a.get("starts") or []) or None
        rows.append(row)
    return pd.DataFrame(rows, columns=ARM_COLUMNS)


# --- schedule --------------------------------------------------------------------------------------------
def schedule(arms: list[Arm], restarts: int, order: str, seed: int = 0) -> list[tuple[Arm, int]]:
    """Server starts in launch order: interleaved (A B A B), blocked (A A B B) or random (seeded shuffle)."""
    if order == "blocked":
        return [(a, r) for a in arms for r in range(restarts)]
    plan = [(a, r) for r in range(restarts) for a in arms]
    if order == "random":
        random.Random(seed).shuffle(plan)
    return plan


# --- figures of one arm ----------------------------------------------------------------------------------
def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else None


def _rate(r: dict[str, Any], use_server: bool) -> float | None:
    v = r.get("server_predicted_per_second") if use_server else r.get("client_tok_s")
    return float(v) if v else None


def merge_stats(stats: list[ArmStats]) -> ArmStats:
    """Counters of several server starts of one arm, summed (per-position rates weighted by verify steps)."""
    out = ArmStats(source=",".join(sorted({s.source for s in stats})) or "none",
                   scoped=all(s.scoped for s in stats) if stats else False)

    def total(name: str) -> float | None:
        vals = [getattr(s, name) for s in stats]
        return None if not vals or any(v is None for v in vals) else float(sum(vals))

    for name in ("verify_steps", "drafted", "accepted", "tokens", "decode_ms", "draft_ms"):
        setattr(out, name, total(name))
    if stats and all(s.per_position and s.verify_steps for s in stats):
        n = min(len(s.per_position or []) for s in stats)
        w = sum(s.verify_steps or 0 for s in stats)
        out.per_position = [sum((s.per_position or [])[i] * (s.verify_steps or 0) for s in stats) / w for i in range(n)]
    lens = [s.accept_len for s in stats if s.accept_len is not None]
    out.accept_len = statistics.mean(lens) if lens else None
    out.notes = sorted({n for s in stats for n in s.notes})
    return out


def arm_figures(requests: list[dict[str, Any]], stats: ArmStats, speculative: bool,
                level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """Headline figures of one arm from its measured requests (all starts) and its scoped counters."""
    ok = [r for r in requests if not r.get("error")]
    use_server = bool(ok) and all(r.get("server_predicted_per_second") for r in ok)
    for r in ok:
        r["tok_s"] = _rate(r, use_server)
    rated = [r for r in ok if r["tok_s"]]
    rates = [r["tok_s"] for r in rated]
    out: dict[str, Any] = {"requests_ok": len(ok), "requests_failed": len(requests) - len(ok),
                           "tok_s_source": "server" if use_server else "client", "tok_s_values": rates}
    if rates:
        s = analysis.summarize(rates)
        out.update(tok_s=s["median"], tok_s_q1=s["q1"], tok_s_q3=s["q3"], tok_s_iqr=s["iqr"], tok_s_min=s["min"],
                   tok_s_max=s["max"], tok_s_cv=s["cv"])
        starts = {r.get("restart", 0) for r in rated}
        if len(starts) > 1:
            df = pd.DataFrame({"restart": [r.get("restart", 0) for r in rated], "tok_s": rates})
            ci = analysis.bootstrap_ci_two_level(df, "restart", "tok_s", level=level, seed=seed)
            spread = analysis.two_level_spread(df, "restart", "tok_s")
            out.update(cv_within_start=spread.within_cv, cv_between_starts=spread.between_cv,
                       cv_between_expected=spread.expected_between_cv,
                       start_medians=[float(x) for x in spread.group_medians])
        elif len(rates) >= 2:
            ci = analysis.bootstrap_ci(rates, level=level, seed=seed)
            out.update(cv_within_start=s["cv"], cv_between_starts=None)
        else:
            ci = None
        if ci is not None:
            out.update(tok_s_ci_low=ci.low, tok_s_ci_high=ci.high, ci_level=level)
    out["client_tok_s"] = _median([r.get("client_tok_s") for r in ok])
    out["ttft_ms"] = _median([r.get("ttft_ms") for r in ok])
    out["itl_ms"] = _median([r.get("itl_ms_median") for r in ok])
    drafted = stats.drafted if stats.drafted is not None else sum(r.get("server_draft_n") or 0 for r in ok)
    accepted = stats.accepted if stats.accepted is not None else sum(r.get("server_draft_n_accepted") or 0 for r in ok)
    tokens = stats.tokens if stats.tokens else sum(r.get("tokens") or 0 for r in ok)
    decode_ms = stats.decode_ms if stats.decode_ms else sum(r.get("server_predicted_ms") or 0 for r in ok) or None
    out.update(drafted=drafted, accepted=accepted, tokens=tokens, decode_ms=decode_ms,
               verify_steps=stats.verify_steps, per_position=stats.per_position, stats_source=stats.source,
               stats_scoped=stats.scoped, stats_notes=stats.notes)
    out["ms_per_token"] = decode_ms / tokens if decode_ms and tokens else None
    if speculative:
        steps = stats.verify_steps
        out["accept_rate"] = accepted / drafted if drafted else None
        out["accept_len"] = analysis.accept_len_from_counts(accepted, steps) if steps and accepted is not None \
            else stats.accept_len
        out["cycle_ms"] = analysis.cycle_ms_from(decode_ms, steps) if steps and decode_ms else None
        out["draft_ms_per_cycle"] = stats.draft_ms / steps if stats.draft_ms is not None and steps else None
    else:
        out.update(accept_rate=None, accept_len=1.0, cycle_ms=out["ms_per_token"], draft_ms_per_cycle=None)
    return out


def add_comparisons(arms: list[dict[str, Any]], requests: list[dict[str, Any]], level: float = 0.95,
                    seed: int = 0) -> None:
    """Against the baseline arm: break-even accept length, speed-up with its CI, and the verdict."""
    base = next((a for a in arms if a.get("method") == "none" and a.get("status") == "ok"), None)
    by_arm: dict[str, pd.DataFrame] = {}
    if requests:
        df = pd.DataFrame(requests)
        if {"arm", "tok_s"} <= set(df.columns):
            df = df[df["tok_s"].notna()]
            by_arm = {name: g for name, g in df.groupby("arm")}
    for a in arms:
        for k in ("break_even_accept_len", "speedup", "speedup_ci_low", "speedup_ci_high", "verdict",
                  "min_detectable_ratio"):
            a.setdefault(k, None)
        if not base or a.get("status") != "ok":
            continue
        if base.get("ms_per_token") and a.get("cycle_ms"):
            a["break_even_accept_len"] = analysis.break_even_accept_len(a["cycle_ms"], base["ms_per_token"])
        if base.get("tok_s") and a.get("tok_s"):
            a["speedup"] = a["tok_s"] / base["tok_s"]
        a["baseline_arm"] = base["name"]
        if a is base:
            continue
        sa, sb = by_arm.get(a["name"]), by_arm.get(base["name"])
        if sa is None or sb is None or len(sa) < 2 or len(sb) < 2:
            a["verdict"] = "not enough requests for a confidence interval"
            continue
        two_level = sa["restart"].nunique() > 1 and sb["restart"].nunique() > 1
        cmp = analysis.compare_arms(sa if two_level else sa["tok_s"].to_numpy(),
                                    sb if two_level else sb["tok_s"].to_numpy(), level=level, seed=seed,
                                    **({"group_col": "restart", "value_col": "tok_s"} if two_level else {}))
        a.update(speedup_ci_low=cmp.ci_low, speedup_ci_high=cmp.ci_high, verdict=cmp.verdict,
                 min_detectable_ratio=cmp.min_detectable_ratio, ci_level=level,
                 ci_basis="restarts then requests" if two_level else "requests of one start")


# --- one server start ------------------------------------------------------------------------------------
@retry(retry=retry_if_exception_type(httpx.TransportError), stop=stop_after_attempt(3),
       wait=wait_exponential(multiplier=0.5, max=4), reraise=True)
def _snapshot(engine: Engine, client: httpx.Client, url: str) -> dict[str, float]:
    """Cumulative counters; retried on transport errors (a dropped SSH tunnel reconnects meanwhile),
    which cannot skew them since they are cumulative."""
    return engine.snapshot(client, url)


def _benchmark(engine: Engine, server: Server, params: TrialParams, arm: Arm, restart: int,
               prompts: list[dict[str, str]], progress: bool) -> tuple[list[dict[str, Any]], ArmStats]:
    label = arm.name if params.restarts == 1 else f"{arm.name}#{restart + 1}"
    path, payload = engine.request_target()
    common = {"max_tokens": params.max_tokens, "payload": payload, "stats_fn": engine.request_stats, "path": path,
              "concurrency": params.concurrency, "timeout_s": params.request_timeout_s, "label": label,
              "progress": progress}
    if params.warmup:
        run_requests(server.base_url, prompts, n=params.warmup, phase="warmup", seed=params.seed + 1000 + restart,
                     **common)
    with httpx.Client(timeout=10) as client:
        before = _snapshot(engine, client, server.base_url)
        before["_log_lines"] = float(len(server.host.read_text(server.log_path).splitlines()))
        reqs = run_requests(server.base_url, prompts, n=params.repeats, seed=params.seed + restart, **common)
        after = _snapshot(engine, client, server.base_url)
    log_text = server.host.read_text(server.log_path)
    return reqs, engine.window_stats(before, after, reqs, log_text)


def run_start(engine: Engine, host: Host, params: TrialParams, arm: Arm, restart: int, record: RunRecord,
              prompts: list[dict[str, str]], progress: bool = True, group: HostGroup | None = None
              ) -> tuple[dict[str, Any], list[dict[str, Any]], ArmStats | None]:
    """Launch, verify, benchmark and stop one server start of `arm`; its entry records what happened."""
    spec = engine.launch_spec(arm)
    record.secrets = sorted(set(record.secrets) | set(secret_values(spec.env, spec.argv)))
    suffix = "" if params.restarts == 1 else f"#{restart + 1}"
    entry: dict[str, Any] = {"arm": arm.name, "restart": restart, "order": len(record.manifest["starts"]),
                             "status": "running", "reason": None}
    record.manifest["starts"].append(entry)
    work = f"{host.expand(params.work_dir)}/{record.run_id}"
    server = Server(host, spec, work_dir=work, state_dir=host.expand(params.state_dir),
                    tag=f"{record.run_id}:{arm.name}:{restart}:{_rnd.token_hex(3)}", grace_s=params.stop_grace_s,
                    run_id=record.run_id, arm=arm.name)
    server.spec.name = f"{spec.name}{suffix.replace('#', '-')}"
    server.log_path = f"{work}/{server.spec.name}.log"
    server.exit_path = f"{work}/{server.spec.name}.exit"
    if group is not None:  # [issue 7] rpc-server workers / SGLang ranks on the other nodes of `hosts:`
        group.attach(server, engine, arm, params)
    reqs: list[dict[str, Any]] = []
    stats: ArmStats | None = None
    fp_before = host_fingerprint(host)
    samples: list[dict[str, Any]] = []
    tags = {"arm": arm.name, "restart": restart}
    try:
        with record.step(f"launch:{arm.name}{suffix}", **tags):
            server.start()
        with server:  # guarantees the stop on any exception, KeyboardInterrupt included
            with record.step(f"ready:{arm.name}{suffix}", **tags):
                entry["ready_s"] = server.wait_ready(params.ready_timeout_s, progress=progress)
            with record.step(f"env_check:{arm.name}{suffix}", **tags):
                check = server.verify_env()
                entry["env_check"] = {"ok": check.ok, "summary": check.summary(), "requested": check.requested,
                                      "processes": check.processes, "problems": check.missing}
                if not check.ok and spec.env and params.env_check == "fail":
                    raise ConfigError(f"env_check: requested variables did not reach the server of arm "
                                      f"{arm.name}: {check.summary()} (set env_check: warn to continue)")
            sampler = GpuSampler(host, f"{work}/{server.spec.name}.gpu.csv", params.sample_gpu_ms)
            with record.step(f"benchmark:{arm.name}{suffix}", **tags), sampler:
                try:
                    reqs, stats = _benchmark(engine, server, params, arm, restart, prompts, progress)
                except httpx.HTTPError as exc:  # [issue 7] the server died or became unreachable mid-run
                    raise server.lost(exc) from exc
                samples = sampler.stop()
            entry["gpu_sampling"] = sampler.reason or f"{len(samples)} samples"
            with record.step(f"stop:{arm.name}{suffix}", **tags) as st:
                st["report"] = server.stop()
        ok = [r for r in reqs if not r.get("error")]
        entry["status"] = "ok" if ok else "failed"
        if not ok:
            errs = sorted({str(r.get("error")) for r in reqs})
            entry["reason"] = "no successful request: " + "; ".join(errs[:3])
    except BaseException as exc:
        entry["status"] = "failed"
        entry["reason"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        entry["server"] = server.info()
        entry["fingerprint_changes"] = fp_compare(fp_before, host_fingerprint(host))
        entry["throttled_samples"] = sum(1 for s in samples if s.get("throttle"))
        if samples:
            name = f"gpu/{server.spec.name}.csv"
            record.add_file(name)
            (record.dir / "gpu").mkdir(exist_ok=True)
            pd.DataFrame(samples).to_csv(record.dir / name, index=False)
        try:
            log_text = host.read_text(server.log_path)
            record.write_text(f"logs/{server.spec.name}.log", log_text)
            entry["log_summary"] = log_summary(log_text)
        except Exception as exc:  # a log that never got written is itself a finding
            entry.setdefault("notes", []).append(f"server log not fetched: {exc}")
        for name, text in server.extra_logs().items():  # [issue 7] logs of the companions on other nodes
            record.write_text(f"logs/{name}", text)
        events = host.take_events() + (group.take_events() if group else [])  # [issue 7] drops, reconnects
        if events:
            entry["connection_events"] = events
        record.save()
    for r in reqs:
        r.update(arm=arm.name, restart=restart)
    if stats is not None:
        entry["counters"] = {k: getattr(stats, k) for k in ("verify_steps", "drafted", "accepted", "tokens",
                                                            "decode_ms", "draft_ms")}
        entry["nccl_evidence"] = stats.nccl_evidence
        rates = [r.get("server_predicted_per_second") or r.get("client_tok_s") for r in reqs if not r.get("error")]
        entry["tok_s"] = _median(rates)
    return entry, reqs, stats


def log_summary(text: str) -> dict[str, Any]:
    """What spectrial's log parser finds in a server log: records per kind and the medians of key metrics."""
    from spectrial.logs import parse, summary

    df = parse(text)
    rows = summary(df).to_dict("records") if not df.empty else []
    return {"lines": df.attrs.get("lines"), "unparsed_lines": df.attrs.get("unparsed_lines"),
            "metrics": [{k: r.get(k) for k in ("engine", "kind", "metric", "n", "median")} for r in rows]}


def arm_entry(params: TrialParams, engine: Engine, arm: Arm) -> dict[str, Any]:
    """The static part of an arm's record: method, settings, exact argv and env (masked)."""
    spec = engine.launch_spec(arm)
    return {"name": arm.name, "method": arm.method, "status": "pending", "reason": None,
            "steps": params.arm_steps(arm) if arm.speculative else None,
            "topk": params.arm_topk(arm) if arm.speculative else None,
            "draft_tokens": params.arm_draft_tokens(arm) if arm.speculative else None,
            "draft": params.arm_draft(arm) if arm.speculative else None,
            "synthetic": arm.synthetic_accept is not None, "synthetic_accept": arm.synthetic_accept,
            "argv": mask_argv(spec.argv), "env": mask_env(spec.env)}


# --- the trial -------------------------------------------------------------------------------------------
def run_trial(params: TrialParams | str | Path, overrides: dict[str, Any] | None = None, *,
              run_id: str | None = None, progress: bool = True, raise_on_failure: bool = True) -> TrialResult:
    """Run the whole protocol for `params` (a TrialParams or a YAML path plus dotted overrides)."""
    if not isinstance(params, TrialParams):
        params = load_params(params, overrides)
    elif overrides:
        params = load_params(data=params.model_dump(mode="json"), overrides=overrides)
    record = RunRecord(params.output_dir, params.name, kind="trial", run_id=run_id, params=params)
    record.manifest["starts"] = []
    record.secrets = secret_values(params.env)
    all_reqs: list[dict[str, Any]] = []
    failures: list[str] = []
    host: Host | None = None
    group: HostGroup | None = None
    try:
        host = get_host(params.host, **params.ssh.connect_options())  # [issue 7] ssh: options
        group = HostGroup.from_params(params, host)  # [issue 7] the nodes of `hosts:` (just `host` without it)
        record.set(host={"name": host.name})
        engine = get_engine(params.engine, params, host)
        with record.step("prepare"):
            record.manifest["engine"] = {"name": params.engine, **engine.prepare()}
            if group.workers:  # [issue 7] provision the other nodes (rpc-server), --rpc on the head
                record.manifest["nodes"] = group.prepare(engine)
            record.manifest["engine"].update(engine.version())
            record.manifest["arms"] = [arm_entry(params, engine, a) for a in params.arms]
        prompts = load_prompts(params.prompts)
        with record.step("kill_old_server") as st:
            st["report"] = stop_previous(host, params.port, host.expand(params.state_dir), params.stop_grace_s)
            if group.workers:  # [issue 7] and what spectrial left on the other nodes
                st["nodes"] = group.stop_previous(engine, params)
        with record.step("verify_gpus_free") as st:
            gs, node_gpus = group.wait_gpus_free(params)  # [issue 7] every node at once
            if node_gpus:
                st["nodes"] = node_gpus
            st["gpus"] = gs.as_dict()
        with record.step("fingerprint"):
            fp, node_fps = group.fingerprints()  # [issue 7] every node at once
            if node_fps:
                record.manifest["node_fingerprints"] = node_fps
            eng = record.manifest["engine"]
            eng.update(engine_identity(host, eng.get("binary"), {}))
            models = (eng.get("models") or {}).values()
            from spectrial.fingerprint import file_identity

            record.manifest["models"] = [file_identity(host, m) for m in dict.fromkeys(models) if m.startswith("/")]
            record.manifest["host"].update(fingerprint=fp, gpus=gs.as_dict())
            record.manifest["fingerprint_key"] = fingerprint_key(fp, eng)
        arms_by_name = {a["name"]: a for a in record.manifest["arms"]}
        stats_by_arm: dict[str, list[ArmStats]] = {a.name: [] for a in params.arms}
        for arm, restart in schedule(params.arms, params.restarts, params.order, params.seed):
            arms_by_name[arm.name]["status"] = "running"
            try:
                entry, reqs, stats = run_start(engine, host, params, arm, restart, record, prompts, progress,
                                               group=group)
                all_reqs += reqs
                if stats is not None:
                    stats_by_arm[arm.name].append(stats)
                if entry["status"] != "ok":
                    failures.append(f"arm {arm.name} start {restart + 1}: {entry.get('reason')}")
            except (KeyboardInterrupt, ConfigError):
                raise
            except SpectrialError as exc:
                failures.append(f"arm {arm.name} start {restart + 1}: {exc}")
        with record.step("compare"):
            summarise_arms(params, record, all_reqs, stats_by_arm)
            from spectrial.drift import check_drift

            record.manifest["drift"] = check_drift(record.manifest, params.drift_dir or params.output_dir,
                                                   params.drift_tolerance)
    except BaseException as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
        for a in record.manifest["arms"]:
            if a["status"] in ("pending", "running"):
                a["status"], a["reason"] = "failed", f"trial stopped: {type(exc).__name__}"
        record.finish("failed", "\n".join(dict.fromkeys(failures)))
        _write_requests(record, all_reqs)
        raise
    finally:
        if group is not None:  # [issue 7]
            group.close()
        if host is not None:
            host.close()
    _write_requests(record, all_reqs)
    failures = list(dict.fromkeys(failures))
    record.finish("failed" if failures else "ok", "\n".join(failures) or None)
    result = TrialResult(record.dir, record.manifest, pd.DataFrame(all_reqs))
    if failures and raise_on_failure:
        raise TrialFailed(f"trial {record.run_id} failed (record: {record.dir}):\n" + "\n".join(failures), result)
    return result


def summarise_arms(params: TrialParams, record: RunRecord, reqs: list[dict[str, Any]],
                   stats_by_arm: dict[str, list[ArmStats]]) -> None:
    """Fill each arm's figures from its starts, then compare with the baseline."""
    starts = record.manifest["starts"]
    for a, arm in zip(record.manifest["arms"], params.arms, strict=True):
        mine = [s for s in starts if s["arm"] == arm.name]
        a["starts"] = [{k: s.get(k) for k in ("restart", "order", "status", "tok_s", "ready_s", "reason")}
                       for s in mine]
        checks = [s.get("env_check") for s in mine if s.get("env_check")]
        if checks:
            a["env_check"] = checks[-1] if all(c["ok"] for c in checks) else next(c for c in checks if not c["ok"])
        a["fingerprint_changes"] = sorted({c for s in mine for c in s.get("fingerprint_changes", [])})
        a["throttled_samples"] = sum(s.get("throttled_samples", 0) for s in mine)
        arm_reqs = [r for r in reqs if r.get("arm") == arm.name]
        failed = [s for s in mine if s["status"] != "ok"]
        if not mine or len(failed) == len(mine):
            a["status"] = "failed"
            a["reason"] = "; ".join(str(s.get("reason")) for s in failed) or "never started"
            continue
        a.update(arm_figures(arm_reqs, merge_stats(stats_by_arm[arm.name]), arm.speculative,
                             params.confidence, params.seed))
        a["status"] = "ok" if a.get("tok_s") else "failed"
        a["reason"] = ("; ".join(f"start {s['restart'] + 1}: {s.get('reason')}" for s in failed) or None) \
            if a["status"] == "ok" else "no successful request"
    add_comparisons(record.manifest["arms"], reqs, params.confidence, params.seed)


def _write_requests(record: RunRecord, reqs: list[dict[str, Any]]) -> None:
    if reqs:
        path = record.add_file("requests.csv")
        pd.DataFrame(reqs).to_csv(path, index=False)
        record.save()
