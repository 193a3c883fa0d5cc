"""The SGLang 0.5.17 bundle for the H200 device (issue 15): its lock pins the closure it should, its trims
never touch what SGLang needs there (FlashInfer's JIT sources, sgl_kernel's sm90 ops), and (slow) the
builder writes a tarball under 60 MiB that holds them."""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from spectrial.errors import ConfigError, SpectrialError

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "sglang_bundle.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sglang_bundle", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


bundle = _load()


def test_lock_pins_the_roots_and_the_replaced_image_packages() -> None:
    lock = bundle.read_lock()
    for root in map(Requirement, bundle.ROOTS):
        entry = lock[canonicalize_name(root.name)]
        assert root.specifier.contains(entry.version), f"{root} locked as {entry.version}"
    # sglang, its kernels, the two replaced image packages, two modules sglang imports on every start without
    # declaring them (found on the device: dill, jsonschema), and what SGLang's benchmark tools import (datasets,
    # with a multiprocess that keeps that dill)
    assert {r.split("==")[0] for r in bundle.ROOTS} == {"sglang", "sglang-kernel", "transformers", "tokenizers",
                                                        "dill", "jsonschema", "datasets", "multiprocess"}
    image = bundle.image_packages()
    for name in bundle.REPLACE_IMAGE:
        assert name in image, f"{name} is not an image package: nothing to replace"
        assert name in lock, f"{name} must be carried to replace the image's version"


def test_lock_entries_are_exact_device_wheels() -> None:
    lock = bundle.read_lock()
    assert len(lock) >= 40
    for name, entry in lock.items():
        wheel_name, version, _, tags = parse_wheel_filename(entry.file)
        assert wheel_name == name and str(version) == entry.version, entry.file
        assert len(entry.sha256) == 64
        assert tags & bundle.DEVICE_TAGS, f"{entry.file} does not install on CPython 3.12 / Linux x86_64"


def test_lock_carries_nothing_the_image_has_or_the_server_does_not_need() -> None:
    lock, image = bundle.read_lock(), bundle.image_packages()
    assert not set(lock) & set(bundle.NOT_NEEDED)
    assert set(lock) & image == set(bundle.REPLACE_IMAGE)


def test_every_locked_wheel_is_reached_from_the_roots() -> None:
    lock = bundle.read_lock()
    reached, frontier = set(), {"ROOTS"}
    while frontier:
        frontier = {n for n, e in lock.items() if e.needed_by & frontier and n not in reached}
        reached |= frontier
    assert reached == set(lock), f"orphans: {sorted(set(lock) - reached)}"
    for entry in lock.values():
        assert entry.needed_by <= set(lock) | {"ROOTS"}, f"{entry.name} needed by {entry.needed_by}"


def test_trims_spare_flashinfer_data_and_the_sm90_ops() -> None:
    for pattern, why in bundle.TRIMS:
        assert why
        assert not bundle.protected(pattern.split("*")[0]), pattern
    assert any(p.startswith("flashinfer/data/") for p in bundle.PROTECTED)
    assert any(p.startswith("sgl_kernel/sm90/common_ops") for p in bundle.PROTECTED)
    assert "flashinfer/data/csrc/norm.cu" in bundle.MUST_HAVE
    assert "sgl_kernel/sm90/common_ops.abi3.so" in bundle.MUST_HAVE


def _fake_site(root: Path) -> Path:
    """A site folder holding MUST_HAVE and one file or folder for each trim pattern."""
    site = root / "site"
    for rel in [*bundle.MUST_HAVE, "flashinfer/data/include/flashinfer/norm.cuh", "sgl_kernel/sm90/other.py"]:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x")
    for pattern, _ in bundle.TRIMS:
        rel = pattern.replace("*", "x")
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("trim me")
    return site


def test_apply_trims_removes_each_pattern_and_keeps_the_protected(tmp_path: Path) -> None:
    site = _fake_site(tmp_path)
    removed = bundle.apply_trims(site)
    assert len(removed) >= len(bundle.TRIMS)
    for pattern, _ in bundle.TRIMS:
        assert not (site / pattern.replace("*", "x")).exists(), pattern
    for rel in [*bundle.MUST_HAVE, "flashinfer/data/include/flashinfer/norm.cuh", "sgl_kernel/sm90/other.py"]:
        assert (site / rel).is_file(), rel


@pytest.mark.parametrize("bad", ["flashinfer/data", "flashinfer", "sgl_kernel/sm90/*.so", "sgl_kernel/sm90"])
def test_a_trim_reaching_protected_files_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    bad: str) -> None:
    site = _fake_site(tmp_path)
    monkeypatch.setattr(bundle, "TRIMS", ((bad, "a mistake"),))
    with pytest.raises(SpectrialError, match="must stay"):
        bundle.apply_trims(site)
    assert (site / "flashinfer/data/csrc/norm.cu").is_file()
    assert (site / "sgl_kernel/sm90/common_ops.abi3.so").is_file()


