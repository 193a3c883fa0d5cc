"""A real one-node Slurm cluster on this machine (slurmctld + slurmd + munged), for tests marked `slurm`.

Fixtures:
- `slurm_cluster` (session): starts the cluster once and returns a `SlurmCluster`: `conf` (its slurm.conf),
  `env` (os.environ + SLURM_CONF, for `subprocess.run(..., env=cluster.env)`), `node`, `partition` ("debug",
  the default, no time limit), `tiny_partition` ("tiny", MaxTime=1 minute), `gpus` (2 placeholder GPUs),
  `cpus`, `run(*argv)`, `stop_slurmd()` / `start_slurmd()` (a node failure and its recovery), `wait_idle()`,
  `node_state()`, `job_ids()`, `job_fields(job_id)`, `log_tails()`.
- `slurm` (function): the same cluster; at the end of the test it cancels every job left, brings slurmd
  back if the test stopped it and waits until the node is idle, so tests do not leak into each other.

Everything lives in one private directory: a fresh MUNGE key (mode 0400) and our own `munged` on our own
socket (`AuthInfo=socket=...`, so /etc/munge and the system munge service are never used), slurm.conf and
gres.conf filled from the templates in tests/slurm/, state, spool, pid and log files, and free TCP ports for
slurmctld and slurmd. The daemons run in the foreground (`-D`), each in its own session, and are stopped by
their own pids (SIGTERM, then SIGKILL). The node has `os.cpu_count()` CPUs and two GPUs whose `File=` are
placeholder character devices with /dev/null's numbers (slurmd counts GPUs by their files: with `Count=`
alone it registers 0 and the node goes INVAL; with empty regular files it counts them but sets no
CUDA_VISIBLE_DEVICES); Slurm hands them out and sets CUDA_VISIBLE_DEVICES like on a GPU node.

Limits of this cluster, on purpose: no accounting daemon (`AccountingStorageType=accounting_storage/none`), so
`sacct` does not work; a finished job stays visible to `scontrol show job` for `MinJobAge=600` s, which is
where its final state (COMPLETED, FAILED, TIMEOUT, CANCELLED, NODE_FAIL) and exit code are read. Accounts are
not checked. Processes are tracked by `proctrack/linuxproc` (the parent chain, no cgroups), so a process that
detaches (setsid and its parent exits) escapes Slurm's cleanup. Slurm needs root here (SlurmUser=root).

SLURM_CONF is never put into os.environ: code under test takes an env mapping (`cluster.env`). On a real
cluster the site sets SLURM_CONF (or /etc/slurm/slurm.conf, or configless DNS) for its users.

The same cluster runs outside pytest, to develop against (scripts/slurm-local.sh wraps this):
    python tests/slurm_plugin.py start DIR   # start (or find running) the cluster in DIR; prints the env line
    python tests/slurm_plugin.py env DIR     # print `export SLURM_CONF=DIR/etc/slurm.conf`
    python tests/slurm_plugin.py stop DIR    # cancel its jobs and stop its daemons (by the pids in DIR)
When the binaries are missing, `scripts/ensure-slurm.sh` installs them (the fixture runs it and skips with
its message if they stay missing).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

import pytest
from sshd_plugin import free_port  # one choice of port: outside the ephemeral range

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = Path(__file__).resolve().parent / "slurm"
ENSURE_SCRIPT = REPO / "scripts" / "ensure-slurm.sh"
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
NEEDED = ("sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel", "slurmctld", "slurmd", "munged", "munge")
PARTITION = "debug"
TINY_PARTITION = "tiny"
GPUS = 2
REAL_MEMORY_MB = 4000
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0
STATE_FILE = "cluster.json"
# slurmd answers again when it runs; these are the node states of a usable node (sinfo %T, lower case)
UP_STATES = ("idle", "mixed", "allocated", "completing")


class SlurmError(RuntimeError):
    """The local cluster could not start, stop or settle; the message carries the daemons' log tails."""


def which(binary: str) -> str | None:
    """`binary` on PATH or in /usr/sbin, /sbin (Debian puts slurmctld, slurmd and munged there)."""
    return shutil.which(binary, path=SBIN_PATH)


