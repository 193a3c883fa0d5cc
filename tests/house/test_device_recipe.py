"""The H200 device recipe (issue 9), checked where it can be here: the carried payload and its limit, the
stripped llama.cpp tree (it configures with CMake, CPU and CUDA), the wheel set's closure, the scripts'
syntax and plan, the device params, and notebook 05 on a record built from LLAMACPP.md's finer H200 sweep."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import nbformat
import pytest

from spectrial.analysis.figures import add_comparisons, arm_figures
from spectrial.params import load_params
from spectrial.record.store import RunRecord
from spectrial.schema import ArmRecord, RequestRecord, WindowStats

REPO = Path(__file__).resolve().parents[2]
PREPARE = REPO / "scripts" / "device_prepare.sh"
RUN = REPO / "scripts" / "device_run.sh"
SGLANG = REPO / "scripts" / "device_sglang.sh"
TARBALL = REPO / ".device" / "llama.cpp-src.tar.xz"
WHEELS = REPO / ".whl"
PARAMS = REPO / "params" / "h200-8b.yaml"
NB05 = REPO / "notebooks" / "05_verify_wall.ipynb"
TOKENS = 3 * 256  # 3 requests x 256 tokens per arm

# LLAMACPP.md, "A finer H200 sweep": n_max, a, tok/s median, min, max, mean len, cycle ms, draft ms/cycle
FINER_SWEEP = [
    (1, 0.6, 165.8, 165, 173, 1.55, 9.31, 0.74), (2, 0.6, 197.5, 195, 212, 1.97, 9.94, 1.39),
    (3, 0.6, 190.8, 186, 201, 2.04, 10.65, 1.98), (4, 0.6, 201.5, 188, 204, 2.38, 11.76, 2.67),
    (6, 0.6, 188.0, 185, 195, 2.52, 13.35, 3.84), (1, 0.9, 210.2, 204, 210, 1.90, 9.00, 0.75),
    (2, 0.9, 269.6, 262, 274, 2.71, 10.01, 1.38), (3, 0.9, 304.7, 297, 310, 3.54, 11.57, 2.03),
    (4, 0.9, 307.5, 296, 337, 3.98, 12.89, 2.71), (6, 0.9, 366.2, 339, 374, 5.20, 14.15, 3.86),
    (1, 0.0, 106.6, 106.6, 106.6, 1.00, 9.34, 0.77), (6, 0.0, 77.9, 77.9, 77.9, 1.00, 12.78, 3.91),
]
BASELINE_TOK_S, BASELINE_MS = 187.1, 5.32


def _requests(arm: str, rates: list[float]) -> list[RequestRecord]:
    return [RequestRecord(arm=arm, restart=0, server_predicted_per_second=r, client_tok_s=r, tokens=256,
                          server_prompt_n=40) for r in rates]


def build_finer_sweep_record(output_dir: Path, gpu: str = "NVIDIA H200", run_id: str = "h200-8b-synthetic-finer-sweep"
                             ) -> Path:
    """A run record in spectrial's schema holding LLAMACPP.md's finer H200 sweep, figures computed by the
    trial's own code (arm_figures, add_comparisons) from counters that reproduce the table's lengths,
    cycle times and drafting times; recorded as run on `gpu` (the name nvidia-smi gives)."""
    params = load_params(PARAMS, {"output_dir": str(output_dir)})
    rec = RunRecord(output_dir, run_id, params=params)
    arms: list[ArmRecord] = []
    reqs: list[RequestRecord] = []
    base_stats = WindowStats(source="synthetic", tokens=TOKENS, decode_ms=BASELINE_MS * TOKENS)
    base_reqs = _requests("baseline", [186.4, BASELINE_TOK_S, 187.9])
    arms.append(ArmRecord(name="baseline", method="none", status="ok", steps=None, synthetic=False,
                          synthetic_accept=None, **dict(arm_figures(base_reqs, base_stats, speculative=False))))
    reqs += base_reqs
    for k, a, med, lo, hi, length, cycle, draft in FINER_SWEEP:
        name = f"eagle3-a{a}-k{k}" if a else f"eagle3-random-k{k}"
        steps = TOKENS / length
        stats = WindowStats(source="synthetic", verify_steps=steps, drafted=k * steps, accepted=steps * (length - 1),
                         tokens=TOKENS, decode_ms=cycle * steps, draft_ms=draft * steps)
        r = _requests(name, [lo, med, max(hi, med)])  # the doc rounds a0.9-k1 (210.2, max 210)
        arms.append(ArmRecord(name=name, method="eagle3", status="ok", steps=k, synthetic=bool(a),
                              synthetic_accept=a or None, **dict(arm_figures(r, stats, speculative=True, k=k, synthetic=a or None))))
        reqs += r
    add_comparisons(arms, reqs)
    rec.manifest.arms = arms
    rec.manifest.host = {"name": "local", "fingerprint": {"gpus": [{"name": gpu}]}}
    rec.manifest.engine = {"name": "llamacpp", "version": "synthetic: LLAMACPP.md finer H200 sweep"}
    from spectrial.analysis.serving import write_requests

    write_requests(rec, reqs, {a.name: a.accept_len for a in arms})
    rec.finish("ok")
    return rec.dir


# --- the record builder itself -------------------------------------------------------------------------
def test_fixture_reproduces_the_doc_table(tmp_path: Path) -> None:
    """The trial's code, fed the counters, gives back the table's accept lengths, cycles and break-evens."""
    m = json.loads((build_finer_sweep_record(tmp_path) / "manifest.json").read_text())
    by = {a["name"]: a for a in m["arms"]}
    assert by["baseline"]["decode_ms"] / by["baseline"]["tokens"] == pytest.approx(BASELINE_MS)
    # break-even column of LLAMACPP.md (cycle / 5.32 ms); spectrial's is accept length / speed-up, the same
    # quantity on the decode rate's clock (the table's rounding apart)
    for name, be in [("eagle3-a0.6-k1", 1.75), ("eagle3-a0.9-k3", 2.17), ("eagle3-a0.9-k6", 2.66)]:
        assert by[name]["break_even_accept_len"] == pytest.approx(be, abs=0.01)
    assert by["eagle3-a0.9-k6"]["accept_len"] == pytest.approx(5.20)
    assert by["eagle3-random-k6"]["draft_ms_per_cycle"] == pytest.approx(3.91)
    assert by["eagle3-a0.9-k6"]["engine_cycle_ms"] == pytest.approx(14.15)  # the engine's clock, as the doc
    assert by["eagle3-a0.9-k4"]["tok_s"] == pytest.approx(307.5) and by["eagle3-a0.9-k4"]["tok_s_max"] == 337


# --- notebook 05 -----------------------------------------------------------------------------------------
def _papermill(out: Path, **params: str | list[str]) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "papermill", str(NB05), str(out), "--cwd", str(REPO)]
    for k, v in params.items():
        args += ["-p", k, v] if isinstance(v, str) else ["-y", json.dumps({k: v})]
    return subprocess.run(args, capture_output=True, text=True, timeout=600)


@pytest.mark.notebook
def test_notebook_05_on_the_finer_sweep(tmp_path: Path) -> None:
    """Notebook 05 fits LLAMACPP.md's sweep on the verdict's clock (accept length / tok/s, the cycle each arm's
    break-even is): worked out here by least squares and the closed form tau(a, k); LLAMACPP.md's 8.23 + 0.95 k ms
    (2.7 % / 10.8 % errors) is the same sweep on the engine's clock, within 0.05 ms of it."""
    import numpy as np

    runs = tmp_path / "outputs"
    build_finer_sweep_record(runs)
    res = _papermill(tmp_path / "05.ipynb", run_dir=str(runs), out_dir=str(tmp_path / "nb05"))
    assert res.returncode == 0, res.stderr[-4000:]
    s = json.loads((tmp_path / "nb05" / "verify_wall.json").read_text())
    synthetic = [(k, a, med, length) for k, a, med, _lo, _hi, length, _c, _d in FINER_SWEEP if a]
    per_draft, fixed = np.polyfit([k for k, *_ in synthetic], [n / med * 1000 for *_, med, n in synthetic], 1)
    assert s["model"]["fixed_ms"] == pytest.approx(fixed, abs=1e-6)
    assert s["model"]["per_draft_ms"] == pytest.approx(per_draft, abs=1e-6)
    assert s["model"]["fixed_ms"] == pytest.approx(8.23, abs=0.05) and per_draft == pytest.approx(0.95, abs=0.005)
    assert s["model"]["draft_per_token_ms"] == pytest.approx(0.62, abs=0.01)  # "~0.65 ms of drafting" per token
    errors = [abs(sum(a ** i for i in range(k + 1)) / (fixed + per_draft * k) * 1000 / med - 1)
              for k, a, med, _ in synthetic]
    assert s["error_fitted_arms"]["n"] == 10
    assert s["error_fitted_arms"]["median"] == pytest.approx(float(np.median(errors)), abs=1e-4)  # 4 decimals
    assert s["error_fitted_arms"]["max"] == pytest.approx(max(errors), abs=1e-4)
    be = {row["k"]: row["break_even_accept_len"] for row in s["break_even"]}
    # the fitted cycle over the baseline's time per token (1000 / its decode rate), one clock
    assert be[1] < be[3] < be[6] and be[3] == pytest.approx((fixed + 3 * per_draft) * BASELINE_TOK_S / 1000, abs=1e-3)
    roof = s["roofline"]
    assert roof["streamed_params_b"] == pytest.approx(7.505, abs=0.005)  # Llama-3-8B less its 0.525 B embedding
    assert roof["baseline_share_of_roofline"] == pytest.approx(BASELINE_TOK_S / roof["roofline_tok_s"])
    assert 300 < roof["roofline_tok_s"] < 325  # 4800 GB/s over ~15 GB per token
    table = (tmp_path / "nb05" / "verify_wall.csv").read_text().splitlines()
    assert len(table) == 1 + len(FINER_SWEEP)
    nb = nbformat.read(tmp_path / "05.ipynb", as_version=4)
    text = "\n".join(json.dumps(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")
    said = f"off by {np.median(errors) * 100:.1f} % (median), {max(errors) * 100:.1f} % at worst"
    assert "application/vnd.plotly.v1+json" in text and said in text


@pytest.mark.notebook
def test_notebook_05_takes_each_records_gpu(tmp_path: Path) -> None:
    """Issue 41: the roofline is the GPU each record ran on (an H100 record gets H100 SXM's 3,350 GB/s, not the
    H200's 4,800), records of two GPU kinds get a figure each, and a GPU params/hardware.yaml lacks is refused by
    name, with what to do."""
    runs = tmp_path / "outputs"
    h100 = build_finer_sweep_record(runs, "NVIDIA H100 80GB HBM3", "h100-sxm-synthetic-sweep")
    h200 = build_finer_sweep_record(runs, "NVIDIA H200", "h200-sxm-synthetic-sweep")
    res = _papermill(tmp_path / "05.ipynb", run_dir=[str(h100), str(h200)], out_dir=str(tmp_path / "nb05"))
    assert res.returncode == 0, res.stderr[-4000:]
    roof = json.loads((tmp_path / "nb05" / "verify_wall.json").read_text())["roofline"]  # the first record's
    assert roof["gpu"] == "h100_sxm"
    h200_roof = 4800e9 / (roof["weight_bytes_per_token"] + roof["kv_bytes_per_token"])
    assert roof["roofline_tok_s"] == pytest.approx(h200_roof * 3350 / 4800, rel=1e-6)
    nb = nbformat.read(tmp_path / "05.ipynb", as_version=4)
    text = "\n".join(json.dumps(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")
    assert "**h100_sxm**: 1 record(s); not drawn beside h200_sxm" in text
    assert "**h200_sxm**: 1 record(s); not drawn beside h100_sxm" in text

    odd = build_finer_sweep_record(tmp_path / "odd", "NVIDIA B999 Mystery", "b999-synthetic-sweep")
    res = _papermill(tmp_path / "odd.ipynb", run_dir=str(odd))
    assert res.returncode != 0
    assert "'NVIDIA B999 Mystery', which params/hardware.yaml does not know" in res.stderr
    assert "-p hardware=KEY" in res.stderr


@pytest.mark.notebook
def test_notebook_05_without_a_record(tmp_path: Path) -> None:
    """No record yet: the notebook runs, says so, and skips the analysis."""
    (tmp_path / "empty").mkdir()
    res = _papermill(tmp_path / "05.ipynb", run_dir=str(tmp_path / "empty"), out_dir=str(tmp_path / "nb05"))
    assert res.returncode == 0, res.stderr[-4000:]
    nb = nbformat.read(tmp_path / "05.ipynb", as_version=4)
    text = "\n".join(json.dumps(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")
    assert "No sweep record yet" in text and not (tmp_path / "nb05").exists()


# --- params and scripts ----------------------------------------------------------------------------------
def test_h200_params_hold_the_issue_grid() -> None:
    p = load_params(PARAMS)
    assert p.host == "local" and p.engine == "llamacpp" and p.engine_config["cuda"] is True
    assert p.engine_config["gpu_layers"] == "all" and p.max_tokens == 256 and p.repeats == 5
    assert {"CUDA_VISIBLE_DEVICES": "0", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}.items() <= p.env.items()
    grid = {(a.steps, a.synthetic_accept) for a in p.arms if a.method == "eagle3"}
    assert {(k, r) for k in range(1, 7) for r in (0.6, 0.75, 0.9)} | {(1, None), (6, None)} == grid
    assert p.arms[0].method == "none" and len(p.arms) == 21


def test_scripts_parse() -> None:
    for script in (PREPARE, RUN, SGLANG, REPO / "scripts" / "device_env.sh", REPO / "scripts" / "device_sglang_prepare.sh"):
        res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("script", [RUN, SGLANG], ids=["device_run", "device_sglang"])
def test_phase_list_calls_pack_apart(tmp_path: Path, script: Path) -> None:
    """Two calls with phase lists on one (warm) machine: each pack is named after the call's phases and start, holds
    one folder of the same name with only that call's log and timings, so unpacking both overwrites nothing."""
    site = tmp_path / "site"
    site.mkdir()
    (site / ".stamp").write_text("x")  # device_run.sh: wheels installed by an earlier call
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "RUNS": str(tmp_path / "runs"),
           "SITE": str(site), "PYTHON": sys.executable, "PY": sys.executable}
    first = subprocess.run(["bash", str(script), "pack"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert first.returncode == 0, first.stdout[-2000:]
    time.sleep(1.1)  # calls are named to the second
    # nb05 finds no sweep record here: the call stops and packs what it has
    second = subprocess.run(["bash", str(script), "nb05", "pack"], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=60)
    assert second.returncode == 1 and "phase nb05 failed" in second.stdout
    packs = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(packs) == 2 and packs[0].startswith("device-nb05-pack-") and packs[1].startswith("device-pack-")
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    for name in packs:
        with tarfile.open(tmp_path / "out" / name) as tar:
            assert {m.name.split("/")[0] for m in tar.getmembers()} == {name.removesuffix(".tar.gz")}
            tar.extractall(unpacked, filter="data")
    folders = {d.name: d for d in unpacked.iterdir()}
    assert sorted(folders) == [n.removesuffix(".tar.gz") for n in packs]
    nb05 = folders[packs[0].removesuffix(".tar.gz")]
    rows = [ln.split("\t") for ln in (nb05 / "timings.tsv").read_text().splitlines()]
    assert rows[0] == ["call", "phase", "seconds", "rc"]
    assert rows[1][0] == nb05.name.removeprefix("device-") and rows[1][1] == "nb05" and rows[1][3] == "1"
    log = (nb05 / "device.log").read_text()
    assert "=== nb05: start" in log and "=== pack: start" in log
    assert "=== nb05" not in (folders[packs[1].removesuffix(".tar.gz")] / "device.log").read_text()
    bad = subprocess.run(["bash", str(script), "pack", "bogus"], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=60)
    assert bad.returncode == 2 and "unknown" in bad.stderr and "bogus" in bad.stderr


@pytest.mark.parametrize("script", [RUN, SGLANG], ids=["device_run", "device_sglang"])
def test_the_gpu_comes_from_the_device(tmp_path: Path, script: Path) -> None:
    """Issue 41: the scripts take the lent GPU from nvidia-smi (here its stand-in SPECTRIAL_GPU_NAME) and
    params/hardware.yaml, name their run ids after it, and stop before any start on a GPU the table lacks."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / ".stamp").write_text("x")  # device_run.sh: wheels installed by an earlier call
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "RUNS": str(tmp_path / "runs"),
           "SITE": str(tmp_path / "site"), "PYTHON": sys.executable, "PY": sys.executable,
           "SPECTRIAL_GPU_NAME": "NVIDIA H100 80GB HBM3"}
    res = subprocess.run(["bash", str(script), "pack"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "GPU: NVIDIA H100 80GB HBM3 = h100_sxm (params/hardware.yaml)" in res.stdout
    assert "run ids start h100-sxm-" in res.stdout
    res = subprocess.run(["bash", str(script), "pack"], capture_output=True, text=True, cwd=REPO, timeout=60,
                         env={**env, "SPECTRIAL_GPU_NAME": "NVIDIA B999 Mystery"})
    assert res.returncode == 2, res.stdout[-2000:]
    said = res.stdout + res.stderr
    assert "GPU 'NVIDIA B999 Mystery' is not in params/hardware.yaml" in said and "add an entry for it" in said
    # every run id a script makes starts with the device's GPU, none with a GPU written into the script
    rids = [ln for ln in script.read_text().splitlines()
            if re.search(r"\$\(date \+(%Y%m%d-)?%H%M%S\)", ln) and not ln.lstrip().startswith("#")]
    assert len(rids) >= 2 and all("$GPU_SLUG" in ln and "h200" not in re.sub(r"params/\S+", "", ln) for ln in rids), rids


def test_a_notebook_is_not_begun_without_the_time_it_needs(tmp_path: Path) -> None:
    """Issue 41, seen on the H100 (2026-12-06): call2's sweep left notebook 02 51 s, papermill cut its first start
    and the call failed. Now a notebook is not begun with less than it needs, and the call says the next call2
    runs it."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "RUNS": str(tmp_path / "runs"),
           "PY": sys.executable, "SPECTRIAL_GPU_NAME": "NVIDIA H100 80GB HBM3", "BUDGET_S": "150"}
    res = subprocess.run(["bash", str(SGLANG), "nb02", "pack"], capture_output=True, text=True, cwd=REPO, timeout=60,
                         env=env)
    assert res.returncode != 0, res.stdout[-2000:]
    assert re.search(r"only 1[45]\d s left and notebooks/02_eagle3.ipynb needs ~180 s: not started; the next call2 "
                     r"runs it", res.stdout), res.stdout[-2000:]
    assert "papermill" not in res.stdout + res.stderr and not list((tmp_path / "runs").rglob("*.ipynb"))


def test_the_bundle_travels_in_parts_and_is_put_together_checked(tmp_path: Path) -> None:
    """Issue 41: `stage` keeps each carried part on the machine; the call that brings the last one puts the tarball
    together and checks its sha256 (what device_sglang_prepare.sh `parts` wrote in PART); a damaged part is refused."""
    import hashlib

    tarball = os.urandom(5000)
    sha = hashlib.sha256(tarball).hexdigest()
    for k, chunk in ((1, tarball[:2500]), (2, tarball[2500:])):
        (tmp_path / f"p{k}").mkdir()
        (tmp_path / f"p{k}" / "bundle.part").write_bytes(chunk)
        (tmp_path / f"p{k}" / "PART").write_text(f"{sha} sglang-0.5.17.tar.xz {k} 2\n")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "RUNS": str(tmp_path / "runs"),
           "PY": sys.executable, "SPECTRIAL_GPU_NAME": "NVIDIA H200"}

    def stage(parts: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(SGLANG), "stage"], capture_output=True, text=True, cwd=REPO, timeout=60,
                              env={**env, "PARTS_GLOB": parts})

    first = stage(f"{tmp_path}/p1/")
    assert first.returncode == 0 and "staged part 1 of 2" in first.stdout, first.stdout + first.stderr
    assert "1 of 2 parts on this machine; the next call carries the rest" in first.stdout
    assert not (tmp_path / "work" / "bundle" / "sglang-0.5.17.tar.xz").exists()
    second = stage(f"{tmp_path}/p2/")  # the next call, on the same (warm) machine
    assert second.returncode == 0 and "put sglang-0.5.17.tar.xz together from its 2 parts" in second.stdout, second.stdout
    assert (tmp_path / "work" / "bundle" / "sglang-0.5.17.tar.xz").read_bytes() == tarball
    (tmp_path / "p2" / "bundle.part").write_bytes(b"x" + tarball[2501:])  # a damaged half, on a fresh machine
    shutil.rmtree(tmp_path / "work")
    stage(f"{tmp_path}/p1/")
    bad = stage(f"{tmp_path}/p2/")
    assert bad.returncode != 0 and "the parts do not make the bundle again (sha256 differs)" in bad.stdout, bad.stdout
    assert not (tmp_path / "work" / "bundle" / "sglang-0.5.17.tar.xz").exists()


def test_device_run_plan(tmp_path: Path) -> None:
    """`device_run.sh plan` prints notebook 02's arms and the sweep's commands: both valid, one GPU, -ngl all."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "RUNS": str(tmp_path / "runs"),
           "PYTHON": sys.executable}
    res = subprocess.run(["bash", str(RUN), "plan"], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("nb02-params: "))
    nb02 = json.loads(line.removeprefix("nb02-params: "))
    p = load_params(REPO / nb02["params_file"], nb02["overrides"])
    assert [a.method for a in p.arms] == ["none", "eagle3", "eagle3", "draft"]
    commands = [ln for ln in res.stdout.splitlines() if "llama-server -m " in ln]
    assert len(commands) == 21
    assert all(c.startswith("CUDA_VISIBLE_DEVICES=0 NCCL_NVLS_ENABLE=0 ") and " -ngl all" in c for c in commands)
    synth = [c for c in commands if "--spec-synth-rates 0.9,0.81,0.729 " in c + " "]
    assert len(synth) == 1 and "--spec-draft-n-max 3" in synth[0]
    bad = subprocess.run(["bash", str(RUN)], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert bad.returncode == 2 and "call1" in bad.stderr


# --- the carried payload ---------------------------------------------------------------------------------
needs_payload = pytest.mark.skipif(not TARBALL.is_file() or not any(WHEELS.glob("*.whl")),
                                   reason="run scripts/device_prepare.sh first (builds .device/ and .whl/)")


def test_carried_paths_are_never_committed() -> None:  # their payload: tests/house/test_device_payload.py
    ignored = subprocess.run(["git", "check-ignore", ".device/x", ".whl/x"], cwd=REPO, capture_output=True, text=True)
    assert ignored.stdout.split() == [".device/x", ".whl/x"]  # carried, never committed


@needs_payload
def test_stripped_tree_keeps_what_the_build_needs() -> None:
    with tarfile.open(TARBALL) as tar:
        names = set(tar.getnames())
    for need in ("llama.cpp/CMakeLists.txt", "llama.cpp/ggml/src/ggml-cuda/CMakeLists.txt",
                 "llama.cpp/ggml/src/ggml-cpu/CMakeLists.txt", "llama.cpp/ggml/src/ggml-rpc/CMakeLists.txt",
                 "llama.cpp/tools/server/server.cpp", "llama.cpp/tools/rpc/rpc-server.cpp",
                 "llama.cpp/tools/ui/CMakeLists.txt", "llama.cpp/tools/ui/ui.h.in", "llama.cpp/tools/ui/ui.cpp.in",
                 "llama.cpp/scripts/ui-assets.cmake",
                 "llama.cpp/vendor/cpp-httplib/httplib.h", "llama.cpp/LICENSE",
                 "llama.cpp/models/ggml-vocab-llama-bpe.gguf"):
        assert need in names, need
    for gone in ("llama.cpp/ggml/src/ggml-vulkan", "llama.cpp/docs", "llama.cpp/tools/ui/package.json",
                 "llama.cpp/models/ggml-vocab-gemma-4.gguf", "llama.cpp/tools/server/tests"):
        assert gone not in names, gone


@needs_payload
def test_wheels_close_over_the_device_image() -> None:
    res = subprocess.run(["bash", str(PREPARE), "check"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "closure: every requirement is carried or in the device image" in res.stdout


@needs_payload
@pytest.mark.slow
def test_stripped_tree_configures() -> None:
    """CMake configures the stripped tree with spectrial.engines.llamacpp_build's flags, for CPU and (with nvcc) CUDA 90."""
    res = subprocess.run(["bash", str(PREPARE), "configure"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert "CPU configure ok" in res.stderr
    if Path("/usr/local/cuda/bin/nvcc").exists():
        assert "CUDA configure ok" in res.stderr
