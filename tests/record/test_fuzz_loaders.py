"""Property-based fuzzing of everything that reads a file a user hands spectrial (issue 37, part 4):

- the record loader (`spectrial.record.store`: manifest.json, requests.csv, stream.csv): arbitrary bytes, arbitrary JSON
  values, and mutations of the real committed records under outputs/examples (truncation at every length class, byte
  flips, fields of another type, missing fields, a future schema);
- the params loader (`spectrial.params.load_params` on arbitrary YAML text and mutations of the committed params files,
  `parse_overrides` on arbitrary `-p NAME=VALUE` strings);
- every log parser (`spectrial.logs`: parse, parse_tables per engine and kind, summary, ServerLog, the `spectrial logs
  parse|summary` command), on arbitrary bytes, text, files (plain, gzip, a cut .gz) and mutations of the real log
  fixtures under tests/fixtures/logs.

Each may return a result or raise one of spectrial's own errors (a SpectrialError subclass), nothing else; never hang
(a hard SIGALRM per example, HARD_S, fails the test; no hypothesis deadline: a per-example timing bound
failed under a loaded CI machine, which is load, not a hang); never allocate without bound
(the size of what comes back is checked, and the process's peak RSS after each target). A damaged record is never
rewritten: the bytes after a refused load are the bytes before.

Examples per target: SPECTRIAL_FUZZ_EXAMPLES (default 300, what CI runs); e.g. `SPECTRIAL_FUZZ_EXAMPLES=5000 pytest
tests/record/test_fuzz_loaders.py` for a long local run.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import resource
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from spectrial.errors import ConfigError, RecordDamaged, SpectrialError
from spectrial.logs import parse, parse_tables, registry, summary
from spectrial.logs.api import ServerLog
from spectrial.params import TrialParams, load_params, parse_overrides
from spectrial.record.store import (
    load_record,
    read_manifest,
    read_record_bytes,
    read_requests,
    read_table,
    record_file_exists,
    settle_record,
)
from spectrial.schema import Manifest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("SPECTRIAL_FUZZ_EXAMPLES", "300"))
HARD_S = 30.0  # a hang fails the example here, whatever the deadline says
PEAK_MB = 1024  # growth of the process's peak RSS allowed over one target
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture, HealthCheck.large_base_example])

RECORD_FILES = sorted([*REPO.glob("outputs/examples/**/manifest.json"), REPO / "tests/golden/gate/manifest.json",
                       *REPO.glob("tests/fixtures/records/*.json")])
RECORDS = {p.relative_to(REPO).as_posix(): p.read_bytes() for p in RECORD_FILES}
SMALL_RECORDS = [k for k, v in RECORDS.items() if len(v) < 100_000]  # the type-change mutations re-dump the JSON
RUN_DIRS = sorted({p.parent for p in REPO.glob("outputs/examples/**/requests.csv")})
TABLES = {(d.relative_to(REPO).as_posix(), name): read_record_bytes(d / name)  # as written (compacted: inflated)
          for d in RUN_DIRS for name in ("requests.csv", "stream.csv") if record_file_exists(d / name)}
PARAMS_FILES = sorted([*REPO.glob("params/*.yaml"), *REPO.glob("params/examples/*.yaml")])
PARAMS = {p.name: p.read_text() for p in PARAMS_FILES}
LOG_FILES = sorted((REPO / "tests" / "fixtures" / "logs").glob("*.log"))
LOGS = [p.read_bytes() for p in LOG_FILES]
LOG_LINES = [ln for text in LOGS for ln in text.splitlines() if ln.strip()]
KINDS = [f"{e}:{k}" for e, k in registry.kinds()]


# ------------------------------------------------------------------ the three properties
class Hang(BaseException):  # noqa: N818 - not an Exception: no `except Exception` in the code under test swallows it
    """An example ran past HARD_S."""


@contextlib.contextmanager
def hard_deadline(seconds: float = HARD_S) -> Iterator[None]:
    def ring(signum: int, frame: Any) -> None:
        raise Hang(f"no result after {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.fixture(autouse=True)
def bounded_memory() -> Iterator[None]:
    """No target may raise the process's peak RSS by more than PEAK_MB."""
    before = peak_mb()
    yield
    assert peak_mb() - before < PEAK_MB, f"peak RSS grew by {peak_mb() - before:.0f} MB"