def missing_binaries() -> list[str]:
    return [b for b in NEEDED if which(b) is None]


def _tail(path: Path, n: int) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(missing)"
    return "\n".join(lines[-n:]) if lines else "(empty)"


def _proc_alive(pid: int, exe_name: str) -> bool:
    """Whether `pid` is a live (not zombie) process whose argv[0] ends in `exe_name` (pids are reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and Path(argv0).name == exe_name


@dataclass
class Daemon:
    """One daemon started by us: its argv, its output file and its pid (`proc` only in the process that
    started it; the `slurm-local` script stops daemons started by an earlier invocation by pid)."""

    name: str
    argv: list[str]
    out: Path
    pid: int
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @classmethod
    def start(cls, name: str, argv: list[str], out: Path, env: dict[str, str]) -> Daemon:
        with out.open("ab") as f:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                    env=env, start_new_session=True)
        return cls(name, argv, out, proc.pid, proc)

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return _proc_alive(self.pid, Path(self.argv[0]).name)

    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to its pid, SIGKILL after `grace_s` (only the daemon: slurmstepd and jobs are separate)."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            if not self.alive():
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and self.alive():
                time.sleep(0.05)
        if self.alive():
            raise SlurmError(f"{self.name} (pid {self.pid}) survived SIGKILL")

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "argv": self.argv, "out": str(self.out), "pid": self.pid}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Daemon:
        argv = data["argv"]
        assert isinstance(argv, list)
        return cls(str(data["name"]), [str(a) for a in argv], Path(str(data["out"])), int(str(data["pid"])))


@dataclass
class SlurmCluster:
    """A running one-node cluster in `root` (see the module docstring)."""

    root: Path
    conf: Path
    env: dict[str, str]
    node: str
    cpus: int
    gpus: int = GPUS
    partition: str = PARTITION
    tiny_partition: str = TINY_PARTITION
    daemons: dict[str, Daemon] = field(default_factory=dict)

    # -- commands ------------------------------------------------------------------------------------------
    def run(self, *argv: str, timeout: float = 60.0, check: bool = False) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (sbatch, squeue, ...) against this cluster: env with SLURM_CONF, text output."""
        return subprocess.run(list(argv), env=self.env, text=True, capture_output=True, timeout=timeout,
                              check=check)

    def node_state(self) -> str:
        """The node's state as sinfo prints it (%T): idle, mixed, allocated, down*, idle* ("*": not responding)."""
        res = self.run("sinfo", "-h", "-n", self.node, "-o", "%T", timeout=20)
        return res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else "unknown"

    def job_ids(self) -> list[str]:
        """Jobs still in the queue (pending, running, completing), any user."""
        res = self.run("squeue", "-h", "-o", "%i", timeout=20)
        return res.stdout.split() if res.returncode == 0 else []

    def job_fields(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o JOBID` as key -> value (JobState, Reason, ExitCode, RunTime, ...); {} if gone."""
        res = self.run("scontrol", "show", "job", "-o", job_id, timeout=20)
        if res.returncode != 0:
            return {}
        fields: dict[str, str] = {}
        for token in res.stdout.split():
            key, sep, value = token.partition("=")
            if sep:
                fields[key] = value
        return fields

    def cancel_all(self) -> None:
        """scancel every job of this user (a private cluster: they are all the tests')."""
        if self.job_ids():
            self.run("scancel", "--user", getpass.getuser(), timeout=30)

    # -- waiting ---------------------------------------------------------------------------------------------
    def _check_daemons(self, names: Iterable[str] = ("munged", "slurmctld", "slurmd")) -> None:
        for name in names:
            d = self.daemons.get(name)
            if d is not None and not d.alive():
                raise SlurmError(f"{name} (pid {d.pid}) exited with code {d.exit_code()}\n{self.log_tails()}")

    def wait_node(self, states: Iterable[str], timeout: float, what: str) -> str:
        """Poll sinfo until the node is in one of `states` (the daemons are checked on every poll)."""
        wanted = tuple(states)
        deadline = time.monotonic() + timeout
        state = "unknown"
        while time.monotonic() < deadline:
            self._check_daemons()
            state = self.node_state()
            if state in wanted:
                return state
            time.sleep(0.5)
        raise SlurmError(f"{what}: node {self.node} is {state!r} after {timeout:.0f} s, wanted one of "
                         f"{wanted}\n{self.log_tails()}")

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until no job is left in the queue and the node is idle."""
        deadline = time.monotonic() + timeout
        while self.job_ids():
            if time.monotonic() > deadline:
                raise SlurmError(f"jobs still queued after {timeout:.0f} s: {self.job_ids()}\n{self.log_tails()}")
            self._check_daemons()
            time.sleep(0.5)
        self.wait_node(["idle"], max(1.0, deadline - time.monotonic()), "wait_idle")

    # -- node failure ----------------------------------------------------------------------------------------
    def stop_slurmd(self) -> None:
        """Stop slurmd by its pid (SIGTERM); its slurmstepd and the jobs' processes are left alone."""
        self.daemons["slurmd"].stop()

    def start_slurmd(self, timeout: float = 60.0) -> str:
        """Start slurmd again and wait until the node is usable; returns its state. ReturnToService=2 brings a
        DOWN node back when it registers; if it stays down 15 s, `scontrol update state=resume` does."""
        d = self.daemons.get("slurmd")
        if d is not None and d.alive():
            return self.node_state()
        self.daemons["slurmd"] = Daemon.start("slurmd", self._slurmd_argv(), self.root / "log" / "slurmd.out",
                                              self._daemon_env())
        self._save_state()
        try:
            return self.wait_node(UP_STATES, min(15.0, timeout), "slurmd restart")
        except SlurmError:
            self.run("scontrol", "update", f"nodename={self.node}", "state=resume", timeout=20)
            return self.wait_node(UP_STATES, max(5.0, timeout - 15.0), "slurmd restart + state=resume")

    # -- logs and lifecycle ----------------------------------------------------------------------------------
    def log_tails(self, n: int = 25) -> str:
        parts = [f"--- {p} (last {n} lines)\n{_tail(p, n)}" for p in sorted((self.root / "log").glob("*"))]
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel the jobs, then stop slurmd, slurmctld and munged by their pids (TERM, then KILL)."""
        with contextlib.suppress(Exception):
            if self.daemons.get("slurmctld") and self.daemons["slurmctld"].alive():
                self.cancel_all()
                deadline = time.monotonic() + 15
                while self.job_ids() and time.monotonic() < deadline:
                    time.sleep(0.5)
        errors = []
        for name in ("slurmd", "slurmctld", "munged"):
            d = self.daemons.get(name)
            if d is not None:
                try:
                    d.stop()
                except SlurmError as e:
                    errors.append(str(e))
        with contextlib.suppress(OSError):
            (self.root / STATE_FILE).unlink()
        if errors:
            raise SlurmError("; ".join(errors))

    def _daemon_env(self) -> dict[str, str]:
        return {**self.env, "PATH": SBIN_PATH}

    def _slurmd_argv(self) -> list[str]:
        return [str(which("slurmd")), "-D", "-f", str(self.conf)]

    def _save_state(self) -> None:
        data = {"conf": str(self.conf), "node": self.node, "cpus": self.cpus,
                "daemons": {k: d.to_json() for k, d in self.daemons.items()}}
        (self.root / STATE_FILE).write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, root: Path) -> SlurmCluster:
        """The cluster started earlier in `root` (by `start_cluster`, maybe in another process)."""
        data = json.loads((root / STATE_FILE).read_text())
        conf = Path(data["conf"])
        daemons = {k: Daemon.from_json(v) for k, v in data["daemons"].items()}
        return cls(root, conf, {**os.environ, "SLURM_CONF": str(conf)}, data["node"], data["cpus"],
                   daemons=daemons)


def _real_memory_mb() -> int:
    """REAL_MEMORY_MB, or half the machine's memory where it has less (slurmd drains a node that lies)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return min(REAL_MEMORY_MB, int(line.split()[1]) // 1024 // 2)
    return REAL_MEMORY_MB


def _placeholder_gpu(path: Path) -> None:
    """A stand-in for /dev/nvidiaN: a character device with /dev/null's numbers (1, 3), which slurmd accepts as
    a GPU device and then sets CUDA_VISIBLE_DEVICES / SLURM_JOB_GPUS for the jobs; an empty regular file where
    mknod is not allowed (slurmd still counts it, logs "not a valid character or block device" and sets only
    SLURM_GPUS_ON_NODE)."""
    if path.exists():
        return
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except OSError:
        path.touch()


def _wait_munged(root: Path, munged: Daemon, socket_path: Path, timeout: float = 10.0) -> None:
    """Until a credential made on our socket decodes on it (munge | unmunge)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not munged.alive():
            raise SlurmError(f"munged exited with code {munged.exit_code()}\n{_tail(munged.out, 20)}\n"
                             f"{_tail(root / 'log' / 'munged.log', 20)}")
        if socket_path.exists():
            cred = subprocess.run([str(which("munge")), "-n", "-S", str(socket_path)], capture_output=True,
                                  text=True, timeout=10)
            dec = subprocess.run([str(which("unmunge")), "-S", str(socket_path)], input=cred.stdout,
                                 capture_output=True, text=True, timeout=10)
            if cred.returncode == 0 and dec.returncode == 0:
                return
            last = (cred.stderr + dec.stderr).strip()
        time.sleep(0.1)
    raise SlurmError(f"munged not answering on {socket_path} after {timeout:.0f} s: {last}\n"
                     f"{_tail(root / 'log' / 'munged.log', 20)}")


def start_cluster(root: Path, timeout: float = START_TIMEOUT_S) -> SlurmCluster:
    """Write the config into `root` (created, mode 0700) and start munged, slurmctld and slurmd; return once
    the node is idle. A failed start stops what it started and raises `SlurmError` with the log tails."""
    if os.geteuid() != 0:
        raise SlurmError("the local Slurm cluster runs its daemons as root (SlurmUser=root); run as root")
    if missing_binaries():
        raise SlurmError(f"missing Slurm/MUNGE binaries: {missing_binaries()}; run scripts/ensure-slurm.sh")
    root = root.resolve()
    for sub in ("", "etc", "munge", "state", "spool", "run", "log", "gpu"):
        (root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    socket_path = root / "munge" / "munge.socket"
    if len(str(socket_path)) > 100:
        raise SlurmError(f"cluster dir {root} is too long for a unix socket path ({socket_path}); use a shorter one")

    node = socket.gethostname().split(".")[0]  # what `hostname -s` says, and what slurmd registers as
    cpus = os.cpu_count() or 1
    for i in range(GPUS):
        _placeholder_gpu(root / "gpu" / f"gpu{i}")
    values = {
        "root": str(root), "cluster_name": f"spectrial{os.getpid()}", "node": node, "address": "127.0.0.1",
        "slurmctld_port": str(free_port()), "slurmd_port": str(free_port()), "munge_socket": str(socket_path),
        "cpus": str(cpus), "real_memory_mb": str(_real_memory_mb()), "gpus": str(GPUS), "partition": PARTITION,
        "tiny_partition": TINY_PARTITION, "gpu_files": f"{root}/gpu/gpu[0-{GPUS - 1}]",
    }
    conf = root / "etc" / "slurm.conf"
    for name in ("slurm.conf", "gres.conf"):
        (root / "etc" / name).write_text(Template((TEMPLATES / name).read_text()).substitute(values))
    (root / "etc" / "plugstack.conf").write_text("# no SPANK plugins on the test cluster\n")

    key = root / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(128))  # what `mungekey` makes: 1024 random bits
    key.chmod(0o400)

    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(root, conf, env, node, cpus)
    denv = cluster._daemon_env()
    log = root / "log"
    try:
        cluster.daemons["munged"] = Daemon.start("munged", [
            str(which("munged")), "--foreground", "--force", f"--key-file={key}", f"--socket={socket_path}",
            f"--pid-file={root / 'run' / 'munged.pid'}", f"--log-file={log / 'munged.log'}",
            f"--seed-file={root / 'munge' / 'munged.seed'}"], log / "munged.out", denv)
        cluster._save_state()
        _wait_munged(root, cluster.daemons["munged"], socket_path)
        cluster.daemons["slurmctld"] = Daemon.start(
            "slurmctld", [str(which("slurmctld")), "-D", "-i", "-f", str(conf)], log / "slurmctld.out", denv)
        cluster._save_state()
        cluster.daemons["slurmd"] = Daemon.start("slurmd", cluster._slurmd_argv(), log / "slurmd.out", denv)
        cluster._save_state()
        cluster.wait_node(["idle"], timeout, "cluster start")
    except BaseException:
        with contextlib.suppress(Exception):
            cluster.stop()
        raise
    return cluster


def running_cluster(root: Path) -> SlurmCluster | None:
    """The cluster recorded in `root` if all its daemons are still alive, else None."""
    if not (root / STATE_FILE).exists():
        return None
    cluster = SlurmCluster.load(root.resolve())
    names = ("munged", "slurmctld", "slurmd")
    return cluster if all(n in cluster.daemons and cluster.daemons[n].alive() for n in names) else None


# -- pytest ------------------------------------------------------------------------------------------------------
def _ensure_slurm() -> None:
    """Install Slurm and MUNGE through scripts/ensure-slurm.sh when missing; skip when they stay missing."""
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root (its daemons run as SlurmUser=root)")
    if not missing_binaries():
        return
    res = subprocess.run(["bash", str(ENSURE_SCRIPT)], capture_output=True, text=True, timeout=900)
    if missing_binaries():
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-5:])
        pytest.skip(f"Slurm/MUNGE binaries missing ({', '.join(missing_binaries())}) and "
                    f"scripts/ensure-slurm.sh could not install them:\n{tail}")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real one-node Slurm cluster (munged + slurmctld + slurmd) for the whole session."""
    _ensure_slurm()
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster; afterwards the test's leftover jobs are cancelled, a stopped slurmd is started
    again and the node is idle before the next test."""
    yield slurm_cluster
    slurm_cluster.cancel_all()
    if not slurm_cluster.daemons["slurmd"].alive():
        slurm_cluster.start_slurmd()
    try:
        slurm_cluster.wait_idle(30)
    except SlurmError:
        if slurm_cluster.job_ids():
            raise
        # nothing queued, yet the node still holds a finished job's CPUs (`mixed`): on this one-node cluster a
        # batch job killed by scancel's signal sometimes never has its epilog reported to slurmctld. slurmd's
        # re-registration reconciles it (the job is not on the node: its resources are released)
        slurm_cluster.stop_slurmd()
        slurm_cluster.start_slurmd()
        slurm_cluster.wait_idle(60)


# -- command line (scripts/slurm-local.sh) -------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    usage = "usage: slurm_plugin.py start|stop|env DIR"
    if len(argv) != 2 or argv[0] not in ("start", "stop", "env"):
        print(usage, file=sys.stderr)
        return 2
    action, root = argv[0], Path(argv[1]).resolve()
    env_line = f"export SLURM_CONF={root / 'etc' / 'slurm.conf'}"
    if action == "env":
        print(env_line)
        return 0
    if action == "stop":
        if not (root / STATE_FILE).exists():
            print(f"no cluster recorded in {root}", file=sys.stderr)
            return 0
        SlurmCluster.load(root).stop()
        print(f"stopped the Slurm cluster in {root}", file=sys.stderr)
        return 0
    cluster = running_cluster(root)
    if cluster is not None:
        print(f"a Slurm cluster is already running in {root} (node {cluster.node})", file=sys.stderr)
    else:
        if (root / STATE_FILE).exists():  # some daemon died: stop the rest before starting afresh
            SlurmCluster.load(root).stop()
        t0 = time.monotonic()
        try:
            cluster = start_cluster(root)
        except SlurmError as e:
            print(f"the Slurm cluster did not start: {e}", file=sys.stderr)
            return 1
        print(f"started a Slurm cluster in {root} in {time.monotonic() - t0:.1f} s: node {cluster.node}, "
              f"{cluster.cpus} CPUs, {cluster.gpus} GPUs, partitions {cluster.partition} (default) and "
              f"{cluster.tiny_partition} (MaxTime=1 min); logs in {root / 'log'}", file=sys.stderr)
    print(env_line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
