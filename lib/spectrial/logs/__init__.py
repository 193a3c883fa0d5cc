"""spectrial.logs: every era of SGLang, vLLM and llama.cpp output, seed-style profile lines, NCCL debug
output, nvidia-smi and uvicorn access lines, read into one pandas DataFrame per record kind.

    >>> from spectrial.logs import parse_tables, parse, summary
    >>> tables = parse_tables("server.log.gz")  # a path, log text, bytes or an iterable of lines
    >>> tables["sglang:decode"][["line", "timestamp", "accept_len", "gen_throughput"]]
    >>> summary(tables)                        # per engine and kind: count and medians
    >>> df = parse("server.log.gz")            # the one wide frame of every kind (= tables.wide())

The schema and units are described in :mod:`spectrial.logs.api`; each engine module's docstring lists its
kinds and columns. A new format is data (:class:`LineFormat`, with a :class:`Finalizer` where its rows merge),
a block reader (:class:`BlockFormat`) or one small function (:func:`register`): see :mod:`spectrial.logs.formats`
and docs/LOGS.md.

Modules: ``api`` (parse_tables, parse, summary, schema; ``ServerLog``: one server's log, parsed once), ``result`` (LogTables: the tables per kind,
``wide()``), ``formats`` (LineFormat, BlockFormat: the extension point), ``vector`` (the toolkit of vectorised block readers), ``registry``, ``source`` (paths, gzip, text,
iterables), ``chunks`` (lines as arrow arrays, Window, ANSI), ``driver`` (the marker search, per-chunk
dispatch, a format's records as columns), ``parallel`` (a large file in segments, read by worker processes), ``table`` (the tables per kind),
``columns``, ``text`` and ``pyrepr`` (types and conversions, regex
fragments, Python-repr dumps); one module per engine (``sglang``, ``vllm``, ``llamacpp``, ``nccl``,
``nvidia_smi``, ``profile``, ``tables``, ``http``).
"""

from spectrial.logs import http, llamacpp, nccl, nvidia_smi, profile, sglang, tables, vllm  # noqa: F401  (register)
from spectrial.logs.api import parse, parse_tables, summary
from spectrial.logs.chunks import Window
from spectrial.logs.formats import BlockFormat, Finalizer, LineFormat
from spectrial.logs.registry import Registry, register, registry
from spectrial.logs.result import KindTable, LogTables, ParserError

__all__ = ["BlockFormat", "Finalizer", "KindTable", "LineFormat", "LogTables", "ParserError", "Registry", "Window",
           "parse", "parse_tables", "register", "registry", "summary"]
