"""Are two runs comparable? One answer, one set of categories, for every reader (issue 38).

`compare(a, b)` takes two run records (`Manifest`), or one arm of each (`arms=`), or the facts a reader already
holds of them (`Facts`, e.g. a history row), and returns a `Comparability`: every `Difference` found, each with its
category, the field, both values, why it matters and what to do; `comparable` is True when no difference falls in a
category the caller requires (`require=`, less `ignore=`).

The categories, in the order a verdict names them:

    GPU              the GPU model(s) and their count (the CPU where a run recorded no GPU)
    host             the machine beyond its GPU model: its name where no fingerprint says more, hostname, kernel,
                     CPU, governor, the GPU units, driver, clocks and power limits, links, CUDA
    model            the target model as named, with its file's identity where the record maps it
    model files      every model file's identity (size, head/tail hash), paired by path, else by file name; a file
                     only one run names, or whose identity a run did not record, is no difference
    engine           which engine (llamacpp, vllm, sglang)
    engine version   the engine's own version line
    engine build     the build beneath the version: source commit, source diff, the server binary's identity
    workload         the requests asked: items, format, lengths, seed
    sampling         how tokens were drawn (greedy, temperature, ...)
    concurrency      requests in flight
    repeats          the measurement design: repeats, restarts, warm-up requests
    configuration    the resolved launch: environment variables, command-line options, the set of arms
    arm settings     an arm's speculative settings (method, draft, depth, tree, synthetic acceptance)
    resolved config  what the engine resolved, read back from the running server (slots, context, method, depth,
                     parallel sizes, graph limits: spectrial.servers.configcheck): "as asked" where it matched the
                     params (those are compared as configuration), else the value (the engine's own choice, or
                     one that differs from the params); model paths left out (the files' identity is compared);
                     compared only where both runs read it
    fingerprint key  the host-and-build state key a run measured under
    session          the run (and, for an arm, its session): separate server starts in possibly other states

Which categories each reader requires (its narrower or wider notion) is stated beside the reader: the gate's
`REQUIRES`, diff's `REQUIRES`, drift's `REQUIRES`, the history's `REQUIRES`.

Pure functions of typed records: no files, no output.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, Field, JsonValue

from spectrial.params import workload_identity
from spectrial.schema import HostInfo, Manifest, stable_view

Category = Literal["GPU", "host", "model", "model files", "engine", "engine version", "engine build", "workload",
                   "sampling", "concurrency", "repeats", "configuration", "arm settings", "resolved config",
                   "fingerprint key", "session"]
CATEGORIES: tuple[Category, ...] = get_args(Category)

# why a difference in each category makes figures incomparable, and what to do about it
WHY: dict[Category, tuple[str, str]] = {
    "GPU": ("another GPU (or none) decodes at another speed",
            "compare runs of the same GPU model and count"),
    "host": ("another machine or machine state (driver, clocks, kernel, CPU) moves decode rates",
             "re-run on the same host in the same state (`spectrial diff` names the fields)"),
    "model": ("another target model measures another thing",
              "compare runs of the same target model"),
    "model files": ("a model file's content changed (same name, other bytes)",
                    "re-run with the same model files, or compare only runs that used them"),
    "engine": ("another engine runs other kernels", "compare runs of the same engine"),
    "engine version": ("another engine version can change kernels, scheduling and acceptance",
                       "compare runs of the same engine version (or allow it, to measure an upgrade)"),
    "engine build": ("another build of the engine (commit, source diff, binary)",
                     "compare runs of the same build"),
    "workload": ("other requests (items, format, lengths, seed) give other figures",
                 "re-run with the same workload"),
    "sampling": ("another sampling changes acceptance", "re-run with the same sampling"),
    "concurrency": ("another number of requests in flight changes per-request rates",
                    "re-run at the same concurrency"),
    "repeats": ("another measurement design (repeats, restarts, warm-up) measures other requests",
                "re-run with the same repeats, restarts and warm-up"),
    "configuration": ("the launch differs (environment, options): the experiment itself, or a confound",
                      "make it the only difference, or launch both the same way"),
    "arm settings": ("the arm's speculative settings differ", "compare arms of the same settings"),
    "resolved config": ("the engine resolved other settings (slots, context, depth, graph limits) than in the other "
                        "run", "set the differing setting through the params in both runs (the record's "
                        "config_check names where it was read)"),
    "fingerprint key": ("measured under another host-and-build state",
                        "compare runs of one fingerprint key"),
    "session": ("separate server starts in possibly different system states, neither with a baseline measured "
                "beside the other", "measure both in one session, interleaved, each with its baseline beside it"),
}

# host fields that go with the GPU: when the GPU itself differs, their being recorded in one run only says nothing
GPU_BOUND = frozenset({"GPU units", "driver", "clocks and power limits", "topology", "CUDA"})
# fields compared only where both runs record them (a file only one run uses belongs to an arm only that run has;
# one run's GPU units unrecorded is no other machine)
_LENIENT_PREFIX = "file "
_LENIENT = frozenset({"GPU units"})
ARM_CATEGORIES: tuple[Category, ...] = ("configuration", "arm settings", "resolved config")
_PATHS = frozenset({"model", "draft_model"})  # resolved paths: machine-specific; the files' identity is compared
ARM_SETTINGS = ("method", "draft", "steps", "topk", "draft_tokens", "synthetic_accept")


_GPU_FIELDS = {"driver_version": "driver", "clocks.max.sm": "clocks and power limits",
               "clocks.max.mem": "clocks and power limits", "power.limit": "clocks and power limits",
               "persistence_mode": "clocks and power limits", "ecc.mode.current": "clocks and power limits",
               "pcie.link.gen.max": "topology", "pcie.link.width.current": "topology"}


# --- the result ------------------------------------------------------------------------------------------------
class Difference(BaseModel):
    """One thing two runs (or arms) differ in: `a` and `b` as each records it (None: not recorded there)."""

    category: Category
    field: str = Field(description="What differs within the category (a parameter, a variable, a file, ...)")
    a: JsonValue = None
    b: JsonValue = None
    recorded: Literal["both", "a", "b", "neither"] = Field(
        "both", description="Which run records it: 'both' (the values differ), one ('recorded in one run only'), "
                            "or 'neither' (a category a reader needs recorded)")
    arm: str | None = Field(None, description="The arm it belongs to (arm-level categories)")
    reason: str = ""
    fix: str = ""

    def text(self) -> str:
        """'workload: max_tokens 64 vs 7', 'host: kernel recorded in A only', ..."""
        where = f"{self.arm}: " if self.arm else ""
        if self.recorded == "both":
            return f"{where}{self.category}: {self.field} {self.a!r} vs {self.b!r}"
        side = {"a": "A only", "b": "B only", "neither": "neither run"}[self.recorded]
        return f"{where}{self.category}: {self.field} recorded in {side}"


class Comparability(BaseModel):
    """Whether two runs (or arms) can be compared: every difference found, and which categories were required."""

    comparable: bool
    required: list[Category] = Field(default_factory=list)
    differences: list[Difference] = Field(default_factory=list)

    @property
    def blocking(self) -> list[Difference]:
        """The differences in required categories: why the runs are not comparable."""
        return [d for d in self.differences if d.category in self.required]

    @property
    def allowed(self) -> list[Difference]:
        """The differences in categories not required (the experiment, or what the reader allows)."""
        return [d for d in self.differences if d.category not in self.required]

    def categories(self, blocking: bool = True) -> list[Category]:
        """The categories that differ (the blocking ones, or all), in `CATEGORIES` order."""
        found = {d.category for d in (self.blocking if blocking else self.differences)}
        return [c for c in CATEGORIES if c in found]

    def of(self, category: Category) -> list[Difference]:
        return [d for d in self.differences if d.category == category]


class Facts(BaseModel):
    """What one run (or one arm of it) records of each category: field -> value (None: not recorded). A reader
    that holds a record's facts in another shape (a history row) states them as this."""

    label: str = ""
    values: dict[Category, dict[str, JsonValue]] = Field(default_factory=dict)

    def get(self, category: Category) -> dict[str, JsonValue]:
        return self.values.get(category, {})