def test_lock_carries_what_sglangs_benchmark_tools_import() -> None:
    """sglang.benchmark.datasets imports `datasets` at module level: carried, with a multiprocess whose dill
    requirement the dill pin meets (0.70.19 would need dill>=0.4.1)."""
    lock = bundle.read_lock()
    assert "datasets" not in bundle.NOT_NEEDED
    assert {"datasets", "multiprocess", "dill"} <= set(lock)
    assert "sglang" in lock["datasets"].needed_by  # sglang declares it
    assert lock["multiprocess"].version == "0.70.18" and lock["dill"].version == "0.4.0"


def test_keep_spares_the_benchmark_tools_modules_of_sglang_test(tmp_path: Path) -> None:
    site = _fake_site(tmp_path)
    for rel in [*bundle.KEEP, "sglang/test/ascend/test_npu.py", "sglang/test/runners.py"]:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x = 1\n")
    removed = {r["path"] for r in bundle.apply_trims(site)}
    assert {"sglang/test/ascend", "sglang/test/runners.py"} <= removed
    for rel in bundle.KEEP:  # each KEEP path would be trimmed by a TRIMS glob, were it not kept
        assert any(fnmatch.fnmatch(rel, pattern + "*") for pattern, _ in bundle.TRIMS), rel
        assert (site / rel).is_file() and rel not in removed, rel


def _write(site: Path, rel: str, text: str) -> None:
    (site / rel).parent.mkdir(parents=True, exist_ok=True)
    (site / rel).write_text(textwrap.dedent(text))


def test_import_problems_names_what_the_benchmark_tools_would_miss(tmp_path: Path) -> None:
    """The static import check reads module-level imports (also under `if` and in class bodies), resolves relative
    ones, ignores imports inside functions and `try` blocks, and names each missing module with its importer."""
    site = tmp_path / "site"
    _write(site, "sglang/__init__.py", "")
    _write(site, "sglang/benchmark/__init__.py", "")
    _write(site, "sglang/benchmark/one_batch_server.py", """\
        import json
        import numpy as np                      # the image's
        from datasets import load_dataset       # neither the bundle's nor the image's
        from sglang.test.test_utils import is_in_ci
        from .bench_utils import helper         # relative, present
        from sglang.srt.server_args import ServerArgs
        try:
            import guidance                     # optional: caught
        except ImportError:
            guidance = None
        if json:
            from sglang.test.nightly_bench_utils import save
        class Runner:
            from sglang.profiler import run_profile

        def lazy():
            import vllm                         # lazy: not run on import
        """)
    _write(site, "sglang/benchmark/bench_utils.py", "from sglang.utils import get_exception_traceback\n")
    _write(site, "sglang/utils.py", "")
    problems = bundle.import_problems(site, ["sglang.benchmark.one_batch_server"])
    assert problems == sorted([
        "datasets (imported by sglang.benchmark.one_batch_server): neither in the bundle nor in the device image",
        "sglang.profiler (imported by sglang.benchmark.one_batch_server) is not in the bundle",
        "sglang.srt.server_args (imported by sglang.benchmark.one_batch_server) is not in the bundle",
        "sglang.test.nightly_bench_utils (imported by sglang.benchmark.one_batch_server) is not in the bundle",
        "sglang.test.test_utils (imported by sglang.benchmark.one_batch_server) is not in the bundle",
    ])
    for rel in ("datasets/__init__.py", "sglang/test/__init__.py", "sglang/test/nightly_bench_utils.py",
                "sglang/srt/__init__.py", "sglang/srt/server_args.py", "sglang/profiler.py"):
        _write(site, rel, "")
    _write(site, "sglang/test/test_utils.py", "from sglang.test.run_eval import run_eval\n")
    assert bundle.import_problems(site, ["sglang.benchmark.one_batch_server"]) == [
        "sglang.test.run_eval (imported by sglang.test.test_utils) is not in the bundle"]
    _write(site, "sglang/test/run_eval.py", "import torch, PIL.Image, yaml\n")  # image packages
    assert bundle.import_problems(site, ["sglang.benchmark.one_batch_server"]) == []


def test_missing_lock_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sglang_bundle.py lock"):
        bundle.read_lock(tmp_path / "none.lock")


