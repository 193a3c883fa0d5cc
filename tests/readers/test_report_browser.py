"""A real browser opens a generated report.html offline: the plotly figures must render.

Headless Chromium (Debian package `chromium`, installed by scripts/ensure-chromium.sh) loads the report
from file:// with every host name unresolvable, so nothing can come from a CDN. The DOM after the
scripts ran must hold plotly's SVG elements for every figure, and a screenshot tall enough to hold the first figure
(below the doctor's findings, which come first) must show drawn pixels in plotly's trace colours (decoded with a small zlib + struct PNG reader).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from spectrial.readers.casestudy import case_dir
from spectrial.readers.render.report import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed: run scripts/ensure-chromium.sh as root "
                             "(apt-get install -y --no-install-recommends chromium)")]
PLOTLY_COLOURS = [(0x63, 0x6E, 0xFA), (0xEF, 0x55, 0x3B), (0x00, 0xCC, 0x96), (0xAB, 0x63, 0xFA)]


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=5000", "--window-size=1200,9000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # type: ignore[arg-type]


def read_png(path: Path) -> np.ndarray:
    """Decode an 8-bit RGB/RGBA PNG (all five row filters) into an (h, w, channels) uint8 array."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, [], 0
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), f"unsupported PNG: depth {depth}, colour type {colour}"
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        f, line = raw[y * (stride + 1)], np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1)
        if f == 0:
            cur = line.copy()
        elif f == 1:
            cur = np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint8).ravel()
        elif f == 2:
            cur = line + prev
        else:
            cur = _avg_paeth(f, line.tolist(), prev.tolist(), bpp)
        out[y] = cur
        prev = cur
    return out.reshape(height, width, bpp)


def _avg_paeth(f: int, line: list[int], up: list[int], bpp: int) -> np.ndarray:
    cur = [0] * len(line)
    for i, x in enumerate(line):
        a = cur[i - bpp] if i >= bpp else 0
        b = up[i]
        if f == 3:
            cur[i] = (x + ((a + b) >> 1)) & 255
            continue
        c = up[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        cur[i] = (x + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return np.array(cur, dtype=np.uint8)


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    run = tmp_path / "case"
    shutil.copytree(case_dir(), run)
    report = write_report(run)
    n_fig = report.read_text().count("Plotly.newPlot(")
    assert n_fig >= 3
    url = report.resolve().as_uri()

    dom = chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert html.count('class="plot-container plotly"') == n_fig  # every figure was built by plotly.js
    assert html.count('class="main-svg"') >= 2 * n_fig  # plotly's SVG layers
    assert html.count('class="trace scatter') >= n_fig  # and traces inside them
    assert "spectrial-figure-1" in html

    shot = tmp_path / "shot.png"
    res = chromium(tmp_path, f"--screenshot={shot}", url)
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    img = read_png(shot)[..., :3].astype(int)
    assert img.shape[:2] == (9000, 1200)
    assert img.std() > 10, "screenshot is blank"
    non_white = float(np.mean(np.any(img < 240, axis=2)))
    assert non_white > 0.02, f"only {non_white:.1%} of the screenshot is not white"
    coloured = sum(int(np.sum(np.all(np.abs(img - np.array(c)) <= 12, axis=2))) for c in PLOTLY_COLOURS)
    assert coloured > 300, f"only {coloured} pixels in plotly's trace colours: figures not drawn"
