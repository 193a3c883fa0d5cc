"""The wheel's build step: beside the package, spectrial/house/ carries the checkout's notebooks, params, environment.yml
and the records the notebooks read by default (lib/spectrial/data/carried.txt), so an installed spectrial runs its
embedded default, its notebooks and `spectrial init` from any folder (spectrial.house). Everything else is in
pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SKIPPED = ("report.html", ".ipynb_checkpoints", "__pycache__")  # as spectrial.house.SKIPPED


class BuildWithHouse(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads the checkout itself
            return
        dest = Path(self.build_lib) / "spectrial" / "house"
        lines = (ROOT / "lib" / "spectrial" / "data" / "carried.txt").read_text().splitlines()
        for name in (x.strip() for x in lines if x.strip() and not x.startswith("#")):
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, dest / name, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*SKIPPED))
            elif src.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dest / name)
            else:
                raise FileNotFoundError(f"lib/spectrial/data/carried.txt names {name}, which the checkout lacks")


setup(cmdclass={"build_py": BuildWithHouse})