def only_own_errors(call: Any, *args: Any, **kwargs: Any) -> Any:
    """call(*args) under the hard deadline; a result, or None after one of spectrial's own errors (kept in
    `only_own_errors.last`). Any other exception fails the test, with its traceback."""
    only_own_errors.last = None  # type: ignore[attr-defined]
    with hard_deadline():
        try:
            return call(*args, **kwargs)
        except SpectrialError as exc:
            assert str(exc).strip(), "an error without a message"
            only_own_errors.last = exc  # type: ignore[attr-defined]
            return None


@contextlib.contextmanager
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="spectrial-fuzz-") as d:
        yield Path(d)


# ------------------------------------------------------------------ mutations
@st.composite
def cut_points(draw: st.DrawFn, n: int) -> int:
    """A length below n from every class: nothing, one byte, a few, around the middle, just short of the end, any.
    (The class is drawn first: a one_of of equal integer strategies makes hypothesis' replay inconsistent.)"""
    top = max(n - 1, 0)
    lo, hi = {"nothing": (0, 0), "one byte": (min(1, top), min(1, top)), "a few": (0, min(64, top)),
              "the middle": (max(0, min(top, n // 2 - 512)), max(0, min(top, n // 2 + 512))),
              "the end": (max(0, n - 64), top), "any": (0, top)}[draw(st.sampled_from(
                  ["nothing", "one byte", "a few", "the middle", "the end", "any"]))]
    return draw(st.integers(lo, hi))


@st.composite
def flipped(draw: st.DrawFn, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(draw(st.integers(1, 8))):
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["xor", "byte", "delete", "insert", "dup"]))
        if op == "xor":
            data[i] ^= draw(st.integers(1, 255))
        elif op == "byte":
            data[i] = draw(st.sampled_from(list(b'\x00\xff"{}[],:\\\n0-.eE')))
        elif op == "delete":
            del data[i:i + draw(st.integers(1, 64))]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        else:
            j = draw(st.integers(i, min(len(data), i + 256)))
            data[i:i] = data[i:j]
    return bytes(data)


JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                        st.text(max_size=20), st.just(10 ** 40), st.just(-1), st.just(""), st.just(1e308))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                st.dictionaries(st.text(max_size=8), inner,
                                                                                max_size=4)), max_leaves=12)


def paths(value: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> Iterator[tuple[Any, ...]]:
    """Every path into a JSON value, to a depth of 5."""
    yield prefix
    if depth >= 5:
        return
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield from paths(v, (*prefix, k), depth + 1)


@st.composite
def retyped(draw: st.DrawFn, raw: bytes) -> bytes:
    """The record with one to three of its fields (at any depth) replaced by a value of another type, or removed."""
    data = json.loads(raw)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from([p for p in paths(data) if p][:4000]))
        parent = data
        for k in where[:-1]:
            parent = parent[k]
        if draw(st.booleans()) and isinstance(parent, dict):
            parent.pop(where[-1], None)
        else:
            parent[where[-1]] = draw(JSON_VALUES)
    return json.dumps(data).encode()


# ------------------------------------------------------------------ the record loader
def load_file(data: bytes, settle: bool = True) -> Manifest | None:
    """`data` as a run folder's manifest.json, loaded (a settle included); a refusal leaves the bytes as they were."""
    with folder() as d:
        (d / "manifest.json").write_bytes(data)
        m = only_own_errors(load_record, d, settle=settle)
        err = only_own_errors.last  # type: ignore[attr-defined]
        if m is None:
            assert isinstance(err, RecordDamaged), f"{type(err).__name__}: {err}"
            assert err.path.endswith("manifest.json") and err.problem
            assert (d / "manifest.json").read_bytes() == data, "a damaged record was rewritten"
            assert sorted(p.name for p in d.iterdir()) == ["manifest.json"], "something was written beside it"
        else:
            assert isinstance(m, Manifest)
            assert len(m.model_dump_json()) < 50 * len(data) + 1_000_000  # what comes back is bounded by the input
        return m


