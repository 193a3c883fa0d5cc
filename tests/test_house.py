"""The house's shape, held against the code: no import circle, a bounded number of levels, no reader below the
protocol, engines that own their knowledge, and typed seams (issue 28). `python scripts/import_graph.py` prints
the same facts for people."""

from __future__ import annotations

import ast
import importlib.util
import io
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(spec)
sys.modules["import_graph"] = import_graph
spec.loader.exec_module(import_graph)

MAX_LEVELS = 12
DICT_ANY_BEFORE = 345  # `dict[str, Any]` in lib/ before issue 28 (scripts/import_graph.py's count)
LOOSE_BEFORE = 373  # with Mapping[str, Any], dict[str, object], dict[str, JsonValue]: no swap counts as a cut

# the protocol: what runs a trial; no reader (the readers wing, the doctor, the notebook plumbing) below it
PROTOCOL = ("spectrial.progress", "spectrial.servers.lifecycle", "spectrial.measure.bench", "spectrial.protocol.session", "spectrial.protocol.trial",
            "spectrial.protocol.group", "spectrial.engines", "spectrial.hosts.local", "spectrial.hosts.ssh", "spectrial.record.store",
            "spectrial.analysis.figures", "spectrial.analysis.serving", "spectrial.schema", "spectrial.params",
            "spectrial.cluster.fanout", "spectrial.hosts.srun")
READERS = ("spectrial.readers", "spectrial.readers.diagnose", "spectrial.cli.notebooks")
RENDERING = ("plotly", "IPython", "nbformat", "ipywidgets")


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return import_graph.graph()


def _below(edges: dict[str, set[str]], module: str) -> set[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        for nxt in edges[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _is(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_tool_finds_a_circle_and_counts_levels(tmp_path: Path) -> None:
    """The checks below can fail: a made-up package with a circle and a chain of three."""
    pkg = tmp_path / "spectrial"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from spectrial import b\n")
    (pkg / "b.py").write_text("def f():\n    from spectrial.a import x  # a lazy import is still an import\n")
    (pkg / "c.py").write_text("import spectrial.a\n")
    (pkg / "d.py").write_text("from . import c\n")
    edges = import_graph.graph(tmp_path)
    assert import_graph.circles(edges) == [["spectrial.a", "spectrial.b"]]
    levels = import_graph.levels(edges)
    assert levels["spectrial.a"] == levels["spectrial.b"] == 1
    assert (levels["spectrial.c"], levels["spectrial.d"]) == (2, 3)


def test_no_import_circle(edges: dict[str, set[str]]) -> None:
    assert import_graph.circles(edges) == []


def test_levels_are_bounded(edges: dict[str, set[str]]) -> None:
    levels = import_graph.levels(edges)
    top = max(levels.values())
    assert top <= MAX_LEVELS, f"{top} levels: " + " -> ".join(import_graph.tallest_chain(edges))


@pytest.mark.parametrize("module", PROTOCOL)
def test_no_reader_below_the_protocol(edges: dict[str, set[str]], module: str) -> None:
    below = {m for m in _below(edges, module) if _is(m, READERS)}
    assert not below, f"{module} imports readers: {sorted(below)}"


def _code_tokens(path: Path) -> list[str]:
    """Names and strings of a file, its docstrings and comments left out."""
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(first.lineno)
    return [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.NAME or (tok.type == tokenize.STRING and tok.start[0] not in docstrings)]


def test_group_names_no_engine() -> None:
    tokens = _code_tokens(ROOT / "lib" / "spectrial" / "group.py")
    named = sorted({t for t in tokens if any(e in t.lower() for e in ("sglang", "vllm", "llama", "rpc_workers"))})
    assert not named, f"group.py knows engines: {named} (an engine hook should)"


def test_the_tokens_check_can_fail(tmp_path: Path) -> None:
    f = tmp_path / "g.py"
    f.write_text('"""sglang in a docstring is fine."""\nif engine.name == "sglang":\n    pass\n')
    tokens = _code_tokens(f)
    assert '"sglang"' in tokens and not any("docstring" in t for t in tokens)


def test_readers_analysis_apart_from_rendering() -> None:
    """Modules of the readers wing that compute numbers and prose import no plotting or display library; rendering
    lives in the wing's render modules."""
    wing = ROOT / "lib" / "spectrial" / "readers"
    offenders = {}
    for path in sorted(wing.rglob("*.py")):
        rel = path.relative_to(wing).as_posix()
        if rel.startswith("render") or "/render" in rel:
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module)
        bad = sorted(m for m in imported if m.split(".")[0] in RENDERING)
        if bad:
            offenders[rel] = bad
    assert not offenders, f"analysis modules import rendering: {offenders}"


def test_dict_str_any_at_least_halved() -> None:
    count = import_graph.dict_any_count()
    assert count <= DICT_ANY_BEFORE // 2, f"{count} dict[str, Any] in lib/ (was {DICT_ANY_BEFORE}; at most half)"
    loose = import_graph.dict_any_count(pattern=import_graph.LOOSE_MAPS)
    assert loose <= LOOSE_BEFORE // 2, f"{loose} maps of untyped values in lib/ (was {LOOSE_BEFORE}; at most half)"


# what a notebook may import: the readers wing, the doctor, the notebook plumbing, and the protocol's doors (the
# trial, the sweep, the NCCL check, params and records, the figures' one computation, pure analysis, model shapes)
NOTEBOOK_IMPORTS = ("spectrial.readers", "spectrial.readers.diagnose", "spectrial.cli.notebooks", "spectrial.protocol.trial",
                    "spectrial.sweep", "spectrial.nccl", "spectrial.params", "spectrial.record.store", "spectrial.schema",
                    "spectrial.analysis.figures", "spectrial.analysis.serving", "spectrial.analysis.validity", "spectrial.errors",
                    "spectrial.analysis", "spectrial.models")


def _spectrial_imports(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("spectrial"):
            found |= {f"{node.module}.{a.name}" if node.module == "spectrial" else node.module for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("spectrial")}
    return found


def test_notebooks_import_only_the_readers_and_the_protocol() -> None:
    stray = {}
    for path in sorted((ROOT / "notebooks").glob("*.py")):
        bad = sorted(m for m in _spectrial_imports(path.read_text()) if not _is(m, NOTEBOOK_IMPORTS))
        if bad:
            stray[path.name] = bad
    assert not stray, f"notebooks reach past the readers and the protocol: {stray}"
    assert _spectrial_imports("from spectrial import engines\nimport spectrial.logs.driver\n") == {
        "spectrial.engines", "spectrial.logs.driver"}  # the check can see what it must refuse
