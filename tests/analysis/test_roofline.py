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

EXPECTED_GPUS = {"h200_sxm", "h100_sxm", "a100_80gb_sxm", "rtx_pro_6000_blackwell", "rtx_4090", "rtx_5090"}


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
