"""Detectors about the acceptance figure itself: pinned at 1.00, measured on raw prompts, read from a counter that
covers more than the measured window."""

from __future__ import annotations

import re
from collections.abc import Iterator

from spectrial.readers.diagnose.common import HEAD_METHODS, PINNED, arm_logs, f2, log, rec, spec_arms
from spectrial.readers.diagnose.context import Context, LogFile, number
from spectrial.readers.diagnose.model import Evidence, Finding
from spectrial.readers.diagnose.registry import detector
from spectrial.schema import ArmRecord, Check

_EAGLE3_PATH = re.compile(r"eagle[-_]?3", re.IGNORECASE)


# ------------------------------------------------------------------ acceptance pinned at 1.00
def _why_pinned(ctx: Context, arm: ArmRecord, path: str) -> tuple[str, list[Evidence]]:
    """What the launch says about a pinned acceptance: an EAGLE-3 draft run as EAGLE, or a draft loaded but
    never used."""
    la = ctx.launch(arm, path)
    algo = la.option("--speculative-algorithm", "--speculative-algo")
    draft = la.option("--speculative-draft-model-path", "--speculative-draft")
    if algo and algo[1].upper() == "EAGLE" and draft and _EAGLE3_PATH.search(draft[1]):
        return (f"The launch runs an EAGLE-3 draft ({draft[1]}) as --speculative-algorithm EAGLE: SGLang then "
                "feeds it one hidden state instead of three and every draft is wrong, silently (SGLang PR #21272).",
                [rec(la.where(algo[0]), algo[1]), rec(la.where(draft[0]), draft[1])])
    if ctx.engine == "llamacpp" and la.option("-md", "--model-draft", "--spec-draft-model") \
            and not la.option("--spec-type"):
        return ("llama-server loads a draft with -md but drafts only with --spec-type (default none).",
                [rec(la.argv_path, " ".join(la.argv))])
    return ("An accept length of exactly 1 means no drafted token is ever accepted: a draft that does not fit "
            "the target (wrong algorithm for the draft, another vocabulary or checkpoint, an untrained or "
            "random draft).", [])


_LOOKUP_METHODS = frozenset({"ngram", "ngram-simple", "ngram-cache", "suffix"})  # draft by looking text up


def _no_lookup_match(path: str, arm: ArmRecord) -> Finding:
    """A prompt-lookup method (n-gram, suffix) that never drafted: no draft model to blame, the text held no
    repeat to look up; it costs only the lookup, so it is a warning unless it measured slower."""
    slower = arm.verdict == "slower"
    return Finding(
        kind="accept_pinned", severity="critical" if slower else "warning", arm=arm.name,
        title=f"{arm.name}: {arm.method} lookup never drafted ({f2(arm.tokens, 0)} tokens, 0 drafted)",
        detail=f"{arm.method} drafts only when the last tokens appeared earlier in the prompt or output; these "
               "requests held no such repeat, so every step decoded as without speculation"
               + (" and paid for the lookup (it measured slower)." if slower else
                  f" (speed-up {f2(arm.speedup)}x, {arm.verdict or 'not judged'})."),
        evidence=[rec(f"{path}.drafted", arm.drafted), rec(f"{path}.tokens", arm.tokens),
                  *([rec(f"{path}.speedup", arm.speedup)] if arm.speedup is not None else [])],
        fix="Judge prompt lookup on a workload that repeats its input (code editing, summarisation, RAG), or "
            "lower its minimum match (vLLM prompt_lookup_min); elsewhere leave it off.",
        sources=[])  # the detector's threads are about draft models


def _live_check(arm: ArmRecord) -> tuple[int, Check] | None:
    """The arm's speculation_live check (spectrial.analysis.validity) and its index, in records that have it."""
    checks = arm.validity.checks if arm.validity is not None else []
    return next(((i, c) for i, c in enumerate(checks) if c.name == "speculation_live"), None)