@SETTINGS
@given(st.binary(max_size=4096))
def test_record_loader_arbitrary_bytes(data: bytes) -> None:
    load_file(data)


@SETTINGS
@given(JSON_VALUES)
def test_record_loader_arbitrary_json(value: Any) -> None:
    m = load_file(json.dumps(value).encode())
    if not isinstance(value, dict) or "run_id" not in value or "status" not in value:
        assert m is None  # not an object, or without the fields every record has: refused


@SETTINGS
@given(st.data())
def test_record_loader_truncated_real_records(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(RECORDS)))
    raw = RECORDS[name]
    cut = data.draw(cut_points(len(raw.rstrip())))
    assert load_file(raw[:cut]) is None, f"{name} cut at {cut} of {len(raw)} bytes was accepted"
    err = only_own_errors.last  # type: ignore[attr-defined]
    assert any(w in err.problem for w in ("truncated", "empty")), err.problem


@pytest.mark.parametrize("cut", ['"budget": n', '"budget": nul', '"tok_s": 1.', '"tok_s": 1e', '"tok_s": -',
                                 '"reason": "caf\\u00', '"reason": "\\ud83d'])
def test_truncation_inside_a_literal_number_or_escape_is_called_truncated(cut: str) -> None:
    """Found by the truncation property: a file cut inside `null`, a number or a \\uXXXX escape fails to parse
    before its end, and is still a truncated file."""
    raw = json.dumps({"run_id": "r", "status": "ok", "reason": "x", "budget": None, "tok_s": 1.5})
    assert load_file((raw[:-1] + ", " + cut).encode()) is None
    assert only_own_errors.last.problem.startswith("truncated: "), only_own_errors.last  # type: ignore[attr-defined]


@SETTINGS
@given(st.data())
def test_record_loader_byte_flips_of_real_records(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(RECORDS)))
    load_file(data.draw(flipped(RECORDS[name])))


@SETTINGS
@given(st.data())
def test_record_loader_retyped_fields_of_real_records(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(SMALL_RECORDS))
    load_file(data.draw(retyped(RECORDS[name])))


def known_version(v: Any) -> bool:
    """1, 2 and 3, as a number, a whole float or digits (the loader reads them)."""
    if isinstance(v, str) and re.fullmatch(r"[0-9]{1,9}", v.strip()):
        v = int(v.strip())
    return isinstance(v, int | float) and not isinstance(v, bool) and v in (1, 2, 3)


def abandoned(raw: bytes) -> bytes:
    """A real record as a run SIGKILLed mid-way leaves it: `running`, its controller gone (this host, another boot)."""
    data = json.loads(raw)
    data.update(status="running", finished_at=None, controller={
        "host": socket.gethostname(), "boot_id": "a-boot-long-gone", "pid": 1, "create_time": 1.0, "command": "x"})
    return json.dumps(data).encode()


