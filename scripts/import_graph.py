"""The import graph of lib/spectrial, module by module: circles, levels, and who stands on whom.

    python scripts/import_graph.py            # summary: modules, edges, circles, levels, the tallest chain
    python scripts/import_graph.py --levels   # every module with its level (1 = imports nothing of spectrial)
    python scripts/import_graph.py --json     # the whole graph, for tests and diffs
    python scripts/import_graph.py --root /tmp/old/lib   # another checkout (e.g. `git worktree add /tmp/old REV`)

Every import counts, wherever it stands (top of the file, inside a function, under ``TYPE_CHECKING``): a
function-local import is still a dependency, so a circle hidden that way is still a circle. A module's level is
one more than the highest level it imports; the members of a circle share one level. ``from spectrial.x import y``
depends on ``spectrial.x.y`` when that is a module, else on ``spectrial.x`` (its ``__init__``).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "lib"
PACKAGE = "spectrial"
DICT_ANY = re.compile(r"dict\[str,\s*Any\]")
# every map whose values the type does not say: dict[str, Any] and its look-alikes (JsonValue says "any JSON")
LOOSE_MAPS = re.compile(r"(?:dict|Mapping|MutableMapping)\[str,\s*(?:Any|object|JsonValue)\]")

# The floors, from the bottom: each names the rooms (a folder under spectrial/, or a module at its top) standing on
# it. An import may go to its own floor or one below, never up; a new file is covered by its folder. A room that
# is on no floor is itself a finding (tests/house/test_house.py): give it one here and in docs/HOUSE.md.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the record's types", ("errors", "schema", "secrets", "ownership", "interrupts", "progress", "house", "cache")),
    ("pure numbers and text", ("analysis", "logs")),
    ("parameters", ("params",)),
    ("the run record", ("record",)),
    ("the machine", ("hosts", "provisioning", "models", "measure", "servers")),
    ("engines", ("engines",)),
    ("protocols", ("protocol", "sweep", "cluster", "nccl", "gate", "watch")),
    ("readers", ("readers",)),
    ("doors", ("cli",)),
)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package's ``__init__`` is the package's name)."""
    found: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports (itself left out)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{alias.name}" for alias in node.names] + [stem]
            # `from x import name` needs x; it needs x.name only when that is a module
            targets = [t for t in targets[:-1] if t in known] or [stem]
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                resolved = _resolve(target, known)
                if resolved and resolved != module:
                    found.add(resolved)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def levels(edges: dict[str, set[str]]) -> dict[str, int]:
    """Level of each module: 1 + the highest level it imports; a circle's members share one level."""
    component_of = {m: m for m in edges}
    for circle in circles(edges):
        for member in circle:
            component_of[member] = circle[0]
    collapsed: dict[str, set[str]] = {}
    for module, targets in edges.items():
        here = component_of[module]
        collapsed.setdefault(here, set()).update(component_of[t] for t in targets if component_of[t] != here)
    memo: dict[str, int] = {}

    def level(node: str) -> int:
        if node not in memo:
            memo[node] = 1 + max((level(t) for t in collapsed.get(node, ())), default=0)
        return memo[node]

    return {module: level(component_of[module]) for module in edges}


def tallest_chain(edges: dict[str, set[str]]) -> list[str]:
    """One longest chain of imports, from the top module down to level 1."""
    level = levels(edges)
    node = max(level, key=lambda m: (level[m], m))
    chain = [node]
    while level[node] > 1:
        below = [t for t in edges[node] if level[t] == level[node] - 1]
        if not below:  # inside a circle: step to a member's import
            break
        node = sorted(below)[0]
        chain.append(node)
    return chain


def room(module: str) -> str:
    """The room of a module: its folder under the package, or the module itself at the top (`__init__`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def floor_of() -> dict[str, int]:
    return {r: i for i, (_, rooms) in enumerate(FLOORS) for r in rooms}


def back_arrows(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports that run up a floor (module -> module), and rooms on no floor as (module, "?")."""
    floor = floor_of()
    found: list[tuple[str, str]] = []
    for module, targets in sorted(edges.items()):
        here = room(module)
        if here == "__init__":
            continue
        if here not in floor:
            found.append((module, "?"))
            continue
        found += [(module, t) for t in sorted(targets) if room(t) != "__init__" and floor.get(room(t), -1) > floor[here]]
    return found


def top_modules(root: Path = ROOT) -> list[str]:
    """The modules standing flat at the package's top (its `__init__` left out)."""
    return sorted(p.stem for p in (root / PACKAGE).glob("*.py") if p.stem != "__init__")


def dict_any_count(root: Path = ROOT, pattern: re.Pattern[str] = DICT_ANY) -> int:
    """How often the package's code says `dict[str, Any]` (or, with LOOSE_MAPS, any map of untyped values)."""
    return sum(len(pattern.findall(p.read_text())) for p in (root / PACKAGE).rglob("*.py"))


def summary(root: Path = ROOT) -> dict:
    edges = graph(root)
    level = levels(edges)
    return {
        "modules": len(edges),
        "edges": sum(len(t) for t in edges.values()),
        "circles": circles(edges),
        "levels": max(level.values()),
        "tallest_chain": tallest_chain(edges),
        "top_modules": top_modules(root),
        "back_arrows": back_arrows(edges),
        "dict_str_any": dict_any_count(root),
        "loose_maps": dict_any_count(root, LOOSE_MAPS),
        "level_of": dict(sorted(level.items(), key=lambda kv: (-kv[1], kv[0]))),
        "imports": {m: sorted(t) for m, t in sorted(edges.items())},
    }


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the whole graph as JSON")
    parser.add_argument("--levels", action="store_true", help="print every module with its level")
    parser.add_argument("--root", type=Path, default=ROOT, help="the folder holding the spectrial package (lib/)")
    args = parser.parse_args(argv)
    facts = summary(args.root)
    if args.json:
        print(json.dumps(facts, indent=1))
        return 0
    if args.levels:
        for module, lvl in facts["level_of"].items():
            print(f"{lvl:3d}  {module}")
        return 0
    print(f"modules {facts['modules']} ({len(facts['top_modules'])} flat at the top), imports {facts['edges']}, "
          f"levels {facts['levels']}, circles {len(facts['circles'])}, back arrows {len(facts['back_arrows'])}, "
          f"dict[str, Any] {facts['dict_str_any']} "
          f"(maps of untyped values, JsonValue/object/Mapping included: {facts['loose_maps']})")
    for circle in facts["circles"]:
        print("circle:", " <-> ".join(circle))
    for module, target in facts["back_arrows"]:
        print("back arrow:", module, "->", target if target != "?" else "(its room is on no floor)")
    print("top:", " ".join(facts["top_modules"]))
    print("tallest chain:", " -> ".join(facts["tallest_chain"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
