"""spectrial.logs: every era of SGLang, vLLM and llama.cpp output, seed-style profile lines, NCCL debug
output and nvidia-smi, read into one pandas DataFrame.

    >>> from spectrial.logs import parse, summary
    >>> df = parse("server.log.gz")            # a path, log text, bytes or an iterable of lines
    >>> df[df.kind == "decode"][["line", "timestamp", "accept_len", "gen_throughput"]]
    >>> summary(df)                            # per engine and kind: count and medians

The schema and units are described in :mod:`spectrial.logs.core`; each engine module's docstring lists its
kinds and columns. A new line format is one small function registered with :func:`register`.
"""

from spectrial.logs import llamacpp, nccl, nvidia_smi, profile, sglang, tables, vllm  # noqa: F401  (register)
from spectrial.logs.core import BlockFormat, LineFormat, Registry, Window, parse, register, registry, summary

__all__ = ["BlockFormat", "LineFormat", "Registry", "Window", "parse", "register", "registry", "summary"]
