"""Host groups: the nodes of a multi-node server (`hosts:` in params), head first, driven in parallel.

`HostGroup.from_params(params, head)` holds one `Node` (host, address, rank) per node. Without `hosts:` it is
a group of one, and every method reduces to what the single-host trial did. With more nodes:

- the per-node protocol steps run on every node at once (threads): kill the previous server, wait for free
  GPUs, fingerprint;
- `prepare(engine)` provisions the other nodes (llama.cpp: spectrial's `rpc-server` uploaded when
  `engine_bin: auto`) and tells the engine its workers (llama.cpp: `--rpc addr:port,...` on the head);
- `attach(server, engine, arm, params)` gives each head `Server` its companions on the other nodes:
    llama.cpp  `rpc-server -H <addr> -p <rpc_port>` per node, started and listening before the head;
    SGLang     the head's argv per rank with `--nnodes N --node-rank r --dist-init-addr <head addr>:<port>`,
               rank 0 (the head) first, then the others.
  Companions are ordinary `Server`s with a state file on their node (the next trial's kill step there stops
  an orphan), and they are stopped on every node with the head.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from spectrial.connect import get_host
from spectrial.engines.base import Engine
from spectrial.errors import ConfigError
from spectrial.fingerprint import host_fingerprint
from spectrial.gpu import GpuStatus, wait_gpus_free
from spectrial.host import Host
from spectrial.params import Arm, TrialParams
from spectrial.server import Companion, LaunchSpec, Probe, Server, on_each, stop_previous

T = TypeVar("T")
SGLANG_DIST_INIT_PORT = 50000
_RANK_FLAGS = {"--nnodes": 1, "--node-rank": 1, "--dist-init-addr": 1}


@dataclass
class Node:
    """One node of the group: its host, the address the other nodes reach it at, and its rank (head: 0)."""

    host: Host
    addr: str
    rank: int

    @property
    def name(self) -> str:
        return self.host.name


def default_addr(host: Host) -> str:
    """The address other nodes use for `host`: its SSH host name (config alias resolved), 127.0.0.1 locally."""
    return "127.0.0.1" if host.is_local else str(getattr(host, "address", host.name))


def sglang_rank_argv(argv: list[str], rank: int, nnodes: int, dist_init_addr: str) -> list[str]:
    """The SGLang launch argv of node `rank` out of `nnodes`, derived from the rank-0 argv.

    Any `--nnodes`, `--node-rank` and `--dist-init-addr` already in `argv` (spaced or `=` form) are
    replaced, so the result is the same whichever argv it starts from.
    """
    if not 0 <= rank < nnodes:
        raise ConfigError(f"hosts: rank {rank} is outside 0..{nnodes - 1}")
    out: list[str] = []
    skip = 0
    for item in argv:
        if skip:
            skip -= 1
            continue
        flag = item.split("=", 1)[0]
        if flag in _RANK_FLAGS:
            skip = 0 if "=" in item else _RANK_FLAGS[flag]
            continue
        out.append(item)
    return [*out, "--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", dist_init_addr]


def _always_ready(client: Any, base_url: str) -> Probe:
    """Ranks > 0 of SGLang serve nothing of their own: the head's readiness covers them."""
    return Probe(True, "rank started")