def _pinned_arm(ctx: Context, path: str, arm: ArmRecord) -> Finding | None:
    """The measurement's own speculation_live check decides (one rule: the verdict's and the doctor's); records
    before it fall back to the counters: zero accepted of some drafted, accept length <= PINNED, no draft."""
    drafted, accepted, al = number(arm.drafted), number(arm.accepted), number(arm.accept_len)
    ev: list[Evidence] = []
    live = _live_check(arm)
    if live is not None:
        i, c = live
        if c.ok is not False:
            return None
        if c.evidence.get("drafted") == 0 and arm.method in _LOOKUP_METHODS:
            return _no_lookup_match(path, arm)
        what = c.summary
        where = f"{path}.validity.checks[{i}]"
        ev += [rec(f"{where}.evidence.{k}", v) for k, v in c.evidence.items() if v is not None]
    elif drafted and accepted == 0:
        what = f"drafted {drafted:g} tokens and accepted none"
        ev += [rec(f"{path}.drafted", drafted), rec(f"{path}.accepted", accepted)]
    elif al is not None and al <= PINNED and (number(arm.verify_steps) or drafted is None):
        steps = number(arm.verify_steps)
        what = f"accept length {al:.2f}" + (f" over {steps:g} verify steps" if steps else "")
        ev += [rec(f"{path}.accept_len", al), *([rec(f"{path}.verify_steps", steps)] if steps else [])]
    elif drafted == 0 and number(arm.tokens) and not number(arm.verify_steps):
        if arm.method in _LOOKUP_METHODS:
            return _no_lookup_match(path, arm)
        what = "drafted nothing at all: the draft was never used"
        ev += [rec(f"{path}.drafted", drafted), rec(f"{path}.tokens", arm.tokens)]
    else:
        return None
    for lf in arm_logs(ctx, arm):
        ev += list(_pinned_lines(lf))[:2]
    why, launch_ev = _why_pinned(ctx, arm, path)
    syn = " (its acceptance was forced synthetically, so this is a setup error)" \
        if arm.synthetic_accept is not None else ""
    return Finding(kind="accept_pinned", severity="critical", arm=arm.name,
                   title=f"{arm.name}: acceptance pinned at 1.00: {what}{syn}",
                   detail=why + " Every cycle then pays for drafting and verifying and commits only the target's "
                               "own token, so it is slower than no speculation.",
                   evidence=launch_ev + ev,
                   fix="Check that the draft matches the target and the algorithm (SGLang: --speculative-algorithm "
                       "EAGLE3 for EAGLE-3 drafts; vLLM: method eagle3; llama.cpp: --spec-type), then re-measure; "
                       "spectrial reports the window's accepted/drafted counters per arm.")


def _pinned_lines(lf: LogFile) -> Iterator[Evidence]:
    """Log lines that show no accepted draft: SGLang decode lines at accept len 1.00, vLLM / llama.cpp lines
    with 0 accepted of N drafted."""
    for _, r in _rows(lf, "decode", "sglang"):
        if number(r.get("accept_len")) is not None and r["accept_len"] <= PINNED:
            yield log(lf, int(r["line"]))
    for kind in ("spec_metrics", "draft_acceptance"):
        for _, r in _rows(lf, kind, None):
            if number(r.get("accepted")) == 0 and (number(r.get("drafted")) or 0) > 0:
                yield log(lf, int(r["line"]))


def _rows(lf: LogFile, kind: str, engine: str | None) -> Iterator[tuple[LogFile, dict]]:
    df = lf.rows(kind, engine)
    if df is None or df.empty:
        return
    for r in df.to_dict("records"):
        yield lf, {k: v for k, v in r.items() if v is not None and not (isinstance(v, float) and v != v)}


def _pinned_log(lf: LogFile) -> Finding | None:
    """A log alone: every speculative reading of it at accept length 1 / zero accepted."""
    sg = [r for _, r in _rows(lf, "decode", "sglang") if number(r.get("accept_len")) is not None]
    counted = [r for k in ("spec_metrics", "draft_acceptance") for _, r in _rows(lf, k, None)
               if number(r.get("drafted"))]
    pinned_sg = bool(sg) and max(r["accept_len"] for r in sg) <= PINNED
    pinned_ct = bool(counted) and sum(number(r.get("accepted")) or 0 for r in counted) == 0
    if not (pinned_sg or pinned_ct):
        return None
    n = len(sg) if pinned_sg else len(counted)
    return Finding(kind="accept_pinned", severity="critical",
                   title=f"{lf.label}: acceptance pinned at 1.00 in all {n} speculative log readings",
                   detail="No drafted token is ever accepted: a draft that does not fit the target or the algorithm "
                          "(SGLang PR #21272: an EAGLE-3 draft run as EAGLE), an untrained draft, or speculation "
                          "switched off above a batch-size threshold while still being paid for.",
                   evidence=list(_pinned_lines(lf))[:3],
                   fix="Check the draft/algorithm pair and the launch flags, then re-measure.")


@detector("accept_pinned", 1, "sglang#21272", "vllm#6768", "fastrl#4")
def accept_pinned(ctx: Context) -> Iterator[Finding]:
    """Acceptance pinned at 1.00 or zero drafts: the draft is not loaded, not used, or the wrong algorithm."""
    seen = set()
    for path, arm in spec_arms(ctx):
        f = _pinned_arm(ctx, path, arm)
        if f is not None:
            seen.add(ctx.setting(arm))
            yield f
    for lf in ctx.logs:
        if lf.arm is None:
            f = _pinned_log(lf)
            if f is not None:
                yield f


# ------------------------------------------------------------------ raw prompts
_RAW_PATHS = ("/v1/completions", "/generate", "/completion", "/completions")


