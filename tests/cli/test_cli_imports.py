"""What the command line needs at run time: the GPU hosts' minimal wheel sets (scripts/device_sglang_prepare.sh's
CLI set) carry no plotly and no notebook stack, so a trial through the CLI — its compare, serving figures and
headline included — must not import them (the first H200 fault run exited 1 on `import plotly` in the interrupt
path before serving's figure import became lazy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"plotly", "nbformat", "papermill", "IPython", "savvi"}:
            raise ImportError(f"{name} is not on the GPU host")
sys.meta_path.insert(0, Block())
"""


def test_the_cli_path_needs_no_plotly_nor_notebooks() -> None:
    code = BLOCK + """
import spectrial.cli, spectrial.protocol.trial, spectrial.protocol.session, spectrial.analysis.serving, spectrial.readers.headline, spectrial.analysis.figures
from spectrial.record.store import load_record
from spectrial.readers.headline import headlines
m = load_record(sys.argv[1], settle=False)
print(headlines(m)[0].title)
"""
    run = next((REPO / "outputs" / "examples" / "vllm-cpu-decide").glob("*/manifest.json")).parent
    res = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Speculation pays here" in res.stdout
