"""Where spectrial's own files are: the notebooks, the default and example params, the hardware table, the records
the notebooks read by default, environment.yml (the investigation layout of the design: notebooks/, params/,
outputs/).

    a checkout      the repository this package runs from (an editable install: lib/spectrial/../..)
    the package     a wheel's copy under spectrial/house/ (written by setup.py's build step from the same files)
    a folder        an investigation folder laid out by `spectrial init DIR` (notebooks/ or params/ in the cwd)

`root()` is where relative names (`params/local.yaml`, `notebook 02`) are looked up after the cwd: the checkout,
else the cwd when it is an investigation folder, else the package's copy. `source()` is where `init` copies from:
the checkout, else the package's copy. `init(DIR)` lays out an investigation folder and never overwrites a file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from spectrial.errors import ConfigError

PACKAGE = Path(__file__).resolve().parent
# what a wheel carries (setup.py copies these from the checkout into spectrial/house/) and `init` lays out
NOTEBOOKS = "notebooks"
PARAMS = "params"
SKIPPED = ("report.html", ".ipynb_checkpoints", "__pycache__")  # never carried (setup.py says the same)


def carried() -> list[str]:
    """What a wheel carries beside the package, relative to the checkout (data/carried.txt: setup.py reads it too)."""
    lines = (PACKAGE / "data" / "carried.txt").read_text().splitlines()
    return [x.strip() for x in lines if x.strip() and not x.startswith("#")]


# what `init` writes: the notebooks (each with its jupytext pair), the embedded default, the hardware table, the
# deployment templates, and from the package's data a README and an environment.yml that installs spectrial
INIT_PARAMS = ("params/local.yaml", "params/hardware.yaml", "params/templates")
INIT_DATA = PACKAGE / "data" / "init"


def checkout() -> Path | None:
    """The spectrial repository this package runs from (an editable install), None for an installed wheel."""
    here = PACKAGE.parents[1]
    return here if (here / "pyproject.toml").is_file() and (here / "lib" / "spectrial").is_dir() else None


def packaged() -> Path | None:
    """The package's own copy of the house (a wheel's spectrial/house/), None where it has none."""
    p = PACKAGE / "house"
    return p if (p / PARAMS).is_dir() else None


def source() -> Path:
    """Where spectrial's files come from: the checkout, else the package's copy."""
    src = checkout() or packaged()
    if src is None:
        raise ConfigError("this spectrial installation carries neither a checkout nor its packaged files "
                          "(spectrial/house/): reinstall it from a wheel built by `pip wheel .` or from PyPI",
                          hint="pip install --force-reinstall spectrial")
    return src


def is_investigation(folder: Path) -> bool:
    """Whether `folder` is an investigation folder (`spectrial init`): it holds notebooks/ or params/."""
    return (folder / NOTEBOOKS).is_dir() or (folder / PARAMS).is_dir()


def root() -> Path:
    """Where relative names are looked up after the cwd: the checkout, else the cwd when it is an investigation
    folder, else the package's copy, else the cwd."""
    cwd = Path.cwd()
    return checkout() or (cwd if is_investigation(cwd) else None) or packaged() or cwd


def find(name: str | Path) -> Path:
    """A file of the house by its relative name (params/hardware.yaml): in the cwd's investigation folder, then in the
    checkout or the package's copy (the first that has it; the name as given when none does)."""
    rel = Path(name)
    for base in (Path.cwd() if is_investigation(Path.cwd()) else None, checkout(), packaged()):
        if base is not None and (base / rel).exists():
            return base / rel
    return rel


def init(dest: str | Path) -> list[Path]:
    """Lay out an investigation folder in `dest` from `source()`: notebooks/ (each .ipynb with its jupytext .py),
    params/ (the embedded default local.yaml, the hardware table, templates/ for SGLang TP8, vLLM and llama.cpp),
    outputs/, environment.yml and README.md. A file already there is never overwritten: the whole layout is refused
    first, naming them. Returns the files written."""
    src, out = source(), Path(dest).expanduser()
    plan: list[tuple[Path, Path]] = []
    for nb in sorted((src / NOTEBOOKS).glob("*.ipynb")):
        plan.append((nb, out / NOTEBOOKS / nb.name))
        pair = nb.with_suffix(".py")
        if pair.is_file():
            plan.append((pair, out / NOTEBOOKS / pair.name))
    for name in INIT_PARAMS:
        p = src / name
        files = sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else [p]
        plan += [(f, out / f.relative_to(src)) for f in files]
    plan += [(INIT_DATA / "environment.yml", out / "environment.yml"), (INIT_DATA / "README.md", out / "README.md")]
    missing = [str(s) for s, _ in plan if not s.is_file()]
    if missing:
        raise ConfigError(f"spectrial's files are incomplete at {src}: {', '.join(missing[:5])} missing",
                          hint="reinstall spectrial (pip install --force-reinstall spectrial)")
    there = [str(d) for _, d in plan if d.exists()]
    if there:
        raise ConfigError(f"init {out}: {len(there)} file(s) already there ({', '.join(there[:4])}"
                          f"{', ...' if len(there) > 4 else ''}); nothing was written",
                          parameter="DIR", hint="give a new or empty folder, or move those files away")
    for s, d in plan:
        d.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(s, d)
    (out / "outputs").mkdir(parents=True, exist_ok=True)
    return [d for _, d in plan]
