"""Memory-bandwidth roofline of single-stream decode, and the hardware table it reads.

At batch 1 each decoded token streams every active weight (plus the KV cache read so far) from GPU
memory once, so tok/s <= bandwidth / bytes_per_token. Units: bytes, GB = 1e9 bytes, GB/s = 1e9 B/s
(vendor datasheets use decimal units). ``load_hardware`` is the only function here that does I/O.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spectrial import house
from spectrial.analysis._checks import check_nonneg, check_positive
from spectrial.errors import ConfigError

__all__ = [
    "DEFAULT_HARDWARE_PATH",
    "GpuSpec",
    "bandwidth_bound",
    "bandwidth_utilisation",
    "decode_roofline_tok_s",
    "kv_cache_bytes",
    "load_hardware",
    "gpu_key",
    "match_gpu",
    "weight_bytes",
]

DEFAULT_HARDWARE_PATH = house.find("params/hardware.yaml")  # the checkout's, or the installed package's copy


class GpuSpec(BaseModel):
    """One accelerator's vendor figures (decimal units, as on the datasheet)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Marketing name and form factor, e.g. 'NVIDIA H200 SXM'")
    aliases: list[str] = Field(default_factory=list, description="The names nvidia-smi reports for this variant "
                                                                 "(e.g. 'NVIDIA H100 80GB HBM3' for the SXM part)")
    memory_gb: float = Field(gt=0, description="GPU memory capacity in GB (1e9 bytes)")
    memory_type: str = Field(description="Memory technology, e.g. HBM3e, GDDR7")
    bandwidth_gb_s: float = Field(gt=0, description="Peak memory bandwidth in GB/s (1e9 bytes/s)")
    bf16_dense_tflops: float | None = Field(
        default=None, gt=0, description="Peak dense (no sparsity) BF16 tensor TFLOPS; null where not published")
    interconnect: str = Field(description="GPU-to-GPU / host links, e.g. 'NVLink 4 900 GB/s; PCIe Gen5 x16'")
    source: str = Field(min_length=8, description="Vendor datasheet or whitepaper the figures come from (name + URL)")
    notes: str = Field(default="", description="Caveats: sparsity footnotes, variants, derived values")


class _HardwareFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: dict[str, GpuSpec] = Field(description="GPU key (lower_snake) -> its figures")


def load_hardware(path: str | Path | None = None) -> dict[str, GpuSpec]:
    """Read and validate the hardware table (default: the repository's params/hardware.yaml).

    Returns {key: GpuSpec}, e.g. ``load_hardware()["h200_sxm"].bandwidth_gb_s == 4800``.
    """
    p = Path(path) if path is not None else DEFAULT_HARDWARE_PATH
    if not p.is_file():
        raise ConfigError(f"hardware table {p} not found: pass path= to a YAML file with a top-level 'gpus:' map")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"hardware table {p} is not valid YAML: {exc}") from exc
    try:
        return dict(_HardwareFile.model_validate(raw).gpus)
    except ValidationError as exc:
        raise ConfigError(f"hardware table {p} does not match the GpuSpec schema: {exc}") from exc


def match_gpu(name: str, table: dict[str, GpuSpec]) -> str | None:
    """The table key of a GPU as nvidia-smi names it: an exact alias (the variant: 'NVIDIA H100 80GB HBM3' is the
    SXM part, 'NVIDIA H100 PCIe' the PCIe card), else the longest table name that the reported name starts with or
    that starts with it; None when nothing matches."""
    low = name.strip().lower()
    for key, spec in table.items():
        if low in (a.lower() for a in spec.aliases):
            return key
    hits = [(len(spec.name), key) for key, spec in table.items()
            if spec.name.lower().startswith(low) or low.startswith(spec.name.lower())]
    return max(hits)[1] if hits else None


def gpu_key(name: str, table: dict[str, GpuSpec] | None = None) -> str:
    """`match_gpu` that refuses: the table key of the GPU nvidia-smi calls `name`, or a ConfigError naming it and
    what to add (the device scripts call this before any server start, so an unknown GPU costs no start)."""
    table = load_hardware() if table is None else table
    key = match_gpu(name, table) if name.strip() else None
    if key is None:
        raise ConfigError(f"GPU {name.strip() or '(none found by nvidia-smi)'!r} is not in params/hardware.yaml "
                          f"(known: {', '.join(sorted(table))}): add an entry for it there (name, aliases as "
                          "nvidia-smi prints the name, bandwidth_gb_s from its datasheet) and run again")
    return key


