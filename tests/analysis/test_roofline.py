"""Decode roofline and the hardware table."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectrial.analysis import (
    DEFAULT_HARDWARE_PATH,
    bandwidth_utilisation,
    decode_roofline_tok_s,
    kv_cache_bytes,
    load_hardware,
    weight_bytes,
)
from spectrial.errors import ConfigError

EXPECTED_GPUS = {"h200_sxm", "h200_nvl", "h100_sxm", "h100_nvl", "h100_pcie", "a100_80gb_sxm", "rtx_pro_6000_blackwell",
                 "rtx_4090", "rtx_5090"}


def test_8b_f16_on_h200() -> None:
    hw = load_hardware()
    assert weight_bytes(8, 16) == 16e9
    assert decode_roofline_tok_s(weight_bytes(8, 16), hw["h200_sxm"].bandwidth_gb_s) == pytest.approx(300.0)
    # the LLAMACPP.md H200 baseline (Llama-3-8B shape, 8.03 B params, f16): 187.1 tok/s measured
    bound = decode_roofline_tok_s(weight_bytes(8.03, 16), hw["h200_sxm"].bandwidth_gb_s)
    assert bound == pytest.approx(298.9, abs=0.1)
    util = bandwidth_utilisation(187.1, weight_bytes(8.03, 16), hw["h200_sxm"].bandwidth_gb_s)
    assert 0.5 < util < 1.0


def test_moe_counts_active_weights() -> None:
    # a ~1T-parameter MoE with ~32 B active parameters in INT4 streams 16 GB per token
    assert weight_bytes(1000, 4, active_params_b=32) == pytest.approx(16e9)
    assert weight_bytes(1000, 4) == pytest.approx(500e9)
    with pytest.raises(ConfigError, match="active_params_b"):
        weight_bytes(8, 16, active_params_b=9)


def test_kv_cache_term() -> None:
    # Llama-3-8B: 32 layers x 8 KV heads x 128 dims x K and V x 2 bytes = 128 KiB per context token
    assert kv_cache_bytes(32, 8, 128, 1) == 131072
    kv = kv_cache_bytes(32, 8, 128, 8192)
    assert kv == pytest.approx(8192 * 131072)
    with_kv = decode_roofline_tok_s(16e9, 4800, kv_bytes=kv)
    assert with_kv == pytest.approx(4800e9 / (16e9 + kv))
    assert with_kv < decode_roofline_tok_s(16e9, 4800)


def test_hardware_table_contents() -> None:
    hw = load_hardware()
    assert set(hw) == EXPECTED_GPUS
    assert hw["h200_sxm"].memory_gb == 141 and hw["h200_sxm"].bandwidth_gb_s == 4800
    assert hw["h100_sxm"].bandwidth_gb_s == 3350
    assert hw["a100_80gb_sxm"].bandwidth_gb_s == 2039
    assert hw["rtx_pro_6000_blackwell"].memory_gb == 96
    assert hw["rtx_pro_6000_blackwell"].bandwidth_gb_s == hw["rtx_5090"].bandwidth_gb_s == 1792
    assert hw["rtx_4090"].bandwidth_gb_s == 1008
    assert "NVLink" not in hw["rtx_pro_6000_blackwell"].interconnect.replace("no NVLink", "")
    for key, spec in hw.items():
        assert "http" in spec.source, key
        assert spec.bf16_dense_tflops is None or spec.bf16_dense_tflops > 0


def test_default_path_is_the_repository_params() -> None:
    assert Path(__file__).resolve().parents[2] / "params" / "hardware.yaml" == DEFAULT_HARDWARE_PATH
    assert load_hardware(DEFAULT_HARDWARE_PATH) == load_hardware()


def test_load_hardware_validates(tmp_path: Path) -> None:
    bad = tmp_path / "hw.yaml"
    bad.write_text("gpus:\n  x:\n    name: X\n    memory_gb: 1\n    memory_type: a\n    bandwidth_gb_s: -1\n"
                   "    interconnect: none\n    source: https://example.invalid\n")
    with pytest.raises(ConfigError, match="bandwidth_gb_s"):
        load_hardware(bad)
    bad.write_text("gpus:\n  x:\n    name: X\n    colour: red\n")
    with pytest.raises(ConfigError, match="colour"):
        load_hardware(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_hardware(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("call", "argname"),
    [
        (lambda: decode_roofline_tok_s(0, 4800), "bytes_per_token"),
        (lambda: decode_roofline_tok_s(16e9, 0), "bandwidth_gb_s"),
        (lambda: decode_roofline_tok_s(16e9, 4800, kv_bytes=-1), "kv_bytes"),
        (lambda: weight_bytes(8, 0), "bits_per_weight"),
        (lambda: kv_cache_bytes(32, 8, 128, -5), "context_tokens"),
    ],
)
def test_bad_inputs_name_the_argument(call, argname: str) -> None:
    with pytest.raises(ConfigError, match=argname):
        call()


# --- issue 39 item 4: the bound a record carries, and what it judges ---------------------------------------------
def test_gpu_variants_are_told_apart_by_the_name_nvidia_smi_reports() -> None:
    from spectrial.analysis import match_gpu

    hw = load_hardware()
    names = {"NVIDIA H100 80GB HBM3": "h100_sxm", "NVIDIA H100 PCIe": "h100_pcie", "NVIDIA H100 NVL": "h100_nvl",
             "NVIDIA H200": "h200_sxm", "NVIDIA H200 NVL": "h200_nvl", "NVIDIA A100-SXM4-80GB": "a100_80gb_sxm",
             "NVIDIA GeForce RTX 4090": "rtx_4090", "Tesla T4": None}
    assert {n: match_gpu(n, hw) for n in names} == names
    # the variants' bandwidths differ: the PCIe card's bound is 60 % of the SXM part's
    assert hw["h100_pcie"].bandwidth_gb_s / hw["h100_sxm"].bandwidth_gb_s == pytest.approx(0.597, abs=0.001)


def test_the_published_70b_fp8_figure_is_physically_impossible() -> None:
    """ASKS.md: 1,700 tok/s published for a 70B FP8 model at batch 1-4 on one H200, whose bound is below 300."""
    from spectrial.analysis.roofline import bandwidth_bound
    from spectrial.analysis.validity import bandwidth_bound as check
    from spectrial.schema import ArmFigures, BandwidthBound

    hw = load_hardware()["h200_sxm"]
    weights = weight_bytes(70.6, 8)
    # Llama-3-70B: 80 layers, 8 KV heads of 128, fp16 cache, 1,000 tokens of context, 4 requests
    per_token = kv_cache_bytes(80, 8, 128, 1)
    bound, step = bandwidth_bound(weights, hw.bandwidth_gb_s, kv_bytes_per_token=per_token, context_tokens=1000,
                                  concurrency=4)
    assert step == weights + 4 * 1000 * per_token
    assert bound == pytest.approx(hw.bandwidth_gb_s * 1e9 / step) and bound < 70  # per request
    bb = BandwidthBound(bound_tok_s=bound, bandwidth_gb_s=hw.bandwidth_gb_s, bytes_per_step=step, concurrency=4)
    c = check(ArmFigures(tok_s=1700 / 4), False, bb)  # 1,700 tok/s over 4 requests
    assert c.ok is False and c.severity == "invalid" and c.value > 6 and c.summary.startswith("physically impossible")
    honest = check(ArmFigures(tok_s=0.76 * bound), False, bb)
    assert honest.ok is True and honest.value == pytest.approx(0.76) and honest.summary.startswith("76% of the")
    # a speculative arm is held to accept length x the bound; without an accept length it cannot be judged
    assert check(ArmFigures(tok_s=2.5 * bound, accept_len=3.0), True, bb).ok is True
    assert check(ArmFigures(tok_s=2.5 * bound, accept_len=2.0), True, bb).ok is False
    assert check(ArmFigures(tok_s=2.5 * bound), True, bb).ok is None
    assert check(ArmFigures(tok_s=10.0), False, BandwidthBound(note="the model's size is unknown")).summary == \
        "n/a: the model's size is unknown"
