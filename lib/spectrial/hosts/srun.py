"""A node of the Slurm job spectrial runs in, reached with `srun --overlap` (`host: srun:NODE` in `hosts:`).

Inside an allocation the scheduler is the way to the other nodes, not SSH: every command is a one-task job step on
that node (`srun --jobid $SLURM_JOB_ID --overlap --nodes 1 --ntasks 1 --nodelist NODE`), so Slurm accounts and
tracks it and ends it with the job. A detached process (an engine's worker rank, llama.cpp's rpc-server) lives in
its own step for as long as it runs: the step's shell starts it in a new session, writes its pid and waits for it,
so the process stays in the step (Slurm's process tracking follows it; a cgroup-tracked cluster would kill a
process that left its step) and the step ends when it does. spectrial stops it as on any host, by its process
group (`kill -- -PGID` in a step); the job's end stops whatever is left.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from spectrial.errors import ConfigError, HostError
from spectrial.hosts.local import CommandResult, RemoteShellHost, env_prefix
from spectrial.secrets import mask_launch


class SrunHost(RemoteShellHost):
    """`srun:NODE`: a node of the current Slurm job (SLURM_JOB_ID), one job step per command."""

    def __init__(self, node: str, job_id: str | None = None, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        job = job_id or self.env.get("SLURM_JOB_ID")
        if not node:
            raise ConfigError("host: 'srun:' needs a node name (srun:NODE, a node of this Slurm job)",
                              parameter="hosts")
        if not job:
            raise ConfigError(f"hosts: srun:{node} reaches a node of the Slurm job spectrial runs in, and "
                              "SLURM_JOB_ID is not set: run the trial inside an allocation (sbatch, salloc, or "
                              "cluster.executor: slurm), or reach the node with ssh://", parameter="hosts")
        if shutil.which("srun", path=self.env.get("PATH")) is None:
            raise ConfigError(f"hosts: srun:{node} needs Slurm's srun on PATH", parameter="hosts")
        self.node, self.job_id = node, job
        self.name = f"srun:{node}"
        self.address = node
        self.steps: list[subprocess.Popen[bytes]] = []

    def srun(self, *extra: str) -> list[str]:
        return ["srun", f"--jobid={self.job_id}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={self.node}",
                "--quiet", "--kill-on-bad-exit=0", *extra]

    def _exec(self, line: str, timeout: float | None) -> CommandResult:
        t0 = time.monotonic()
        try:
            r = subprocess.run([*self.srun(), "bash", "-c", line], env=self.env, capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise HostError(self.name, line, None, str(exc.stdout or ""), str(exc.stderr or ""),
                            f"timed out after {timeout} s") from exc
        return CommandResult(line, r.returncode, r.stdout, r.stderr, time.monotonic() - t0)

    def put(self, local: str | Path, remote: str, mode: int = 0o600) -> None:
        with open(local, "rb") as fh:
            r = subprocess.run([*self.srun(), "bash", "-c",
                                f"umask 077; cat > {shlex.quote(remote)} && chmod {mode:o} {shlex.quote(remote)}"],
                               env=self.env, stdin=fh, capture_output=True, timeout=600)
        if r.returncode != 0:
            raise HostError(self.name, f"put {local} -> {remote}", r.returncode, "", r.stderr.decode(errors="replace"))

    def get(self, remote: str, local: str | Path) -> None:
        r = subprocess.run([*self.srun(), "cat", remote], env=self.env, capture_output=True, timeout=600,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise HostError(self.name, f"get {remote}", r.returncode, "", r.stderr.decode(errors="replace"))
        Path(local).write_bytes(r.stdout)

    def start_detached(self, argv: Sequence[str], *, env: Mapping[str, str] | None, log_path: str,
                       cwd: str | None = None) -> int:
        """argv in its own session, in a job step of its own that waits for it (see the module); its pid (= its
        process group id)."""
        pidfile = f"/tmp/spectrial-srun-{secrets.token_hex(6)}.pid"
        masked = mask_launch(argv, env)
        shown = shlex.join(env_prefix(masked.env) + [str(a) for a in masked.argv])  # errors never show secrets
        inner = shlex.join(["setsid", *env_prefix(env), *[str(a) for a in argv]])
        # the pid file appears whole (written aside, then renamed): a reader between `>`'s truncation and the
        # echo would read nothing, remove the file and leave the echo writing into the removed one (CI saw it)
        line = (f"umask 077; {inner} > {shlex.quote(log_path)} 2>&1 < /dev/null & "
                f"echo $! > {shlex.quote(pidfile + '.new')} && mv -f {shlex.quote(pidfile + '.new')} "
                f"{shlex.quote(pidfile)}; wait")
        if cwd:
            line = f"cd {shlex.quote(cwd)} && {line}"
        with tempfile.TemporaryFile() as said:  # srun's own words, read only if the step fails at once
            step = subprocess.Popen([*self.srun(), "bash", "-c", line], env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=said, start_new_session=True)
            self.steps.append(step)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                q = shlex.quote(pidfile)
                res = self._exec(f'p=$(cat {q} 2>/dev/null) && case "$p" in ""|*[!0-9]*) exit 1;; esac '
                                 f'&& rm -f {q} && echo "$p"', 60)
                if res.ok and res.stdout.strip().isdigit():
                    return int(res.stdout.strip())
                if step.poll() is not None:
                    said.seek(0)
                    raise HostError(self.name, shown, step.returncode, "", said.read().decode(errors="replace"),
                                    "the job step of the detached process ended at once")
                time.sleep(0.2)
        raise HostError(self.name, shown, None, "", "", "the detached process's step did not report its pid within 60 s")

    def close(self) -> None:
        """Nothing to close: the steps end with their processes (stopped by the session) or with the job."""
