"""The original case (SEED_CASE.md) as a record, and the numbers notebook 90 tells its story with."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from spectrial.readers import casestudy
from spectrial.readers.casestudy import key_numbers, load_case

REPO = Path(__file__).resolve().parents[2]
SEED = REPO.parent / "shared" / "reference" / "SEED_CASE.md"
NOTEBOOK = REPO / "notebooks" / "90_case_kimi_k25_pcie.ipynb"


def tau(a: float, k: int) -> float:
    """Leviathan et al. 2023: (1 - a^(k+1)) / (1 - a), written as the geometric sum."""
    return sum(a ** i for i in range(k + 1))


def test_key_numbers_hand_worked() -> None:
    kn = key_numbers()  # 82 tok/s, 30 ms cycle, accept length 2.1 at k=2, target 150 tok/s
    assert kn.break_even_accept_len == pytest.approx(30 * 82 / 1000)  # 2.46
    assert kn.tok_s_at_accept_len == pytest.approx(2.1 / 0.030)  # 70 tok/s
    assert kn.speedup_at_accept_len == pytest.approx(70 / 82)
    assert tau(kn.alpha_of_accept_len, 2) == pytest.approx(2.1, abs=1e-9)  # alpha ~0.662
    assert kn.accept_len_for_target == pytest.approx(4.5)  # 150 tok/s x 30 ms
    assert kn.alpha_for_target[2] is None and kn.alpha_for_target[3] is None  # k + 1 <= 4 < 4.5
    for k in (4, 5, 6, 8):
        assert tau(kn.alpha_for_target[k], k) == pytest.approx(4.5, abs=1e-9)
    assert kn.alpha_for_target[5] == pytest.approx(0.8834, abs=1e-4)


def test_record_holds_the_seed_figures() -> None:
    case = load_case()
    assert case.kind == "case" and case.status == "ok" and len(case.arms) == 8
    arms = {a.name: a for a in case.arms}
    assert [a.order for a in case.arms] == list(range(1, 9))
    assert arms["baseline-restart"].tok_s == 82.2 and arms["eagle3-k2-interactive"].accept_len == 2.1
    assert arms["eagle3-k2-restart"].verify_ms == pytest.approx(28.95)
    if not SEED.is_file():
        pytest.skip(f"{SEED} not present: the per-row check against SEED_CASE.md needs it")
    table = [ln for ln in SEED.read_text().splitlines() if ln.startswith("| earlier") or ln.startswith("| later")]
    assert len(table) == 8
    for row, record in zip(table, case.arms, strict=True):
        arm = record.model_dump(exclude_none=True)
        assert row.split("|")[1].strip() == arm["session"]
        numbers = {float(x) for x in re.findall(r"\d+(?:\.\d+)?", row)}
        for key in ("tok_s", "tok_s_min", "tok_s_max", "verify_ms", "verify_ms_min", "verify_ms_max"):
            if arm.get(key) is not None and not (key in ("tok_s", "verify_ms") and f"{key}_min" in arm):
                assert float(arm[key]) in numbers, (arm["name"], key, row)


def test_derived_figures_and_comparisons() -> None:
    case = load_case()
    t = casestudy.case_table(case).set_index("arm")
    assert t.loc["eagle3-k2-restart", "cycle_ms"] == pytest.approx(28.95 / 0.97)
    assert t.loc["eagle3-k2-restart", "break_even_accept_len"] == pytest.approx(28.95 / 0.97 / (1000 / 82.2))
    assert t.loc["eagle3-k3-nohup", "accept_len"] == pytest.approx(60.0 * 30.64 / 0.9695 / 1000)
    assert pd.isna(t.loc["eagle3-k2-interactive", "baseline_arm"])  # its environment was never recorded
    assert casestudy.baseline_drift(case) == pytest.approx(82.2 / 88.9 - 1)
    p = casestudy.pair(case, "eagle3-k2-interactive", "eagle3-k2-restart")
    assert p.tok_s_ratio == pytest.approx(94 / 60.5)
    reasons = " ".join(p.reasons)
    assert "different sessions" in reasons and "never recorded" in reasons and "single measurements" in reasons
    needed = casestudy.needed_table(case, 150).set_index("arm")
    assert needed.loc["eagle3-k5-untuned", "alpha_needed"] == pytest.approx(0.8443, abs=1e-4)
    assert pd.isna(needed.loc["eagle3-k2-restart", "alpha_needed"])  # 4.48 tokens > k + 1 = 3
    cov = casestudy.coverage(case)
    assert not cov["env_check"].any() and not cov["tok_s_values"].any()


def test_committed_notebook_states_the_key_numbers() -> None:
    nb = json.loads(NOTEBOOK.read_text())
    text = json.dumps([c.get("outputs", []) for c in nb["cells"] if c["cell_type"] == "code"])
    for claim in ("**2.46 baseline tokens**", "**70.0 tok/s**", "0.85x the baseline", "**4.50 tokens per cycle**",
                  "k=5: 0.883", "**-7.5%**", "**9.2 %**"):
        assert claim in text, claim
    assert '"output_type": "error"' not in text