def test_a_build_kept_for_this_lock_and_script_is_copied_not_rebuilt(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh checkout (no .device/) copies the tarball an earlier build of the same lock and script kept in the
    build cache; one that does not match (another script, a damaged tarball) is not used."""
    device, build_dir = tmp_path / "device", tmp_path / "build"
    for name, value in (("DEVICE_DIR", device), ("TARBALL", device / bundle.TARBALL.name),
                        ("MANIFEST", device / bundle.MANIFEST.name), ("BUILD_DIR", build_dir)):
        monkeypatch.setattr(bundle, name, value)
    monkeypatch.setattr(bundle, "REPO", tmp_path)
    lock_sha, script_sha = bundle.sha256_of(bundle.LOCK), bundle.sha256_of(SCRIPT)
    device.mkdir()
    bundle.TARBALL.write_bytes(b"not really xz")
    manifest = {"lock_sha256": lock_sha, "script_sha256": script_sha, "sha256": bundle.sha256_of(bundle.TARBALL)}
    bundle.MANIFEST.write_text(json.dumps(manifest))
    assert bundle.build() == manifest  # up to date: kept for the next checkout on the way
    kept = build_dir / "bundles" / f"{lock_sha[:16]}-{script_sha[:16]}"
    assert (kept / bundle.TARBALL.name).read_bytes() == b"not really xz"
    bundle.TARBALL.unlink()
    bundle.MANIFEST.unlink()
    monkeypatch.setattr(bundle, "download", lambda lock: pytest.fail("rebuilt instead of copying the kept build"))
    assert bundle.build() == manifest
    assert bundle.TARBALL.read_bytes() == b"not really xz" and json.loads(bundle.MANIFEST.read_text()) == manifest
    assert bundle.restore_built(kept, lock_sha, "another script") is None
    (kept / bundle.TARBALL.name).write_bytes(b"damaged")
    assert bundle.restore_built(kept, lock_sha, script_sha) is None


@pytest.mark.slow
def test_builder_writes_a_checked_tarball_under_60_mib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs the builder (wheels from ~/.cache/spectrial/sglang-wheels, downloaded the first time: ~650 MB,
    and ~7 min of xz on 2 cores when it has to pack), then reads the tarball back."""
    p = subprocess.run([sys.executable, str(SCRIPT), "build"], capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0, p.stderr[-3000:]
    manifest = json.loads(bundle.MANIFEST.read_text())
    size = bundle.TARBALL.stat().st_size
    assert size == manifest["tarball_bytes"] <= 60 * 2**20
    assert manifest["sha256"] == bundle.sha256_of(bundle.TARBALL)
    lock = bundle.read_lock()
    assert manifest["distributions"] == {n: e.version for n, e in lock.items()}
    assert manifest["lock_sha256"] == bundle.sha256_of(bundle.LOCK)
    assert 200 * 2**20 < manifest["unpacked_bytes"] < manifest["installed_bytes_before_trims"]

    names = set(bundle.tarball_names(bundle.TARBALL))
    for rel in bundle.MUST_HAVE:
        assert rel in names, rel
    assert sum(n.startswith("flashinfer/data/csrc/") for n in names) > 100
    trimmed = [t["path"] for t in manifest["trimmed"]]
    assert "sgl_kernel/flash_ops.abi3.so" in trimmed
    assert not [n for n in names for t in trimmed if n == t or n.startswith(t + "/")]
    assert not [n for n in names if "__pycache__" in n]
    dist_infos = {n.split("/")[0][: -len(".dist-info")] for n in names if n.split("/")[0].endswith(".dist-info")}
    assert {canonicalize_name(d.rsplit("-", 1)[0]): d.rsplit("-", 1)[1] for d in dist_infos} == manifest[
        "distributions"]

    site = tmp_path / "site"  # the tarball's own contents (the build folder is shared with other checkouts)
    site.mkdir()
    subprocess.run(["tar", "-C", str(site), "-xJf", str(bundle.TARBALL)], check=True)
    # the JIT source in the tarball is byte for byte the one in the FlashInfer wheel
    wheel = bundle.CACHE / lock["flashinfer-python"].file
    with zipfile.ZipFile(wheel) as z:
        assert (site / "flashinfer/data/csrc/norm.cu").read_bytes() == z.read("flashinfer/data/csrc/norm.cu")

    # SGLang's benchmark tools import from the bundle (read statically here; run on the device: docs/DEVICE.md)
    for rel in (*bundle.KEEP, "sglang/benchmark/one_batch_server.py", "sglang/bench_serving.py",
                "datasets/__init__.py", "multiprocess/__init__.py"):
        assert rel in names, rel
    assert bundle.import_problems(site) == []
    assert not [n for n in names if n.startswith(("jedi/third_party/", "sglang/test/ascend/"))]

    again = subprocess.run([sys.executable, str(SCRIPT), "check"], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    monkeypatch.setattr(bundle, "LIMIT_BYTES", size - 1)
    with pytest.raises(SpectrialError, match="over the"):
        bundle.check_tarball(bundle.TARBALL)
