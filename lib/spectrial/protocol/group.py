"""Host groups: the nodes of a multi-node server (`hosts:` in params), head first, driven in parallel.

`HostGroup.from_params(params, head)` holds one `Node` (host, address, rank) per node. Without `hosts:` it is
a group of one, and every method reduces to what the single-host trial did. With more nodes:

- the per-node protocol steps run on every node at once (threads): kill the previous server, wait for free
  GPUs, fingerprint;
- `prepare(engine)` hands the other nodes to the engine's `prepare_workers` hook (llama.cpp uploads its
  `rpc-server`; SGLang needs nothing) and returns them as the engine prepared them (`Workers`), which the session
  passes to `engine.launch_spec(arm, workers)` (llama.cpp: `--rpc addr:port,...`; SGLang: rank 0's node flags);
- `attach(server, engine, arm, params, workers)` gives each head `Server` its companions on the other nodes,
  what the engine's `worker_specs` hook says each runs (llama.cpp: `rpc-server -H <addr> -p <rpc_port>`,
  listening before the head starts; SGLang: the head's argv per rank, started right after it).
  Companions are ordinary `Server`s with a state file on their node (the next trial's kill step there stops
  an orphan), and they are stopped on every node with the head.

The group knows nodes, not engines: what runs where is the engine adapter's (`spectrial.engines.base`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from spectrial.engines.base import Engine, Worker, Workers
from spectrial.errors import ConfigError
from spectrial.hosts.connect import get_host
from spectrial.hosts.fingerprint import host_fingerprint
from spectrial.hosts.gpu import GpuStatus, wait_gpus_free
from spectrial.hosts.local import Host
from spectrial.params import Arm, TrialParams
from spectrial.schema import HostFingerprint
from spectrial.servers.lifecycle import Companion, KillReport, Server, on_each, stop_previous

T = TypeVar("T")


@dataclass
class Node:
    """One node of the group: its host, the address the other nodes reach it at, and its rank (head: 0)."""

    host: Host
    addr: str
    rank: int

    @property
    def name(self) -> str:
        return self.host.name


class NodeEntry(BaseModel):
    """A node of the group as the record lists it (`Manifest.nodes`)."""

    node: str
    rank: int
    addr: str
    binary: str | None = None  # the program the engine runs there (llama.cpp: rpc-server; None: the engine's own)


def default_addr(host: Host) -> str:
    """The address other nodes use for `host`: its SSH host name (config alias resolved), 127.0.0.1 locally."""
    return "127.0.0.1" if host.is_local else str(getattr(host, "address", host.name))


def visible_gpus(node: Node, params: TrialParams) -> str | None:
    """The GPUs a node's server gets (CUDA_VISIBLE_DEVICES): the params' `env`, else, on this machine, this
    process's own (what Slurm set for the job)."""
    return params.env.get("CUDA_VISIBLE_DEVICES") or (os.environ.get("CUDA_VISIBLE_DEVICES")
                                                      if node.host.is_local else None)


class HostGroup:
    """The nodes of a trial, head first; the per-node steps run on all of them in parallel."""

    def __init__(self, nodes: list[Node]) -> None:
        if not nodes:
            raise ConfigError("hosts: a group needs at least the head node")
        self.nodes = nodes

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
    def stop_previous(self, engine: Engine, params: TrialParams) -> list[KillReport]:
        """The kill step on the other nodes: stop what spectrial left on the worker port (from the state file)."""
        port = engine.worker_port()
        reports = self.map(lambda n: stop_previous(n.host, port, n.host.expand(params.state_dir),
                                                   params.stop_grace_s), self.workers)
        return [r.model_copy(update={"node": n.name}) for n, r in zip(self.workers, reports, strict=True)]

    def wait_gpus_free(self, params: TrialParams) -> tuple[GpuStatus, list[dict[str, Any]]]:
        """GPU-free check on every node at once: the head's status, and one entry per other node."""
        st = self.map(lambda n: wait_gpus_free(n.host, max_used_mib=params.gpu_free_mib,
                                               visible=visible_gpus(n, params),
                                               timeout_s=params.gpu_wait_s, require_gpu=params.require_gpu))
        return st[0], [{"node": n.name, "rank": n.rank, **s.as_dict()} for n, s in zip(self.workers, st[1:],
                                                                                        strict=True)]

    def fingerprints(self) -> tuple[HostFingerprint, list[dict[str, Any]]]:
        """Fingerprints of every node at once: the head's, and one entry per other node."""
        fps = self.map(lambda n: host_fingerprint(n.host))
        return fps[0], [{"node": n.name, "rank": n.rank, "addr": n.addr, "fingerprint": fp}
                        for n, fp in zip(self.workers, fps[1:], strict=True)]

    # --- engines --------------------------------------------------------------------------------------------
    def prepare(self, engine: Engine) -> Workers | None:
        """The other nodes as the engine prepared them (its `prepare_workers` hook); None in a group of one."""
        if not self.workers:
            return None
        return engine.prepare_workers(self.head.addr, [Worker(n.host, n.addr, n.rank) for n in self.workers])

    def node_entries(self, workers: Workers | None) -> list[NodeEntry]:
        """One entry per node for the record: node, rank, address, and the program the engine runs there."""
        return [NodeEntry(node=self.head.name, rank=0, addr=self.head.addr),
                *(NodeEntry(node=w.name, rank=w.rank, addr=w.addr, binary=w.binary)
                  for w in (workers.nodes if workers else []))]

    def attach(self, server: Server, engine: Engine, arm: Arm, params: TrialParams, workers: Workers | None) -> None:
        """Give the head `server` its companions on the other nodes, as the engine's `worker_specs` says (none in
        a group of one)."""
        if workers is None:
            return
        server.companions = [
            Companion(Server(w.worker.host, w.spec, work_dir=f"{w.worker.host.expand(params.work_dir)}/{server.run_id}",
                             state_dir=w.worker.host.expand(params.state_dir), tag=f"{server.tag}:node{w.worker.rank}",
                             grace_s=server.grace_s, run_id=server.run_id, arm=server.arm),
                      node=w.worker.name, before_head=w.before_head)
            for w in engine.worker_specs(server.spec, arm, workers)]

    def take_events(self) -> list[dict[str, str]]:
        """Transport events of the other nodes since the last call (the head's are taken by the trial)."""
        return [{"node": n.name, **e} for n in self.workers for e in n.host.take_events()]

    def close(self) -> None:
        """Close the connections to the other nodes (the trial closes the head)."""
        for n in self.workers:
            n.host.close()
