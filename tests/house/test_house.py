"""The house's shape, held against the code: no import circle, a bounded number of levels, no reader below the
protocol, engines that own their knowledge, and typed seams (issue 28). `python scripts/import_graph.py` prints
the same facts for people."""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(spec)
sys.modules["import_graph"] = import_graph
spec.loader.exec_module(import_graph)

MAX_LEVELS = 13  # the doors' `python -m spectrial.cli` (cli/__main__.py) stands one above the door itself
MAX_TOP = 8  # modules flat at lib/spectrial's top (issue 38: 41 before)
DICT_ANY_BEFORE = 345  # `dict[str, Any]` in lib/ before issue 28 (scripts/import_graph.py's count)
LOOSE_BEFORE = 373  # with Mapping[str, Any], dict[str, object], dict[str, JsonValue]: no swap counts as a cut

# Rules by folder: a path prefix under lib/spectrial/ names a room, so a file added later is covered by its folder.
ENGINE_ROOMS = ("engines/", "logs/")  # only these name an engine in code
RENDER_ROOMS = ("readers/render/", "cli/")  # only these draw (plotly) or display (IPython, nbformat, papermill)
RENDERING = ("plotly", "IPython.display", "nbformat", "papermill")
# Engine names still standing outside ENGINE_ROOMS, by room, after issue 38 (150 in 18 modules when it made the rule;
# a ratchet: a room's count can only fall, a room not listed must stay at zero, one that reaches zero leaves the
# list): the `provision` commands' names, the params' engine choice, the doctor's engine-specific detectors, and two
# record fields (sglang_version, vllm_version) that old records hold. Code names only: an
# identifier holding an engine's name, or a string that is an engine's key ("sglang", "vllm:..."); prose is free.
ENGINE_NAMES_LEFT = {"cli/__init__.py": 10, "params/__init__.py": 4, "readers/diagnose/acceptance.py": 8,
                     "readers/diagnose/capacity.py": 11, "readers/diagnose/context.py": 9, "schema.py": 2}
LIB = ROOT / "lib" / "spectrial"


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


def test_no_import_runs_up_a_floor(edges: dict[str, set[str]]) -> None:
    """Every room (folder) stands on a floor (scripts/import_graph.py FLOORS) and imports only its floor or below:
    no reader below the protocols, no protocol below the engines, nothing below the doors imports a command."""
    arrows = import_graph.back_arrows(edges)
    assert not arrows, "imports up a floor (or rooms on no floor): " + "; ".join(f"{a} -> {b}" for a, b in arrows)


def test_the_floor_check_can_fail(tmp_path: Path) -> None:
    pkg = tmp_path / "spectrial"
    for sub in ("hosts", "readers", "newroom"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "hosts" / "ssh.py").write_text("from spectrial.readers import x\n")
    (pkg / "readers" / "x.py").write_text("import spectrial.hosts.ssh\n")
    (pkg / "newroom" / "a.py").write_text("")
    found = import_graph.back_arrows(import_graph.graph(tmp_path))
    assert ("spectrial.hosts.ssh", "spectrial.readers.x") in found and ("spectrial.newroom.a", "?") in found
    assert not any(a == "spectrial.readers.x" for a, _ in found)  # down is fine


def test_few_modules_flat_at_the_top() -> None:
    top = import_graph.top_modules()
    assert len(top) <= MAX_TOP, f"{len(top)} modules flat at lib/spectrial's top: {top}; give them a folder"


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


_ENGINE_KEY = re.compile(r"^(llamacpp|llama\.cpp|llama-server|llama_server|sglang|vllm)([:_\-.].*)?$", re.I)
_ENGINE_IDENT = re.compile(r"sglang|vllm|llamacpp|llama_server", re.I)


def _engine_names(path: Path) -> list[str]:
    """Code that names an engine: identifiers holding an engine's name and strings that are an engine's key."""
    found = []
    for tok in _code_tokens(path):
        if tok.isidentifier():
            if _ENGINE_IDENT.search(tok):
                found.append(tok)
            continue
        try:
            value = ast.literal_eval(tok)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, str) and _ENGINE_KEY.match(value.strip()):
            found.append(tok)
    return found


def _rooms(prefixes: tuple[str, ...]) -> list[tuple[str, Path]]:
    return [(p.relative_to(LIB).as_posix(), p) for p in sorted(LIB.rglob("*.py"))
            if not p.relative_to(LIB).as_posix().startswith(prefixes)]


def test_only_engines_and_logs_name_an_engine() -> None:
    over = {}
    for rel, path in _rooms(ENGINE_ROOMS):
        names = _engine_names(path)
        if len(names) > ENGINE_NAMES_LEFT.get(rel, 0):
            over[rel] = (len(names), ENGINE_NAMES_LEFT.get(rel, 0), sorted(set(names))[:6])
    assert not over, f"engines named outside {ENGINE_ROOMS} (count, allowed, examples): {over}; an engine hook should"
    cleared = [rel for rel in ENGINE_NAMES_LEFT if not (LIB / rel).is_file() or not _engine_names(LIB / rel)]
    assert not cleared, f"{cleared} name no engine now: take them off ENGINE_NAMES_LEFT"


def test_the_tokens_check_can_fail(tmp_path: Path) -> None:
    f = tmp_path / "g.py"
    f.write_text('"""sglang in a docstring is fine."""\nif engine.name == "sglang":\n    pass\n')
    tokens = _code_tokens(f)
    assert '"sglang"' in tokens and not any("docstring" in t for t in tokens)
    assert _engine_names(f) == ['"sglang"']
    f.write_text('x = "Run SGLang with --enable-metrics"\ny = "vllm:num_requests_running"\nload_vllm_cpu = 1\n')
    assert _engine_names(f) == ['"vllm:num_requests_running"', "load_vllm_cpu"]  # prose is free


def _imports(path: Path) -> set[str]:
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imported.add(node.module)
    return imported


def test_only_the_render_wing_and_the_doors_draw() -> None:
    """Modules that compute numbers and prose (the readers' analysis, the doctor, the watch's recorder, everything
    below) import no plotting or notebook-display library; drawing lives in readers/render/ and the commands in cli/
    (the watch's command draws what its recorder wrote)."""
    offenders = {rel: bad for rel, path in _rooms(RENDER_ROOMS)
                 if (bad := sorted(m for m in _imports(path) if _is(m, RENDERING)))}
    assert not offenders, f"modules outside {RENDER_ROOMS} import rendering: {offenders}"
    assert _is("IPython.display", RENDERING) and not _is("IPython", RENDERING)  # get_ipython (progress) is not drawing


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


TEST_DATA = {"fixtures", "golden", "standin", "slurm", "__pycache__"}  # folders of data and doubles, not tests


def test_tests_mirror_the_packages() -> None:
    """A test folder per room of lib/spectrial (plus house/ for the repository's own rules and tools); no test
    module loose at tests/' top, so a new test finds its room as a new module does."""
    tests = ROOT / "tests"
    rooms = {p.name for p in LIB.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    folders = {p.name for p in tests.iterdir() if p.is_dir()} - TEST_DATA
    assert not sorted(tests.glob("test_*.py")), "test modules at tests/' top: give them their package's folder"
    assert folders - rooms <= {"house"}, f"test folders that are no room of lib/spectrial: {sorted(folders - rooms)}"
    assert all(any(p.glob("test_*.py")) for p in (tests / f for f in folders)), "an empty test folder"
