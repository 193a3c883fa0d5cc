"""`get_host(spec)`: the Host a params file names (local, or SSH through fabric)."""

from __future__ import annotations

from spectrial.errors import ConfigError
from spectrial.hosts.local import Host, LocalHost


def get_host(spec: str, **ssh_options: object) -> Host:
    """A Host from a spec: `local`, `ssh://[user@]host[:port]` or `ssh:ALIAS` (from ~/.ssh/config)."""
    if spec in ("local", "localhost-local", ""):
        return LocalHost()
    if spec.startswith("ssh:"):
        from spectrial.hosts.ssh import SSHHost  # fabric/paramiko only when a remote host is asked for

        return SSHHost.from_spec(spec, **ssh_options)
    if spec.startswith("srun:"):
        from spectrial.hosts.srun import SrunHost  # a node of the Slurm job this runs in

        return SrunHost(spec.removeprefix("srun:"))
    raise ConfigError(f"host: {spec!r} is not a host spec; use 'local', 'ssh://user@host:port', 'ssh:ALIAS' or "
                      "'srun:NODE' (a node of this Slurm job)",
                      parameter="host")
