"""The controlled trial: the protocol the original investigation did by hand, as one function.

    kill old server -> verify GPUs free -> for each arm: launch -> wait ready -> verify env -> warm up ->
    benchmark (counters before/after) -> stop -> confirm port/GPUs free -> compare arms

`run_trial(params)` is called by notebook 02 and by `spectrial trial`; it always leaves a run record
(`outputs/<run-id>/manifest.json`), with `status: failed` and the reason when anything goes wrong.
Per arm it reports tok/s (median and spread over requests), accept length, accepted/drafted, cycle time
(= decode time / verify steps) and the break-even accept length (= cycle time / baseline ms per token).
"""

from __future__ import annotations

import math
import secrets as _rnd
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pandas as pd

from spectrial import analysis
from spectrial.bench import load_prompts, run_requests
from spectrial.engines import Engine, get_engine
from spectrial.errors import ConfigError, SpectrialError
from spectrial.gpu import wait_gpus_free
from spectrial.host import Host, get_host
from spectrial.params import Arm, TrialParams, load_params
from spectrial.records import RunRecord
from spectrial.secrets import mask_argv, mask_env, secret_values
from spectrial.server import Server, stop_previous


class TrialFailed(SpectrialError):
    """The trial ran but at least one arm failed; the record says which and why."""

    def __init__(self, message: str, result: TrialResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class TrialResult:
    """What a trial produced: the run folder, its manifest, per-arm results and per-request rows."""

    run_dir: Path
    manifest: dict[str, Any]
    requests: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def status(self) -> str:
        return self.manifest["status"]

    @property
    def arms(self) -> list[dict[str, Any]]:
        return self.manifest["arms"]

    def table(self) -> pd.DataFrame:
        """One row per arm with the headline figures."""
        return arms_table(self.arms)


ARM_COLUMNS = ["arm", "method", "status", "steps", "synthetic", "tok_s", "tok_s_q1", "tok_s_q3", "speedup",
               "accept_len", "accepted", "drafted", "accept_rate", "cycle_ms", "ms_per_token",
               "break_even_accept_len", "draft_ms_per_cycle", "ready_s", "env_ok"]


def arms_table(arms: list[dict[str, Any]]) -> pd.DataFrame:
    """The arms of a manifest as a table (columns ARM_COLUMNS)."""
    rows = [{"arm": a.get("name"), **{c: a.get(c) for c in ARM_COLUMNS[1:]},
             "env_ok": (a.get("env_check") or {}).get("ok")} for a in arms]
    return pd.DataFrame(rows, columns=ARM_COLUMNS)


def _median(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(vals) if vals else None


def arm_figures(requests: list[dict[str, Any]], stats: Any, speculative: bool) -> dict[str, Any]:
    """Headline figures of one arm from its measured requests and its scoped server counters."""
    ok = [r for r in requests if not r.get("error")]
    server_rates = [r.get("server_predicted_per_second") for r in ok]
    use_server = bool(ok) and all(v for v in server_rates)
    rates = [float(v) for v in (server_rates if use_server else [r.get("client_tok_s") for r in ok]) if v]
    out: dict[str, Any] = {"requests_ok": len(ok), "requests_failed": len(requests) - len(ok),
                           "tok_s_source": "server" if use_server else "client", "tok_s_values": rates}
    if rates:
        s = analysis.summarize(rates)
        out.update(tok_s=s["median"], tok_s_q1=s["q1"], tok_s_q3=s["q3"], tok_s_min=s["min"], tok_s_max=s["max"],
                   tok_s_cv=s["cv"])
    out["client_tok_s"] = _median([r.get("client_tok_s") for r in ok])
    out["ttft_ms"] = _median([r.get("ttft_ms") for r in ok])
    out["itl_ms"] = _median([r.get("itl_ms_median") for r in ok])
    # Server counters scoped to the window; fall back to the per-request sums.
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


def add_comparisons(arms: list[dict[str, Any]]) -> None:
    """Break-even accept length and speed-up of each arm against the trial's baseline arm."""
    base = next((a for a in arms if a.get("method") == "none" and a.get("status") == "ok"), None)
    for a in arms:
        a.setdefault("break_even_accept_len", None)
        a.setdefault("speedup", None)
        if not base or a.get("status") != "ok":
            continue
        if base.get("ms_per_token") and a.get("cycle_ms"):
            a["break_even_accept_len"] = analysis.break_even_accept_len(a["cycle_ms"], base["ms_per_token"])
        if base.get("tok_s") and a.get("tok_s"):
            a["speedup"] = a["tok_s"] / base["tok_s"]
        a["baseline_arm"] = base["name"]


def _benchmark(engine: Engine, server: Server, params: TrialParams, arm: Arm, prompts: list[dict[str, str]],
               progress: bool) -> tuple[list[dict[str, Any]], Any]:
    common = {"max_tokens": params.max_tokens, "payload": engine.completion_payload, "stats_fn": engine.request_stats,
              "concurrency": params.concurrency, "timeout_s": params.request_timeout_s, "label": arm.name,
              "progress": progress}
    if params.warmup:
        run_requests(server.base_url, prompts, n=params.warmup, phase="warmup", seed=params.seed + 1, **common)
    with httpx.Client(timeout=10) as client:
        before = engine.snapshot(client, server.base_url)
        before["_log_lines"] = float(server.log_tail(10**9).count("\n") + 1) if before else 0.0
        reqs = run_requests(server.base_url, prompts, n=params.repeats, seed=params.seed, **common)
        after = engine.snapshot(client, server.base_url)
    log_text = server.host.read_text(server.log_path)
    return reqs, engine.window_stats(before, after, reqs, log_text)


def run_arm(engine: Engine, host: Host, params: TrialParams, arm: Arm, record: RunRecord,
            prompts: list[dict[str, str]], progress: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Launch, verify, benchmark and stop one arm; the arm dict records what happened even on failure."""
    spec = engine.launch_spec(arm)
    record.secrets = sorted(set(record.secrets) | set(secret_values(spec.env, spec.argv)))
    entry: dict[str, Any] = {
        "name": arm.name, "method": arm.method, "status": "running", "reason": None,
        "steps": params.arm_steps(arm) if arm.speculative else None,
        "topk": params.arm_topk(arm) if arm.speculative else None,
        "draft": params.arm_draft(arm) if arm.speculative else None,
        "synthetic": arm.synthetic_accept is not None,
        "synthetic_accept": arm.synthetic_accept,
        "argv": mask_argv(spec.argv), "env": mask_env(spec.env),
    }
    record.manifest["arms"].append(entry)
    work = f"{host.expand(params.work_dir)}/{record.run_id}"
    server = Server(host, spec, work_dir=work, state_dir=host.expand(params.state_dir),
                    tag=f"{record.run_id}:{arm.name}:{_rnd.token_hex(3)}", grace_s=params.stop_grace_s,
                    run_id=record.run_id, arm=arm.name)
    reqs: list[dict[str, Any]] = []
    try:
        with record.step(f"launch:{arm.name}"):
            server.start()
        entry["server"] = server.info()
        with server:  # guarantees the stop on any exception, KeyboardInterrupt included
            with record.step(f"ready:{arm.name}"):
                entry["ready_s"] = server.wait_ready(params.ready_timeout_s, progress=progress)
            with record.step(f"env_check:{arm.name}"):
                check = server.verify_env()
                entry["env_check"] = {"ok": check.ok, "summary": check.summary(), "requested": check.requested,
                                      "processes": check.processes, "problems": check.missing}
                if not check.ok and spec.env and params.env_check == "fail":
                    raise ConfigError(f"env_check: requested variables did not reach the server of arm "
                                      f"{arm.name}: {check.summary()} (set env_check: warn to continue)")
            with record.step(f"benchmark:{arm.name}"):
                reqs, stats = _benchmark(engine, server, params, arm, prompts, progress)
            entry.update(arm_figures(reqs, stats, arm.speculative))
            with record.step(f"stop:{arm.name}") as st:
                st["report"] = server.stop()
        entry["status"] = "ok" if entry.get("tok_s") else "failed"
        if entry["status"] == "failed":
            errs = sorted({r.get("error") for r in reqs if r.get("error")})
            entry["reason"] = "no successful request: " + "; ".join(str(e) for e in errs[:3])
    except BaseException as exc:
        entry["status"] = "failed"
        entry["reason"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        entry["server"] = server.info()
        try:
            record.write_text(f"logs/{arm.name}.log", host.read_text(server.log_path))
        except Exception as exc:  # a log that never got written is itself a finding
            entry.setdefault("notes", []).append(f"server log not fetched: {exc}")
        record.save()
    for r in reqs:
        r["arm"] = arm.name
    return entry, reqs


def run_trial(params: TrialParams | str | Path, overrides: dict[str, Any] | None = None, *,
              run_id: str | None = None, progress: bool = True, raise_on_failure: bool = True) -> TrialResult:
    """Run the whole protocol for `params` (a TrialParams or a YAML path plus dotted overrides)."""
    if not isinstance(params, TrialParams):
        params = load_params(params, overrides)
    elif overrides:
        params = load_params(data=params.model_dump(mode="json"), overrides=overrides)
    record = RunRecord(params.output_dir, params.name, kind="trial", run_id=run_id, params=params)
    record.secrets = secret_values(params.env)
    all_reqs: list[dict[str, Any]] = []
    failures: list[str] = []
    host: Host | None = None
    try:
        host = get_host(params.host)
        record.set(host={"name": host.name})
        engine = get_engine(params.engine, params, host)
        with record.step("prepare"):
            record.manifest["engine"] = {"name": params.engine, **engine.prepare()}
            record.manifest["engine"].update(engine.version())
        prompts = load_prompts(params.prompts)
        with record.step("kill_old_server") as st:
            st["report"] = stop_previous(host, params.port, host.expand(params.state_dir), params.stop_grace_s)
        with record.step("verify_gpus_free") as st:
            gs = wait_gpus_free(host, max_used_mib=params.gpu_free_mib, timeout_s=params.gpu_wait_s,
                                require_gpu=params.require_gpu)
            st["gpus"] = gs.as_dict()
            record.manifest["host"]["gpus"] = gs.as_dict()
        for arm in params.arms:
            try:
                _, reqs = run_arm(engine, host, params, arm, record, prompts, progress)
                all_reqs += reqs
            except (KeyboardInterrupt, ConfigError):
                raise
            except SpectrialError as exc:
                failures.append(f"arm {arm.name}: {exc}")
            if record.manifest["arms"] and record.manifest["arms"][-1]["status"] != "ok":
                failures.append(f"arm {arm.name}: {record.manifest['arms'][-1].get('reason')}")
        add_comparisons(record.manifest["arms"])
        with record.step("compare"):
            pass
    except BaseException as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
        record.finish("failed", "\n".join(dict.fromkeys(failures)))
        _write_requests(record, all_reqs)
        raise
    finally:
        if host is not None:
            host.close()
    _write_requests(record, all_reqs)
    failures = list(dict.fromkeys(failures))
    record.finish("failed" if failures else "ok", "\n".join(failures) or None)
    result = TrialResult(record.dir, record.manifest, pd.DataFrame(all_reqs))
    if failures and raise_on_failure:
        raise TrialFailed(f"trial {record.run_id} failed (record: {record.dir}):\n" + "\n".join(failures), result)
    return result


def _write_requests(record: RunRecord, reqs: list[dict[str, Any]]) -> None:
    if reqs:
        path = record.add_file("requests.csv")
        pd.DataFrame(reqs).to_csv(path, index=False)
        record.save()