@detector("raw_prompts", 11, "tokenspeed#1305", "sglang#4716")
def raw_prompts(ctx: Context) -> Iterator[Finding]:
    """Acceptance measured on raw prompts (no chat template) with a draft head trained on chat-formatted output."""
    m = ctx.manifest
    fmt = ctx.params.request_format or "completion"  # records before workloads: always raw completions
    own = m is not None and m.kind in ("trial", "sweep")  # spectrial sent the requests: the record says how
    if own and fmt != "chat" and ("prompts" in ctx.params or "workload" in ctx.params):
        yield from _raw_prompt_record(ctx, fmt)
    # a forced (synthetic) acceptance does not depend on the prompts: those arms' logs say nothing about them;
    # the logs of spectrial's own arms are its own requests, which the record states once (above)
    forced = {id(lf) for _, a in spec_arms(ctx) if a.synthetic or a.synthetic_accept is not None
              for lf in arm_logs(ctx, a)}
    for lf in ctx.logs:
        if id(lf) not in forced and not (own and lf.arm is not None):
            yield from _raw_prompt_log(lf)


def _raw_prompt_record(ctx: Context, fmt: str) -> Iterator[Finding]:
    """Once per record: the head-trained arms whose acceptance came from spectrial's raw completions (its default
    request format), as information with what to set, the server log lines that show it as evidence."""
    api = (ctx.params.engine_config or {}).get("client_api") or "openai"
    endpoint = "/generate" if api == "native" else "/v1/completions"
    arms = [(p, a) for p, a in spec_arms(ctx) if a.method in HEAD_METHODS and not a.synthetic
            and a.synthetic_accept is None
            and ((number(a.accepted) or 0) > 0 or (number(a.accept_len) or 0) > PINNED)]
    if not arms:
        return
    what = ("params.workload", [w.get("source") if isinstance(w, dict) else w
                                for w in ctx.params.workload or []]) if "workload" in ctx.params \
        else ("params.prompts", ctx.params.prompts)
    default = "request_format" not in ctx.params or fmt == "completion"
    ev = [rec(*what), rec("params.request_format", f"{fmt} (spectrial sent each prompt as raw text to "
                                                  f"{endpoint}, no chat template; client_api {api})")]
    ev += [rec(f"{p}.accept_len", a.accept_len) for p, a in arms]
    logs = [lf for _, a in arms for lf in arm_logs(ctx, a)]
    ev += [e for lf in logs[:1] for e in _raw_lines(lf)]
    names_ = ", ".join(dict.fromkeys(a.name for _, a in arms))
    yield Finding(
        kind="raw_prompts", severity="info", arm=None if len(arms) > 1 else arms[0][1].name,
        title=f"acceptance of {names_} measured on raw completions (request_format: {fmt}"
              + (", spectrial's default" if default else "") + "), not on chat-formatted prompts",
        detail="Fine for timing the cycle; for the acceptance your users will see it is not: an EAGLE/MTP head "
               "is trained on the target's chat-formatted outputs, and raw completions put it in another decode "
               "state, which moves its acceptance either way by up to 2x (tokenspeed #1305: 3.93 tokens/iteration "
               "raw vs 1.94 with the chat template; SGLang PR #4716: acc_length 2.42 with a raw prompt vs 5.88 on "
               "MT-bench with the system prompt)."
               + (f" The {len(logs)} server log(s) of these arms show the same requests." if logs else ""),
        evidence=ev,
        fix="To measure acceptance as served, re-run with the chat template: `-p request_format=chat -p "
            "workload=sharegpt` (or your own prompt file): /v1/chat/completions with the server's template, or "
            "the model's template applied for SGLang's /generate.")


def _raw_lines(lf: LogFile) -> list[Evidence]:
    """A log's first raw-completion request and its first speculative reading (none when it has no raw one)."""
    raw = [r for _, r in _rows(lf, "access", "http") if str(r.get("path", "")).split("?")[0] in _RAW_PATHS]
    spec = [r for k in ("decode", "spec_metrics") for _, r in _rows(lf, k, None)
            if (number(r.get("accept_len")) or 0) > PINNED]
    return [log(lf, int(raw[0]["line"])), *[log(lf, int(r["line"])) for r in spec[:1]]] if raw else []


