"""How long a gate takes: `spectrial gate` against one reference record and against a history of N runs.

Copies the committed reference record (tests/golden/gate/manifest.json, a real llama.cpp trial) into N run folders
of a temporary history (their ids and start times shifted), then times `run_gate` with `--reference` and with
`--history N` (reading and judging every record), and the JUnit and Markdown outputs.

    python benchmarks/bench_gate.py [--runs 10 50 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from spectrial.gate import GateTolerances, run_gate
from spectrial.gate.report import junit, markdown

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "gate" / "manifest.json"


def history(folder: Path, n: int) -> Path:
    data = json.loads(GOLDEN.read_text())
    for i in range(n + 1):
        run = folder / f"run-{i:04d}"
        run.mkdir(parents=True)
        data.update(run_id=run.name, started_at=f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}+00:00")
        (run / "manifest.json").write_text(json.dumps(data))
    return folder / f"run-{n:04d}"


def best_of(repeat: int, fn) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, nargs="+", default=[10, 50, 200])
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    tol = GateTolerances()
    ref_s = best_of(a.repeat, lambda: run_gate(GOLDEN, tol, reference=GOLDEN))
    rec = run_gate(GOLDEN, tol, reference=GOLDEN)
    out_s = best_of(a.repeat, lambda: (junit(rec), markdown(rec)))
    print(f"one reference: {ref_s * 1000:.0f} ms ({len(rec.checks)} checks); JUnit + Markdown: {out_s * 1000:.1f} ms")
    for n in a.runs:
        with tempfile.TemporaryDirectory() as tmp:
            cand = history(Path(tmp), n)
            s = best_of(a.repeat, lambda: run_gate(cand, tol, last=n))  # noqa: B023
            got = run_gate(cand, tol, last=n)
            print(f"history of {n} runs: {s * 1000:.0f} ms ({s / (n + 1) * 1000:.1f} ms per record read; "
                  f"{len(got.reference_runs)} runs used, outcome {got.outcome})")


if __name__ == "__main__":
    main()