class HostGroup:
    """The nodes of a trial, head first; the per-node steps run on all of them in parallel."""

    def __init__(self, nodes: list[Node]) -> None:
        if not nodes:
            raise ConfigError("hosts: a group needs at least the head node")
        self.nodes = nodes
        self._worker_binary: dict[int, str] = {}
        self._stdbuf: dict[int, bool] = {}

    @classmethod
    def from_params(cls, params: TrialParams, head: Host) -> HostGroup:
        """The head (already connected by the trial) plus one host per further entry of `params.hosts`."""
        if not params.hosts:
            return cls([Node(head, default_addr(head), 0)])
        nodes = [Node(head, params.hosts[0].addr or default_addr(head), 0)]
        try:
            for rank, spec in enumerate(params.hosts[1:], 1):
                host = get_host(spec.host, **params.ssh.connect_options())
                nodes.append(Node(host, spec.addr or default_addr(host), rank))
        except BaseException:
            for n in nodes[1:]:
                n.host.close()
            raise
        return cls(nodes)

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    def map(self, fn: Callable[[Node], T], nodes: list[Node] | None = None) -> list[T]:
        """`fn(node)` on every node (or `nodes`) in parallel; all run to their end, then the first error raises."""
        todo = self.nodes if nodes is None else nodes
        return on_each([(n.name, lambda n=n: fn(n)) for n in todo])

    # --- protocol steps on every node --------------------------------------------------------------------
    def worker_port(self, engine: Engine, params: TrialParams) -> int:
        """The port spectrial's process uses on the other nodes (llama.cpp: rpc_port; SGLang: the server port)."""
        return int(getattr(engine.config, "rpc_port", params.port)) if engine.name == "llamacpp" else params.port

    def stop_previous(self, engine: Engine, params: TrialParams) -> list[dict[str, Any]]:
        """The kill step on the other nodes: stop what spectrial left on the worker port (from the state file)."""
        port = self.worker_port(engine, params)
        reports = self.map(lambda n: stop_previous(n.host, port, n.host.expand(params.state_dir),
                                                   params.stop_grace_s), self.workers)
        return [{"node": n.name, **r} for n, r in zip(self.workers, reports, strict=True)]

    def wait_gpus_free(self, params: TrialParams) -> tuple[GpuStatus, list[dict[str, Any]]]:
        """GPU-free check on every node at once: the head's status, and one entry per other node."""
        st = self.map(lambda n: wait_gpus_free(n.host, max_used_mib=params.gpu_free_mib,
                                               timeout_s=params.gpu_wait_s, require_gpu=params.require_gpu))
        return st[0], [{"node": n.name, "rank": n.rank, **s.as_dict()} for n, s in zip(self.workers, st[1:],
                                                                                        strict=True)]

    def fingerprints(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Fingerprints of every node at once: the head's, and one entry per other node."""
        fps = self.map(lambda n: host_fingerprint(n.host))
        return fps[0], [{"node": n.name, "rank": n.rank, "addr": n.addr, "fingerprint": fp}
                        for n, fp in zip(self.workers, fps[1:], strict=True)]

    # --- engines --------------------------------------------------------------------------------------------
    def prepare(self, engine: Engine) -> list[dict[str, Any]]:
        """Provision the other nodes and tell the engine about them; returns one entry per node for the record."""
        if not self.workers:
            return []
        if engine.name == "llamacpp":
            self._prepare_llamacpp(engine)
        elif engine.name != "sglang":
            raise ConfigError(f"hosts: multi-node runs support llamacpp (rpc-server) and sglang, not {engine.name!r}")
        return [{"node": n.name, "rank": n.rank, "addr": n.addr,
                 "binary": self._worker_binary.get(n.rank)} for n in self.nodes]

    def _prepare_llamacpp(self, engine: Any) -> None:
        params: TrialParams = engine.params
        if params.engine_bin == "auto":
            paths = self.map(lambda n: engine.engine_binary(n.host, "rpc-server"), self.workers)
        else:  # rpc-server next to the given llama-server, on each node
            paths = [f"{engine.binary.rsplit('/', 1)[0]}/rpc-server" for _ in self.workers]
            for n, path in zip(self.workers, paths, strict=True):
                if not n.host.run(["test", "-x", path], check=False).ok:
                    raise ConfigError(f"engine_bin: no executable rpc-server at {path} on {n.name}; spectrial "
                                      "looks for it next to engine_bin (or use engine_bin: auto)")
        self._worker_binary = {n.rank: p for n, p in zip(self.workers, paths, strict=True)}
        self._stdbuf = dict(zip((n.rank for n in self.workers),
                                self.map(lambda n: n.host.which("stdbuf") is not None, self.workers), strict=True))
        self._worker_binary[0] = engine.binary
        engine.rpc_workers = [f"{n.addr}:{engine.config.rpc_port}" for n in self.workers]

    def attach(self, server: Server, engine: Engine, arm: Arm, params: TrialParams) -> None:
        """Give the head `server` its companions on the other nodes (none in a group of one)."""
        if not self.workers:
            return
        if engine.name == "llamacpp":
            specs = [(n, self._rpc_spec(engine, arm, n, server), True) for n in self.workers]
        else:
            dist = next((a.split("=", 1)[1] if "=" in a else server.spec.argv[i + 1]
                         for i, a in enumerate(server.spec.argv) if a.split("=", 1)[0] == "--dist-init-addr"),
                        f"{self.head.addr}:{SGLANG_DIST_INIT_PORT}")
            n_nodes = len(self.nodes)
            server.spec.argv = sglang_rank_argv(server.spec.argv, 0, n_nodes, dist)
            specs = [(n, LaunchSpec(argv=sglang_rank_argv(server.spec.argv, n.rank, n_nodes, dist),
                                    env=dict(server.spec.env), port=server.spec.port, probe=_always_ready,
                                    name=f"{server.spec.name}-rank{n.rank}", bind=server.spec.bind, http=False,
                                    python=server.spec.python),
                      False) for n in self.workers]
        server.companions = [
            Companion(Server(n.host, spec, work_dir=f"{n.host.expand(params.work_dir)}/{server.run_id}",
                             state_dir=n.host.expand(params.state_dir), tag=f"{server.tag}:node{n.rank}",
                             grace_s=server.grace_s, run_id=server.run_id, arm=server.arm),
                      node=n.name, before_head=before) for n, spec, before in specs]

    def _rpc_spec(self, engine: Any, arm: Arm, node: Node, head: Server) -> LaunchSpec:
        spec: LaunchSpec = engine.rpc_worker_spec(arm, node.host, node.addr, self._worker_binary[node.rank],
                                                  line_buffered=self._stdbuf.get(node.rank, False))
        start = head.spec.name.removeprefix("llama-server-")  # arm name plus the restart suffix: one log per start
        spec.name = f"rpc-server-{start}-node{node.rank}"
        return spec

    def take_events(self) -> list[dict[str, str]]:
        """Transport events of the other nodes since the last call (the head's are taken by the trial)."""
        return [{"node": n.name, **e} for n in self.workers for e in n.host.take_events()]

    def close(self) -> None:
        """Close the connections to the other nodes (the trial closes the head)."""
        for n in self.workers:
            n.host.close()