@SETTINGS
@given(st.data())
def test_settle_never_writes_what_it_cannot_parse(data: st.DataObject) -> None:
    """load_record's settle (an abandoned record marked failed) and settle_record (the kill step's) write only a record
    they parsed in full: a damaged one is refused with its bytes as they were; a readable one ends `failed`."""
    raw = abandoned(RECORDS[data.draw(st.sampled_from(SMALL_RECORDS))])
    how = data.draw(st.sampled_from(["as is", "retype", "flip", "cut", "future"]))
    if how == "retype":
        raw = data.draw(retyped(raw))
    elif how == "flip":
        raw = data.draw(flipped(raw))
    elif how == "cut":
        raw = raw[:data.draw(cut_points(len(raw)))]
    elif how == "future":
        raw = json.dumps({**json.loads(raw), "schema_version": 4}).encode()
    with folder() as d:
        (d / "manifest.json").write_bytes(raw)
        done = None
        if data.draw(st.booleans()):
            done = only_own_errors(settle_record, d)
            assert only_own_errors.last is None, only_own_errors.last  # type: ignore[attr-defined]
            if done is None:
                assert (d / "manifest.json").read_bytes() == raw
        m = load_file((d / "manifest.json").read_bytes())
        assert done is None or m is not None, f"settle_record wrote a record that does not load: {done}"
        if m is not None and how == "as is":
            assert m.status == "failed" and "abandoned" in (m.reason or "")
        if how in ("cut", "future"):
            assert m is None


@SETTINGS
@given(st.sampled_from(sorted(RECORDS)), st.one_of(st.integers(4, 10 ** 6), st.integers(-5, 0), st.text(max_size=6),
                                                   st.floats(), st.lists(st.integers(), max_size=2), st.booleans(),
                                                   st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))
       .filter(lambda v: not known_version(v)))
@example(name=sorted(RECORDS)[0], version="²")  # found by this test: a digit to str.isdigit that int() refuses
@example(name=sorted(RECORDS)[0], version="３")
@example(name=sorted(RECORDS)[0], version="0\x1f")  # found by the long run: str.strip drops \x1f, int() does not
def test_record_loader_schema_versions(name: str, version: Any) -> None:
    data = json.loads(RECORDS[name])
    data["schema_version"] = version
    try:
        payload = json.dumps(data).encode()
    except ValueError:  # NaN and inf are written as JSON extensions that the loader reads
        return
    assert load_file(payload) is None, version  # a future version, or no version number at all
    problem = only_own_errors.last.problem  # type: ignore[attr-defined]
    if isinstance(version, int) and not isinstance(version, bool) and version > 3:
        assert f"schema version {version}" in problem and "1 to 3" in problem, problem


def test_real_records_all_load() -> None:
    """The committed records are the mutations' seeds: each loads as it is (without a settle)."""
    for name, raw in RECORDS.items():
        assert load_file(raw, settle=False) is not None, name


def test_a_file_over_the_cap_is_refused_unread(tmp_path: Path) -> None:
    """A 300 MiB manifest.json (sparse: no disk used) is refused by its size, not read into memory."""
    path = tmp_path / "manifest.json"
    with path.open("wb") as fh:
        fh.truncate(300 << 20)
    before = peak_mb()
    with pytest.raises(RecordDamaged, match=r"too large to be a record file: 314572800 bytes, over the cap"):
        load_record(tmp_path)
    with pytest.raises(RecordDamaged, match="too large"):
        read_table(path)
    assert peak_mb() - before < 100
    assert path.stat().st_size == 300 << 20


# ------------------------------------------------------------------ requests.csv and stream.csv
def load_tables(files: dict[str, bytes]) -> None:
    with folder() as d:
        for name, data in files.items():
            (d / name).write_bytes(data)
        out = only_own_errors(read_requests, d)
        err = only_own_errors.last  # type: ignore[attr-defined]
        if out is None:
            assert isinstance(err, RecordDamaged) and Path(err.path).name in files, err
        else:
            n = sum(len(v) for v in out.values())
            assert n <= sum(d.count(b"\n") for d in files.values()) + 1
            from spectrial.analysis import serving

            only_own_errors(serving.latency_curves, out)  # what report and migrate do with them
            for reqs in out.values():
                only_own_errors(serving.serving_figures, [r for r in reqs if r.ok], expected_tokens_per_chunk=1.0,
                                n_boot=50)
        for name, data in files.items():
            assert (d / name).read_bytes() == data