def weight_bytes(params_b: float, bits_per_weight: float, active_params_b: float | None = None) -> float:
    """Bytes of weights streamed per decoded token: P_active * 1e9 * bits_per_weight / 8.

    ``params_b`` is the total parameter count in billions; for a mixture-of-experts model pass
    ``active_params_b`` (the parameters one token touches) and that is what is counted. Example:
    an 8B model in f16 -> 16e9 bytes.
    """
    total = check_positive(params_b, "params_b")
    bits = check_positive(bits_per_weight, "bits_per_weight")
    active = total
    if active_params_b is not None:
        active = check_positive(active_params_b, "active_params_b")
        if active > total:
            raise ConfigError(f"active_params_b ({active:g}) exceeds params_b ({total:g}): "
                              "active parameters are a subset of all parameters")
    return active * 1e9 * bits / 8.0


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, context_tokens: float,
                   bytes_per_element: float = 2.0, batch_size: int = 1) -> float:
    """KV-cache bytes read per decode step: 2 (K and V) * layers * kv_heads * head_dim * context * bytes * batch."""
    return (2.0 * check_positive(n_layers, "n_layers") * check_positive(n_kv_heads, "n_kv_heads")
            * check_positive(head_dim, "head_dim") * check_nonneg(context_tokens, "context_tokens")
            * check_positive(bytes_per_element, "bytes_per_element") * check_positive(batch_size, "batch_size"))


def decode_roofline_tok_s(bytes_per_token: float, bandwidth_gb_s: float, kv_bytes: float = 0.0) -> float:
    """Upper bound on batch-1 decode speed: bandwidth_gb_s * 1e9 / (bytes_per_token + kv_bytes) tok/s.

    Example: 16e9 bytes per token on an H200 (4800 GB/s) -> 300 tok/s. For tensor parallelism over n
    GPUs pass the aggregate bandwidth (n * per-GPU) with the full byte count.
    """
    total = check_positive(bytes_per_token, "bytes_per_token") + check_nonneg(kv_bytes, "kv_bytes")
    return check_positive(bandwidth_gb_s, "bandwidth_gb_s") * 1e9 / total


def bandwidth_utilisation(measured_tok_s: float, bytes_per_token: float, bandwidth_gb_s: float,
                          kv_bytes: float = 0.0) -> float:
    """Fraction of the roofline reached: measured_tok_s / decode_roofline_tok_s(...)."""
    return (check_positive(measured_tok_s, "measured_tok_s")
            / decode_roofline_tok_s(bytes_per_token, bandwidth_gb_s, kv_bytes))


def streamed_params_b(n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int, n_vocab: int) -> float:
    """Billions of weights a Llama-shaped model reads per decoded token: every matrix but the token embedding
    (a row lookup), i.e. attention q/k/v/o, the three MLP matrices and the output head."""
    hd = n_embd // n_head
    per_layer = n_embd * n_head * hd * 2 + n_embd * n_head_kv * hd * 2 + 3 * n_embd * n_ff
    return float(n_layer * per_layer + n_vocab * n_embd) / 1e9


def bandwidth_bound(weights_bytes: float, bandwidth_gb_s: float, *, kv_bytes_per_token: float | None = None,
                    context_tokens: float | None = None, concurrency: int = 1) -> tuple[float, float]:
    """(tok/s per request at most, bytes one decode step reads): a step of `concurrency` requests streams the
    weights once and each request's KV cache (`kv_bytes_per_token` x `context_tokens`) once, and yields one token
    per request: bound = bandwidth / (weights + concurrency x KV). The batch-1 roofline (`decode_roofline_tok_s`)
    with the batch's KV. Example: 16e9 weight bytes, 4800 GB/s, no KV -> 300 tok/s."""
    kv = (kv_bytes_per_token or 0.0) * (context_tokens or 0.0) * check_positive(concurrency, "concurrency")
    step = check_positive(weights_bytes, "weights_bytes") + kv
    return decode_roofline_tok_s(weights_bytes, bandwidth_gb_s, kv), step
