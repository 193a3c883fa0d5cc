"""Issue 41 item 1: spectrial as a tool you install. The wheel is built from this checkout (`pip wheel`), installed
without its dependencies into a clean virtual environment (the dependencies come from the test environment's
site-packages by a path line, whose own .pth files, the checkout's editable finder among them, are not read: the
package itself can only come from the wheel; their data files by JUPYTER_PATH), and run from folders outside the checkout: `spectrial init`, the
embedded default trial for real on llama-server, and notebook 02 with papermill."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from spectrial import house

REPO = Path(__file__).resolve().parents[2]


def build_wheel(tmp: Path) -> Path:
    """The wheel as `pip wheel .` builds it, from a copy of what the build reads (setuptools writes build/ into the
    tree it builds: two lanes building in the checkout would race)."""
    src = tmp / "src"
    for name in ("lib", "setup.py", "pyproject.toml", "README.md", *house.carried()):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("*.egg-info", *house.SKIPPED))
        else:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    (whl,) = (tmp / "dist").glob("spectrial-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `spectrial` command of a clean virtual environment holding only the wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    whl = build_wheel(tmp)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(whl)], check=True, capture_output=True, timeout=300)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "zz-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin" / "spectrial"


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{Path(cmd[0]).parent}:{env.get('PATH', '')}"
    # the dependencies' data files (nbconvert's templates, kernel specs) are where they were installed: in this test
    # environment's prefix, as they would be in the clean one had pip installed them there
    env["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_the_wheel_carries_what_the_notebooks_and_the_default_read(tmp_path):
    whl = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(whl).namelist())
    for name in house.carried():
        src = REPO / name
        files = [p for p in src.rglob("*") if p.is_file() and not any(s in p.parts or p.name == s
                                                                        for s in house.SKIPPED)] \
            if src.is_dir() else [src]
        missing = [str(p.relative_to(REPO)) for p in files if f"spectrial/house/{p.relative_to(REPO)}" not in names]
        assert files and not missing, (name, missing[:5])
    assert "spectrial/data/init/README.md" in names and "spectrial/data/carried.txt" in names
    assert not [n for n in names if n.endswith("report.html")]
    assert whl.stat().st_size < 8 << 20  # the notebooks' records, not every example record


@pytest.mark.slow
def test_installed_spectrial_runs_from_any_folder(installed, tmp_path, llama_server, tiny_models, port):
    # from a folder that is no investigation: the embedded default is the package's own
    bare = tmp_path / "bare"
    bare.mkdir()
    res = _run([str(installed), "trial", "--dry-run"], bare)
    assert res.returncode == 0 and "using the embedded default params/local.yaml" in res.stderr, res.stderr[-2000:]
    assert "plan: 3 server start(s)" in res.stdout
    res = _run([str(installed), "notebook", "99"], bare)
    assert res.returncode == 2 and "02_eagle3.ipynb" in res.stderr  # the known notebooks are the package's
    # init lays out an investigation folder; a second init into it refuses and writes nothing
    inv = tmp_path / "inv"
    res = _run([str(installed), "init", str(inv)], tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "site-packages/spectrial/house" in res.stdout  # from the installed package, not this checkout
    for name in ("notebooks/02_eagle3.ipynb", "notebooks/02_eagle3.py", "params/local.yaml", "params/hardware.yaml",
                 "params/templates/sglang-tp8.yaml", "params/templates/vllm.yaml", "params/templates/llamacpp.yaml",
                 "environment.yml", "README.md"):
        assert (inv / name).is_file(), name
    assert (inv / "outputs").is_dir() and "- spectrial" in (inv / "environment.yml").read_text()
    res = _run([str(installed), "init", str(inv)], tmp_path)
    assert res.returncode == 2 and "already there" in res.stderr and "nothing was written" in res.stderr
    # the templates are valid params: each plans its starts
    for t in ("sglang-tp8", "vllm", "llamacpp"):
        res = _run([str(installed), "trial", f"params/templates/{t}.yaml", "--dry-run"], inv)
        assert res.returncode == 0 and "server start(s)" in res.stdout, (t, res.stderr[-2000:])
    # the embedded default for real, in the investigation folder: its record under inv/outputs
    over = ["-p", f"engine_bin={llama_server}", "-p", f"port={port}", "-p", "repeats=5", "-p", "max_tokens=24"]
    res = _run([str(installed), "trial", *over], inv, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = [p for p in (inv / "outputs").iterdir() if (p / "manifest.json").is_file()]
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "ok" and {a["name"] for a in m["arms"]} == {"baseline", "draft-simple", "eagle3-synthetic"}
    # notebook 02 with papermill, from the folder's own notebooks/
    nb_over = json.dumps({"engine_bin": str(llama_server), "port": port})
    res = _run([str(installed), "notebook", "02", "-p", f"overrides={nb_over}", "-p", "repeats=5",
                "-p", "max_tokens=24"], inv, timeout=900)
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-3000:])
    executed = [p for p in (inv / "outputs").rglob("02_eagle3.ipynb")]
    assert executed and all(str(p).startswith(str(inv / "outputs")) for p in executed)