@st.composite
def table_files(draw: st.DrawFn) -> dict[str, bytes]:
    run = draw(st.sampled_from(sorted({r for r, _ in TABLES})))
    files = {name: TABLES[(r, name)] for (r, name) in TABLES if r == run}
    target = draw(st.sampled_from(sorted(files)))
    raw = files[target]
    how = draw(st.sampled_from(["cut", "flip", "lines", "cells", "bytes"]))
    if how == "cut":
        raw = raw[:draw(cut_points(len(raw)))]
    elif how == "flip":
        raw = draw(flipped(raw))
    elif how == "bytes":
        raw = draw(st.binary(max_size=2048))
    elif how == "lines":
        lines = raw.split(b"\n")
        for _ in range(draw(st.integers(1, 4))):
            if not lines:
                break
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i + 1] = draw(st.sampled_from([[], [lines[i], lines[i]], [lines[i][:len(lines[i]) // 2]],
                                                   [lines[i] + b",extra,,"]]))
        raw = b"\n".join(lines)
    else:
        lines = raw.split(b"\n")
        i = draw(st.integers(0, min(len(lines) - 1, 40)))
        cells = lines[i].split(b",")
        j = draw(st.integers(0, len(cells) - 1))
        cells[j] = draw(st.sampled_from([b"", b"nan", b"inf", b"-1", b"1e400", b"abc", b'"', b"True", b"\xff",
                                         b"99999999999999999999999", b"-0.0"]))
        lines[i] = b",".join(cells)
        raw = b"\n".join(lines)
    files[target] = raw
    return files


@SETTINGS
@given(table_files())
def test_table_loader_mutations_of_real_tables(files: dict[str, bytes]) -> None:
    load_tables(files)


@SETTINGS
@given(st.binary(max_size=4096), st.one_of(st.none(), st.binary(max_size=2048)))
def test_table_loader_arbitrary_bytes(requests: bytes, stream: bytes | None) -> None:
    load_tables({"requests.csv": requests, **({"stream.csv": stream} if stream is not None else {})})


COMPACTED = {d.relative_to(REPO).as_posix(): (d / "stream.csv.gz").read_bytes()
             for d in RUN_DIRS if (d / "stream.csv.gz").is_file() and (d / "requests.csv").is_file()}


@SETTINGS
@given(st.sampled_from(sorted(COMPACTED) or [""]), st.sampled_from(["cut", "flip", "bytes", "tail"]), st.data())
def test_compacted_table_mutations(run: str, how: str, data: st.DataObject) -> None:
    """A compacted token-event table (`spectrial compact`) cut, flipped, replaced or given a tail: read as before,
    or RecordDamaged naming stream.csv.gz, never another error."""
    if not run:
        pytest.skip("no compacted record committed")
    raw = COMPACTED[run]
    if how == "cut":
        raw = raw[:data.draw(cut_points(len(raw)))]
    elif how == "flip":
        raw = data.draw(flipped(raw))
    elif how == "bytes":
        raw = data.draw(st.binary(max_size=2048))
    else:
        raw = raw + data.draw(st.binary(min_size=1, max_size=64))
    load_tables({"requests.csv": TABLES[(run, "requests.csv")], "stream.csv.gz": raw})


def test_real_tables_all_load() -> None:
    for run in RUN_DIRS:
        assert read_requests(run), run


# ------------------------------------------------------------------ the params loader
def load_yaml_text(text: str | bytes) -> TrialParams | None:
    with folder() as d:
        p = d / "params.yaml"
        p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        out = only_own_errors(load_params, p)
        err = only_own_errors.last  # type: ignore[attr-defined]
        assert out is not None or isinstance(err, ConfigError), f"{type(err).__name__}: {err}"
        return out


YAML_TOKENS = st.sampled_from(["", " ", "  ", "\n", ":", ": ", "- ", "-", "[", "]", "{", "}", ",", "&a ", "*a", "!!",
                               "!!python/object:os.system", "'", '"', "#", "|", ">", "?", "%YAML 1.2", "---", "...",
                               "model", "arms", "name", "method", "steps", "eagle3", "env", "NCCL_PROTO", "1", "-1",
                               "1e999", ".nan", "null", "true", "~", "<<: *a", "\t", "\x00", "é"])


@SETTINGS
@given(st.one_of(st.text(max_size=400), st.lists(YAML_TOKENS, max_size=60).map("".join),
                 st.binary(max_size=400)))
def test_params_loader_arbitrary_yaml(text: str | bytes) -> None:
    load_yaml_text(text)


@st.composite
def mutated_params(draw: st.DrawFn) -> str:
    text = PARAMS[draw(st.sampled_from(sorted(PARAMS)))]
    if draw(st.booleans()):
        lines = text.splitlines()
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(lines) - 1))
            lines[i] = draw(st.sampled_from([
                "", lines[i][: len(lines[i]) // 2], lines[i] + draw(YAML_TOKENS), " " + lines[i],
                lines[i].replace(":", ""), lines[i].replace(": ", ": [") if ": " in lines[i] else lines[i]]))
        return "\n".join(lines)
    data = yaml.safe_load(text)
    where = draw(st.sampled_from([p for p in paths(data) if p]))
    parent = data
    for k in where[:-1]:
        parent = parent[k]
    parent[where[-1]] = draw(JSON_VALUES)
    return yaml.safe_dump(data)


@SETTINGS
@given(mutated_params())
def test_params_loader_mutations_of_real_params(text: str) -> None:
    load_yaml_text(text)


NAMES = st.sampled_from(["steps", "topk", "arms.0.steps", "arms.1.method", "arms.9.name", "env.NCCL_PROTO", "env",
                         "decide", "decide.margin", "cluster.executor", "ssh.key_filename", "sampling.temperature",
                         "engine_config.threads", "workload", "max_tokens", "repeats", "output_dir", "x", "", ".", "a..b",
                         "arms.-1", "arms.x", "slo.ttft_ms", "limits.idle_s"])


@SETTINGS
@given(st.lists(st.one_of(st.text(max_size=30), st.tuples(NAMES, st.one_of(YAML_TOKENS, st.text(max_size=12),
                                                                               st.lists(YAML_TOKENS, max_size=8)
                                                                               .map("".join)))
                          .map(lambda t: f"{t[0]}={t[1]}")), max_size=5))
def test_params_overrides(pairs: list[str]) -> None:
    overrides = only_own_errors(parse_overrides, pairs)
    if overrides is None:
        assert isinstance(only_own_errors.last, ConfigError)  # type: ignore[attr-defined]
        return
    out = only_own_errors(load_params, REPO / "params" / "local.yaml", overrides)
    assert out is not None or isinstance(only_own_errors.last, ConfigError), only_own_errors.last  # type: ignore[attr-defined]


def test_params_alias_bomb_is_refused() -> None:
    """YAML aliases that expand to a billion values (a 'billion laughs' params file) are refused, not expanded."""
    lines = ['l0: &l0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9)]
    text = "model: m\nengine_config:\n" + "\n".join("  " + ln for ln in lines) + "\n"
    assert load_yaml_text(text) is None
    assert "values" in str(only_own_errors.last)  # type: ignore[attr-defined]


def test_params_deep_nesting_is_refused() -> None:
    assert load_yaml_text("model: m\nengine_config: " + "[" * 5000 + "]" * 5000 + "\n") is None
    assert load_yaml_text("model: m\nengine_config:\n  a: " + "{b: " * 3000 + "1" + "}" * 3000 + "\n") is None


# ------------------------------------------------------------------ the log parsers
def check_log(data: Any, n_lines: int, n_bytes: int, kinds: list[str] | None = None) -> None:
    """Parsed without an error or a parser error; rows bounded by the input (a table line may hold several records,
    none holds fewer than a byte)."""
    df = only_own_errors(parse, data, kinds)
    assert df is not None, only_own_errors.last  # type: ignore[attr-defined]
    assert df.attrs["parser_errors"] == [], df.attrs["parser_errors"]
    assert len(df) <= max(n_bytes, 1) and 0 <= df.attrs["unparsed_lines"] <= df.attrs["lines"] <= n_lines + 1
    assert only_own_errors(summary, df) is not None


@st.composite
def mutated_log(draw: st.DrawFn) -> bytes:
    raw = draw(st.sampled_from(LOGS))
    how = draw(st.sampled_from(["cut", "flip", "lines", "splice"]))
    if how == "cut":
        return raw[:draw(cut_points(len(raw)))]
    if how == "flip":
        return draw(flipped(raw))
    if how == "lines":
        lines = raw.split(b"\n")
        for _ in range(draw(st.integers(1, 6))):
            if not lines:
                break
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i + 1] = draw(st.sampled_from([[], [lines[i]] * 3, [lines[i][:len(lines[i]) // 2]],
                                                   [draw(st.sampled_from(LOG_LINES))]]))
        return b"\n".join(lines)
    return b"\n".join(draw(st.lists(st.sampled_from(LOG_LINES), min_size=1, max_size=30)))


@SETTINGS
@given(mutated_log(), st.one_of(st.none(), st.lists(st.sampled_from(KINDS), min_size=1, max_size=3)))
def test_log_parsers_mutations_of_real_logs(data: bytes, kinds: list[str] | None) -> None:
    check_log(data, data.count(b"\n") + 1, len(data), kinds)


@SETTINGS
@given(st.binary(max_size=4096), st.sampled_from(["bytes", "text", "lines", "file", "gz", "cut-gz"]))
def test_log_parsers_arbitrary_input(data: bytes, how: str) -> None:
    n = data.count(b"\n") + data.count(b"\r") + 1
    if how == "bytes":
        check_log(data, n, len(data))
    elif how == "text":
        check_log(data.decode("utf-8", "replace") + "\n", n + 1, 3 * len(data) + 1)
    elif how == "lines":
        check_log(data.split(b"\n"), n, 2 * len(data) + 1)
    else:
        with folder() as d:
            p = d / ("x.log.gz" if how != "file" else "x.log")
            body = gzip.compress(data) if how != "file" else data
            if how == "cut-gz":
                body = body[: max(len(body) // 2, 1)]
            p.write_bytes(body)
            check_log(p, n, len(data))
            log = only_own_errors(ServerLog, data.decode("utf-8", "replace"))
            assert log is not None
            only_own_errors(log.summary)
            only_own_errors(log.rows, "decode", None, 1, 10)
            only_own_errors(log.tail, 5)


@settings(SETTINGS, max_examples=max(EXAMPLES // 4, 10))
@given(st.lists(mutated_log(), min_size=1, max_size=3), st.sampled_from(["parse", "summary"]))
def test_logs_command(texts: list[bytes], command: str) -> None:
    """`spectrial logs parse|summary FILE...` (in-process: the same typer command) exits 0, or 2 with `error:`."""
    from typer.testing import CliRunner

    from spectrial.cli.logs import app

    with folder() as d:
        files = []
        for i, t in enumerate(texts):
            (d / f"{i}.log").write_bytes(t)
            files.append(str(d / f"{i}.log"))
        with hard_deadline():
            res = CliRunner().invoke(app, [command, *files])
        assert res.exit_code in (0, 2), (res.exit_code, res.output, res.exception)
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)


def test_log_tables_parse_every_fixture() -> None:
    for p in LOG_FILES:
        tables = parse_tables(p)
        assert tables.parser_errors == [], p
        assert isinstance(tables.wide(), pd.DataFrame)


def test_every_target_is_fuzzed() -> None:
    """The seeds exist: records, tables, params files, log fixtures."""
    assert len(RECORDS) >= 10 and len(TABLES) >= 10 and len(PARAMS) >= 10 and len(LOGS) >= 30
    assert {"requests.csv", "stream.csv"} <= {n for _, n in TABLES} and len(COMPACTED) >= 5
    assert read_manifest(RECORD_FILES[0]).run_id