def _raw_prompt_log(lf: LogFile) -> Iterator[Finding]:
    spec = [r for k in ("decode", "spec_metrics") for _, r in _rows(lf, k, None)
            if (number(r.get("accept_len")) or 0) > PINNED]
    access = [r for _, r in _rows(lf, "access", "http")]
    raw = [r for r in access if str(r.get("path", "")).split("?")[0] in _RAW_PATHS]
    chat = [r for r in access if "chat/completions" in str(r.get("path", ""))]
    if spec and raw and not chat:
        yield Finding(kind="raw_prompts", severity="warning",
                      title=f"{lf.label}: acceptance logged while every request was a raw completion "
                            f"({len(raw)} requests to {raw[0]['path']})",
                      detail="Speculative acceptance depends on the decode state; a chat-trained head judged on raw "
                             "completions can read 2x too high or too low (tokenspeed #1305).",
                      evidence=[log(lf, int(raw[0]["line"])), log(lf, int(spec[0]["line"]))],
                      fix="Benchmark through /v1/chat/completions (or apply the chat template) with prompts of "
                          "the real workload.")
    one = [r for _, r in _rows(lf, "bench_one_batch", "sglang") if (number(r.get("accept_len")) or 0) > PINNED]
    if one:
        yield Finding(kind="raw_prompts", severity="warning",
                      title=f"{lf.label}: accept length {f2(one[0]['accept_len'])} from a one-batch benchmark on "
                            "raw or random input",
                      detail="sglang.test.send_one sends one raw prompt and bench_one_batch random token ids: "
                             "neither is the chat-formatted state the draft head was trained on (SGLang PR #4716: "
                             "2.42 with send_one vs 5.88 on MT-bench with the system prompt).",
                      evidence=[log(lf, int(r["line"])) for r in one[:2]],
                      fix="Judge acceptance on chat-formatted prompts of the workload (e.g. benchmark/mtbench or "
                          "bench_serving with a chat dataset).")


# ------------------------------------------------------------------ a counter wider than the window
@detector("global_counter", 12, "sglang#34743", "sglang#16694")
def global_counter(ctx: Context) -> Iterator[Finding]:
    """Accept length read from a server-global (cumulative, one-rank) counter instead of the measured window."""
    for path, arm in spec_arms(ctx):
        ev: list[Evidence] = []
        if arm.stats_scoped is False:
            ev.append(rec(f"{path}.stats_scoped", False))
        m = ctx.manifest
        for i, s in enumerate(m.starts if m is not None else []):
            if s.arm == ctx.setting(arm):
                ev += [rec(f"starts[{i}].windows[{j}].stats_scoped", False)
                       for j, w in enumerate(s.windows) if w.stats_scoped is False]
        if ev:
            yield Finding(kind="global_counter", severity="warning", arm=arm.name,
                          title=f"{arm.name}: accept length {f2(arm.accept_len)} is not scoped to the measured "
                                f"window (source: {arm.stats_source or 'not recorded'})",
                          detail="A server-global figure (SGLang's /server_info avg_spec_accept_length, llama.cpp's "
                                 "statistics line) is cumulative since the server started and, with DP, one rank's "
                                 "(SGLang PR #34743): warm-up and earlier workloads are mixed into it.",
                          evidence=[rec(f"{path}.stats_source", arm.stats_source), *ev[:3]],
                          fix="Read counters before and after the window and subtract, or weight per-request "
                              "spec_accept_length by spec_verify_ct (what spectrial does when the engine allows).")
        logx = arm.cross_checks.get("log")
        a, b = number(arm.accept_len), number(logx.accept_len if logx is not None else None)
        if a and b and abs(a - b) / b > 0.10:
            yield Finding(kind="global_counter", severity="warning", arm=arm.name,
                          title=f"{arm.name}: two readings of the same window disagree: accept length {a:.2f} "
                                f"({arm.stats_source}) vs {b:.2f} (the server log)",
                          detail="One of them covers more than the window (a cumulative counter, another DP rank, "
                                 "warm-up requests).",
                          evidence=[rec(f"{path}.accept_len", a), rec(f"{path}.cross_checks.log.accept_len", b),
                                    rec(f"{path}.cross_checks.log.source", logx.source if logx is not None else None)],
                          fix="Trust the reading scoped to the window; find what the other one includes.")
    for lf in ctx.logs:
        rows = [r for _, r in _rows(lf, "bench_serving", "sglang")
                if number(r.get("accept_len")) and str(r.get("backend", "sglang")).startswith("sglang")]
        if rows:
            yield Finding(kind="global_counter", severity="warning",
                          title=f"{lf.label}: bench_serving's 'Accept length' {f2(rows[0]['accept_len'])} is the "
                                "server's cumulative figure, not this benchmark's",
                          detail="SGLang's bench_serving reads it from /server_info internal_states[0]."
                                 "avg_spec_accept_length: since the server started (warm-up and earlier runs "
                                 "included) and, with decode DP, one scheduler's only (SGLang PR #34743; newer "
                                 "builds print '(server)' and '(benchmark)' rows, PR #16694).",
                          evidence=[log(lf, int(r["line"])) for r in rows[:2]],
                          fix="Restart the server (or flush its metrics) before the run, or use the per-request "
                              "spec_accept_length weighted by spec_verify_ct.")