# --- what a record says ----------------------------------------------------------------------------------------
def _gpu(m: Manifest) -> str | None:
    host, fp = m.host, m.host.fingerprint
    names: list[str] | None = None
    if fp is not None and fp.gpus is not None:
        names = [str(g.get("name")) for g in fp.gpus]
    elif host.gpus is not None:
        names = [str(g.name) for g in host.gpus.gpus]
    elif host.gpu_key:
        names = [host.gpu_key] * (host.gpu_count or 1)
    if names:
        return f"{len(names)} x {', '.join(sorted(set(names)))}"
    if fp is not None and fp.cpu_model:
        return f"CPU {fp.cpu_model} x {fp.cpu_count}"
    return "none" if names == [] else None


def _gpu_rows(host: HostInfo) -> list[dict[str, str | list[str] | None]]:
    if host.fingerprint is not None and host.fingerprint.gpus is not None:
        return stable_view(host.fingerprint)["gpus"]
    if host.gpus is not None:
        return [{"name": g.name, "uuid": g.uuid} for g in host.gpus.gpus]
    return []


def _host(m: Manifest) -> dict[str, JsonValue]:
    host, fp = m.host, m.host.fingerprint
    rows = _gpu_rows(host)
    units = sorted(str(g["uuid"]) for g in rows if g.get("uuid"))
    out: dict[str, JsonValue] = {"GPU units": units or None}
    if fp is None:  # the host's name stands for the machine only where no fingerprint says what it is
        out["name"] = host.name
    view = stable_view(fp) if fp is not None else None
    for k in ("hostname", "kernel", "cpu_model", "cpu_count", "cpu_governor"):
        out[k] = view[k] if view is not None else None  # type: ignore[literal-required]
    drivers = sorted({str(g["driver_version"]) for g in rows if g.get("driver_version")})
    out["driver"] = drivers or ([host.driver] if host.driver else None)
    for cat in ("clocks and power limits", "topology"):
        keys = [k for k, c in _GPU_FIELDS.items() if c == cat]
        vals: list[JsonValue] = [[g.get(k) for k in keys] for g in rows if any(g.get(k) is not None for k in keys)]
        out[cat] = vals or None
    if host.interconnect:
        out["topology"] = [host.interconnect]
    cuda = (view["cuda_version"] if view is not None else None) or host.cuda
    out["CUDA"] = str(cuda) if cuda else None
    return out


