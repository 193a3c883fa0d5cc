"""Issue 39 item 4: every record carries the memory-bandwidth bound of its baseline, and every arm's rate is judged
against it. Real llama-server on this CPU host: the tiny target (58.8 MB, more than the 32 MiB last-level cache of
these machines) is streamed from memory each step; the host's bandwidth is measured by the STREAM-style probe; the
weights come from the GGUF header and equal the architecture's matrices plus its norms. A bandwidth figure that is
too low (given in the params) makes the same honest baseline exceed 100 %: invalid, as a miscounted token, a cache or
another batch would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spectrial.analysis.roofline import streamed_params_b
from spectrial.hosts import rapl
from spectrial.params import load_params
from spectrial.protocol.trial import run_trial
from spectrial.readers.explain import explain
from spectrial.readers.headline import headlines

pytestmark = pytest.mark.slow


def _params(tiny_params: dict[str, Any], out: Path, **over: Any) -> dict[str, Any]:
    data = {**tiny_params, "output_dir": str(out), "repeats": 2, "max_tokens": 24,
            "arms": [{"name": "baseline"}, {"name": "draft", "method": "draft"}]}
    data.update(over)
    return data


def test_the_bound_of_a_real_run_and_a_bandwidth_too_low_for_it(tiny_params, tmp_path):
    res = run_trial(load_params(data=_params(tiny_params, tmp_path / "a")), progress=False)
    m = res.manifest
    bb = m.bandwidth
    assert bb is not None and bb.bound_tok_s is not None, bb
    host = bb.host
    assert host is not None and host.bandwidth_gb_s == max(host.copy_gb_s, host.read_gb_s) > 1
    assert bb.bandwidth_gb_s == host.bandwidth_gb_s and bb.bandwidth_source.startswith("STREAM-style probe")
    # the GGUF header's streamed bytes: the tiny target's matrices (16 layers of 256 x 768, 4 heads, 2 KV heads,
    # 4,096-token vocabulary; f32) plus its 33 norm vectors, less the token embedding (a row lookup)
    matrices = streamed_params_b(16, 256, 768, 4, 2, 4096) * 1e9 * 4
    assert bb.weights_bytes == matrices + (16 * 2 + 1) * 256 * 4
    assert bb.kv_bytes_per_token == 2 * 16 * 2 * 64 * 2  # K and V, 16 layers, 2 KV heads of 64, f16
    base = m.arm("baseline")
    reqs = [r for r in res.requests.itertuples() if r.arm == "baseline" and r.phase == "measure" and not r.error]
    assert bb.context_tokens == pytest.approx(sum(r.prompt_len + r.tokens / 2 for r in reqs) / len(reqs))
    assert bb.bytes_per_step == bb.weights_bytes + bb.concurrency * bb.kv_bytes_per_token * bb.context_tokens
    assert bb.bound_tok_s == pytest.approx(bb.bandwidth_gb_s * 1e9 / bb.bytes_per_step)
    assert bb.baseline_share == pytest.approx(base.tok_s / bb.bound_tok_s) and 0 < bb.baseline_share < 1
    checks = {a.name: next(c for c in a.validity.checks if c.name == "bandwidth_bound") for a in m.arms}
    assert checks["baseline"].ok is True and checks["baseline"].value == pytest.approx(bb.baseline_share, abs=1e-3)
    draft = m.arm("draft")
    assert checks["draft"].value == pytest.approx(draft.tok_s / (draft.accept_len * bb.bound_tok_s), abs=1e-3)
    # one figure in every reader: the headline's line and explain's roofline are the check's and the record's
    text = headlines(m)[0].text()
    assert f"Bandwidth bound: the baseline at {checks['baseline'].summary}" in text
    assert explain(m).numbers.baseline_roofline_fraction == bb.baseline_share
    # issue 39 item 6 on this VM: no RAPL counters, no GPU: energy is n/a and says why (tests/analysis/test_energy.py
    # reads a RAPL tree and GPU power rows)
    if not Path("/sys/class/powercap").exists():
        assert base.energy is not None and base.energy.j_per_token is None and base.energy.note == rapl.NONE
        assert all(s.energy is not None and s.energy.source == rapl.NONE for s in m.starts)

    # the same honest baseline against a bandwidth a quarter of what it reached: above 100 %, invalid
    too_low = bb.baseline_share * bb.bandwidth_gb_s / 4
    res2 = run_trial(load_params(data=_params(tiny_params, tmp_path / "b", bandwidth_gb_s=too_low,
                                              arms=[{"name": "baseline"}])), progress=False)
    b2 = res2.manifest.arm("baseline")
    c2 = next(c for c in b2.validity.checks if c.name == "bandwidth_bound")
    assert res2.manifest.bandwidth.bandwidth_source == "params bandwidth_gb_s"
    assert res2.manifest.bandwidth.host is None  # a bandwidth given: nothing measured
    assert c2.ok is False and c2.value > 2 and c2.summary.startswith("physically impossible")
    assert "bandwidth_bound" in b2.validity.failed and "tokens counted twice" in c2.fix
