"""`spectrial watch --push-gateway URL`: a watch's change points as Prometheus series, pushed to a Pushgateway
(Prometheus scrapes it with `honor_labels: true`), so that the team sees them where it looks: the Grafana dashboard
of spectrial.watch.grafana draws them as annotations.

One group per watch (`job="spectrial-watch"`, `run_id`), replaced whole at every push (PUT): the set of change
points found so far, live as they are found and once more at the end. Per change point, labels engine, server,
series, index, direction, before, after (the means, 3 significant digits) and the gauges:

- `spectrial_watch_change_time_seconds`: when the new level starts (Unix seconds; the dashboard's annotation
  reads it as the event's time),
- `spectrial_watch_change_relative`: after_mean / before_mean - 1,
- `spectrial_watch_change_before_mean`, `spectrial_watch_change_after_mean`.

Every exchange is bounded (spectrial.measure.httpread: a deadline and a size cap). A gateway that does not answer at
the start is bad input (ConfigError, before the watch begins); a push that fails later is a note in the record and a
line on the console: the watch goes on.
"""

from __future__ import annotations

import base64
import datetime as dt
import re

import httpx
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from spectrial.errors import ConfigError
from spectrial.measure.httpread import MIB, BoundExceeded, Limits, bounded_client
from spectrial.schema import WatchChange, WatchRecord

JOB = "spectrial-watch"
# a push (or the readiness check) ends within 5 s whatever the gateway does: the last push happens on the way out,
# an interrupt's included, and must not hold the exit up
PUSH = Limits(deadline_s=5.0, read_s=5.0, max_bytes=1 * MIB, connect_s=3.0)
LABELS = ("engine", "server", "series", "index", "direction", "before", "after")
FAMILIES = {
    "spectrial_watch_change_time_seconds": "When the new level starts (Unix seconds)",
    "spectrial_watch_change_relative": "after_mean / before_mean - 1",
    "spectrial_watch_change_before_mean": "The series' mean before the change",
    "spectrial_watch_change_after_mean": "The series' mean after the change",
}


def group_url(gateway: str, run_id: str) -> str:
    """The Pushgateway URL of one watch's group (`/metrics/job/spectrial-watch/run_id/<id>`; a run id with other
    characters than letters, digits and `._~-` in the Pushgateway's `@base64` form)."""
    if re.fullmatch(r"[A-Za-z0-9._~-]+", run_id):
        return f"{gateway.rstrip('/')}/metrics/job/{JOB}/run_id/{run_id}"
    return f"{gateway.rstrip('/')}/metrics/job/{JOB}/run_id@base64/{base64.urlsafe_b64encode(run_id.encode()).decode()}"


def exposition(w: WatchRecord, changes: list[WatchChange]) -> bytes:
    """The change points as Prometheus text (prometheus_client's exposition of one registry)."""
    reg = CollectorRegistry()
    gauges = {name: Gauge(name, doc, LABELS, registry=reg) for name, doc in FAMILIES.items()}
    for c in changes:
        labels = {"engine": w.engine, "server": w.selector or w.url, "series": c.series, "index": str(c.index),
                  "direction": "up" if c.relative_change > 0 else "down", "before": f"{c.before_mean:.3g}",
                  "after": f"{c.after_mean:.3g}"}
        at = dt.datetime.fromisoformat(c.at.replace("Z", "+00:00"))
        if at.tzinfo is None:
            at = at.replace(tzinfo=dt.UTC)
        values = {"spectrial_watch_change_time_seconds": at.timestamp(),
                  "spectrial_watch_change_relative": c.relative_change,
                  "spectrial_watch_change_before_mean": c.before_mean,
                  "spectrial_watch_change_after_mean": c.after_mean}
        for name, v in values.items():
            gauges[name].labels(**labels).set(v)
    return generate_latest(reg)


class Pusher:
    """Pushes one watch's change points to a Pushgateway (see the module docstring)."""

    def __init__(self, gateway: str) -> None:
        self.gateway = gateway.strip().rstrip("/")
        if "://" not in self.gateway:
            self.gateway = "http://" + self.gateway
        self.url: str | None = None  # the group's, once the run id is known (`bind`)
        self.client = bounded_client(PUSH)
        self.last: tuple[tuple[str, int], ...] | None = None

    def bind(self, run_id: str) -> None:
        self.url = group_url(self.gateway, run_id)

    def check(self) -> None:
        """The gateway answers as a Pushgateway (its readiness endpoint); ConfigError naming --push-gateway."""
        try:
            r = self.client.get(f"{self.gateway}/-/ready")
        except (httpx.HTTPError, BoundExceeded) as exc:
            raise ConfigError(f"--push-gateway: {self.gateway} does not answer ({type(exc).__name__}: {exc})",
                              parameter="push_gateway",
                              hint="give the Pushgateway's base URL, e.g. http://127.0.0.1:9091") from None
        if r.status_code != 200:
            raise ConfigError(f"--push-gateway: {self.gateway}/-/ready answered HTTP {r.status_code}: not a ready "
                              "Pushgateway", parameter="push_gateway",
                              hint="give the Pushgateway's base URL, e.g. http://127.0.0.1:9091")

    def push(self, w: WatchRecord, force: bool = False) -> str | None:
        """Replace the group with the change points found so far (only when they changed, unless `force`); None
        when pushed or nothing to do, else what went wrong (for a note)."""
        assert self.url is not None, "bind(run_id) first"
        key = tuple((c.series, c.index) for c in w.changes)
        if key == self.last and not force:
            return None
        try:
            r = self.client.put(self.url, content=exposition(w, w.changes),
                                headers={"Content-Type": "text/plain; version=0.0.4"})
        except (httpx.HTTPError, BoundExceeded) as exc:
            return f"push of the change points to {self.gateway} failed ({type(exc).__name__}: {exc})"
        if r.status_code not in (200, 202):
            return f"push of the change points to {self.gateway} failed: HTTP {r.status_code} {r.text[:200]!r}"
        self.last = key
        return None

    def close(self) -> None:
        self.client.close()
