"""A private Prometheus for the watch tests (Debian's `prometheus`, installed by scripts/ensure-prometheus.sh as
`make test` does): on loopback, its own config and storage under the test's tmp_path, scraping the given targets
every second, stopped by its own process group."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sshd_plugin import free_port

REPO = Path(__file__).resolve().parents[2]
GLOBAL = "global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}\nscrape_configs:\n"
JOB = '  - job_name: {job}\n    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]\n'
HONOR = "    honor_labels: true\n"  # a Pushgateway's job: the pushed series keep their own job label


def binary(name: str = "prometheus") -> str:
    """The prometheus (or prometheus-pushgateway) binary (installed on first use; the test is skipped, saying why,
    where that fails)."""
    found = shutil.which(name) or f"/usr/bin/{name}"
    if not Path(found).exists():
        done = subprocess.run([str(REPO / "scripts" / "ensure-prometheus.sh")], capture_output=True, text=True,
                              timeout=600)
        if not Path(found).exists():
            pytest.skip(f"no prometheus: {done.stdout[-400:]}{done.stderr[-400:]}")
    return found


@contextlib.contextmanager
def running(workdir: Path, jobs: dict[str, int], honor_labels: tuple[str, ...] = ()) -> Iterator[str]:
    """A Prometheus scraping 127.0.0.1:<port> for each job name (`honor_labels`: the jobs whose series keep their
    own job label, a Pushgateway's); yields its URL once it is ready."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "prometheus.yml"
    cfg.write_text(GLOBAL + "".join(JOB.format(job=j, port=p) + (HONOR if j in honor_labels else "")
                                    for j, p in jobs.items()))
    web = free_port()
    with _serving(workdir, "prometheus", [binary(), f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                                          f"--web.listen-address=127.0.0.1:{web}"], f"http://127.0.0.1:{web}") as url:
        yield url


@contextlib.contextmanager
def pushgateway(workdir: Path) -> Iterator[str]:
    """A Pushgateway on loopback (no persistence); yields its URL once it is ready."""
    workdir.mkdir(parents=True, exist_ok=True)
    web = free_port()
    with _serving(workdir, "pushgateway", [binary("prometheus-pushgateway"), f"--web.listen-address=127.0.0.1:{web}"],
                  f"http://127.0.0.1:{web}") as url:
        yield url


@contextlib.contextmanager
def _serving(workdir: Path, name: str, argv: list[str], url: str) -> Iterator[str]:
    """Run `argv` in its own session, log in workdir/<name>.log, until `url`/-/ready answers; stop its group."""
    with (workdir / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (workdir / f"{name}.log").read_text()[-2000:]
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{name} not ready in 60 s"
            time.sleep(0.2)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def wait_scraped(url: str, query: str, timeout: float = 30) -> None:
    """Until Prometheus holds a sample for `query` (its first scrapes after the target is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=5)
        if r.status_code == 200 and r.json()["data"]["result"]:
            return
        time.sleep(0.2)
    raise AssertionError(f"Prometheus scraped nothing of {query} in {timeout:g} s")


def query(url: str, expr: str, at: float | None = None) -> httpx.Response:
    """One instant query (`at`: Unix seconds, default now)."""
    params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    return httpx.get(f"{url}/api/v1/query", params=params, timeout=10)


def dashboard_queries(job: str, window: str) -> list[tuple[str, str, str]]:
    """Every PromQL of spectrial's Grafana dashboard (panels and annotations) as Grafana would send it with the
    `job` variable set, instance All and `$__rate_interval` = `window`: [(panel title, legend, expr)]."""
    from spectrial.watch.grafana import dashboard

    def fill(expr: str) -> str:
        return expr.replace("$job", job).replace("$instance", ".*").replace("$__rate_interval", window)

    d = dashboard()
    out = [(p["title"], t["legendFormat"], fill(t["expr"])) for p in d["panels"] for t in p["targets"]]
    out += [(a["name"], "", fill(a["expr"])) for a in d["annotations"]["list"] if "expr" in a]
    return out
