"""Optional load for a watch (`--drive-rate R --params FILE`): the params file's workload sent at R requests/s,
open loop, with spectrial.measure.bench's streaming client and the engine's own request bodies. Off by default: a
production server gets only what its users send."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from spectrial.errors import ConfigError
from spectrial.measure.bench import stream_completion, stream_limits
from spectrial.measure.httpread import Limits, bounded_client
from spectrial.schema import RequestRecord

MAX_IN_FLIGHT = 64  # requests open at once at most (a server slower than the rate is not flooded without bound)


class Driver:
    """Sends the workload's items in their seeded order, one every 1/rate s, on a background thread."""

    def __init__(self, url: str, params_file: str | None, rate: float) -> None:
        if not params_file:
            raise ConfigError("--drive-rate needs --params FILE (the workload to send)", parameter="params")
        from spectrial.engines.base import get_engine
        from spectrial.hosts.local import LocalHost
        from spectrial.measure.workloads import build_workload, estimate_lengths, request_order
        from spectrial.params import load_params

        p = load_params(params_file, {})
        engine = get_engine(p.engine, p, LocalHost())
        wl = build_workload(p, lengths=estimate_lengths(p.request_format == "chat"), unit="estimated tokens")
        self.items = request_order(wl.items, max(len(wl.items), 1), p.seed)
        if not self.items:
            raise ConfigError(f"--params {params_file}: its workload has no items", parameter="params")
        self.path, self.payload = engine.request_target(p.request_format)
        self.stats_fn, self.max_tokens = engine.request_stats, p.max_tokens
        self.url, self.rate = url, rate
        self.stop_event = threading.Event()
        self.pool = ThreadPoolExecutor(MAX_IN_FLIGHT)
        self.limits = stream_limits(p)
        self.client = bounded_client(Limits(deadline_s=self.limits.total_s(p.max_tokens), read_s=300,
                                            max_bytes=self.limits.max_bytes(p.max_tokens)))
        self.futures: list[Future[RequestRecord]] = []
        self.skipped = 0
        self.thread = threading.Thread(target=self._loop, name="spectrial-watch-drive", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        t, i = time.monotonic(), 0
        while not self.stop_event.is_set():
            if sum(not f.done() for f in self.futures) >= MAX_IN_FLIGHT:
                self.skipped += 1
            else:
                item = self.items[i % len(self.items)]
                body = self.payload(item, self.max_tokens)
                self.futures.append(self.pool.submit(stream_completion, self.client, self.url, body, self.stats_fn,
                                                     self.limits.first_token_s, self.path, self.limits))
                i += 1
            t += 1.0 / self.rate
            self.stop_event.wait(max(0.0, t - time.monotonic()))

    def stop(self) -> None:
        """Stop sending; requests in flight are left to finish on the server (not waited for)."""
        self.stop_event.set()
        self.thread.join(timeout=5)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def summary(self) -> str:
        done = [f.result() for f in self.futures if f.done() and not f.cancelled() and f.exception() is None]
        failed = sum(1 for r in done if r.error)
        return (f"driven load: {len(self.futures)} request(s) sent at {self.rate:g}/s ({len(done)} finished, "
                f"{failed} failed, {self.skipped} skipped at {MAX_IN_FLIGHT} in flight)")