def _target(m: Manifest) -> str | None:
    ref = m.params.model or (m.model_info.name if m.model_info is not None else None)
    path = (m.engine.models or {}).get(str(ref)) if ref is not None else None
    ident = next((f for f in m.models if path and f.path == path), None)
    if ident is not None and ident.head_tail_sha256:
        return f"{ref} ({ident.size} bytes, {ident.head_tail_sha256})"
    return str(ref) if ref is not None else None


def _files(m: Manifest) -> dict[str, JsonValue]:
    """Each model file's identity, by file name (by path where two files share a name)."""
    names = [Path(f.path).name for f in m.models]
    return {_LENIENT_PREFIX + (n if names.count(n) == 1 else f.path): [f.head_tail_sha256, f.size]
            for f, n in zip(m.models, names, strict=True)}


def _arm_facts(m: Manifest, arm: str) -> dict[Category, dict[str, JsonValue]]:
    a = m.arm(arm)
    if a is None:
        return {"session": {"run": m.run_id, "session": None}}
    config: dict[str, JsonValue] = dict(a.env or {})
    if a.argv:
        config.update(argv_options(a.argv))
    return {"session": {"run": m.run_id, "session": a.session},
            "configuration": config,
            "arm settings": {k: a.get(k) for k in ARM_SETTINGS},
            "resolved config": {k: v for k, v in (a.config_check.facts() if a.config_check else {}).items()
                                if k not in _PATHS}}


def facts(m: Manifest, arm: str | None = None) -> Facts:
    """What record `m` (or its arm `arm`) says of each category."""
    eng, p = m.engine, m.params
    recorded = p.as_dict()
    work = workload_identity(recorded) if recorded else {}
    sampling = work.pop("sampling", None)
    binary = eng.binary_identity
    values: dict[Category, dict[str, JsonValue]] = {
        "GPU": {"GPUs": _gpu(m)},
        "host": _host(m),
        "model": {"target": _target(m)},
        "model files": _files(m),
        "engine": {"name": eng.name or p.engine},
        "engine version": {"version": (eng.version or "").strip() or None},
        "engine build": {"commit": eng.commit, "diff hash": eng.diff_hash,
                         "binary": [binary.head_tail_sha256, binary.size] if binary is not None else None},
        "workload": {k: work.get(k) for k in work} if recorded else {},
        "sampling": {"sampling": sampling},
        "concurrency": {"concurrency": p.concurrency if recorded else None},
        "repeats": {"repeats": p.repeats, "restarts": p.restarts, "warmup": p.warmup},
        "configuration": {**(p.env or {}), "the set of arms": sorted(a.name for a in m.arms)},
        "fingerprint key": {"key": m.fingerprint_key},
        "session": {"run": m.run_id},
    }
    if arm is not None:
        values.update(_arm_facts(m, arm))
    return Facts(label=f"{m.run_id}/{arm}" if arm else m.run_id, values=values)


# --- the one comparison ----------------------------------------------------------------------------------------
def _compare(fa: Facts, fb: Facts, categories: Iterable[Category], strict: frozenset[Category],
             gpu_differs: bool, arm: str | None = None) -> Iterator[Difference]:
    for cat in categories:
        va, vb = fa.get(cat), fb.get(cat)
        reason, fix = WHY[cat]
        for name in list(dict.fromkeys([*va, *vb])):
            x, y = va.get(name), vb.get(name)
            if x is None and y is None:
                if cat in strict:
                    yield Difference(category=cat, field=name, recorded="neither", arm=arm, reason=reason, fix=fix)
                continue
            if x is None or y is None:
                if cat == "resolved config" or name.startswith(_LENIENT_PREFIX) or name in _LENIENT or (gpu_differs and name in GPU_BOUND):
                    continue
                yield Difference(category=cat, field=name, a=x, b=y, recorded="a" if y is None else "b", arm=arm,
                                 reason=reason, fix=fix)
            elif x != y:
                if (name.startswith(_LENIENT_PREFIX) and isinstance(x, list) and isinstance(y, list)
                        and None in (x[0], y[0])):
                    continue  # a file's identity one run did not record: not known to differ
                if gpu_differs and name == "GPU units":
                    continue  # another GPU model: its units differ with it
                yield Difference(category=cat, field=name, a=x, b=y, arm=arm, reason=reason, fix=fix)


def compare(a: Manifest | Facts, b: Manifest | Facts, *, arms: tuple[str, str] | None = None,
            require: Iterable[Category] = CATEGORIES, ignore: Iterable[Category] = (),
            strict: Iterable[Category] = ()) -> Comparability:
    """Whether `a` and `b` can be compared, and every difference found (see the module docstring).

    `a`, `b`: run records, or the facts a reader holds of them. `arms`: compare arm `arms[0]` of `a` with arm
    `arms[1]` of `b` (their arm-level categories: session, configuration, arm settings); without it, two records
    are compared run against run and arm by arm for every arm both have. `require`: the categories that must not
    differ for the runs to be comparable (default: all), less `ignore` (what the caller allows). `strict`:
    categories whose fields must be recorded (a field neither records is a difference)."""
    if isinstance(a, Manifest) and isinstance(b, Manifest):
        fa, fb = facts(a, arms[0] if arms else None), facts(b, arms[1] if arms else None)
    elif isinstance(a, Facts) and isinstance(b, Facts):
        fa, fb = a, b
    else:
        raise TypeError("compare: two records (Manifest) or two Facts")
    need = [c for c in CATEGORIES if c in set(require) - set(ignore)]
    strict_ = frozenset(strict)
    gpu = list(_compare(fa, fb, ("GPU",), strict_, False))
    gpu_differs = any(d.recorded == "both" for d in gpu)
    run_level = [c for c in CATEGORIES if c not in ("GPU", "configuration")]
    out = gpu + list(_compare(fa, fb, run_level, strict_, gpu_differs))
    if arms is None and isinstance(a, Manifest) and isinstance(b, Manifest):
        names_b = {x.name for x in b.arms}
        for n in [x.name for x in a.arms if x.name in names_b]:
            pa, pb = Facts(values=_arm_facts(a, n)), Facts(values=_arm_facts(b, n))
            out += _compare(pa, pb, ARM_CATEGORIES, strict_, gpu_differs, arm=n)
    out += _compare(fa, fb, ("configuration",), strict_, gpu_differs)
    order = {c: i for i, c in enumerate(CATEGORIES)}
    out.sort(key=lambda d: order[d.category])
    return Comparability(comparable=not any(d.category in need for d in out), required=need, differences=out)


def argv_options(argv: list[str]) -> dict[str, str]:
    """A launch command's options as {flag: value} ("" for a flag without a value)."""
    opts: dict[str, str] = {}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            opts[a] = argv[i + 1]
            i += 2
        else:
            opts[a] = ""
            i += 1
    return opts
