"""One node of a multi-node job, and the network interfaces the job names, checked before any rank.

``./run_train.sh`` reads torchrun's usual variables once (:func:`nodes_from_env`):

* ``NNODES`` (default 1: one node, ``torchrun --standalone``, as without these variables);
* static rendezvous: ``NODE_RANK`` (0..NNODES-1), ``MASTER_ADDR`` (node 0's address) and
  ``MASTER_PORT`` (default 29500, torchrun's), the form of a Slurm job or of ``netlab run``;
* or c10d rendezvous: ``RDZV_ENDPOINT`` (HOST[:PORT]), ``RDZV_ID`` (the same on every node),
  ``RDZV_BACKEND`` (c10d, the default with an endpoint, or static).

``NGPU`` is then the ranks of this node, and the config's world size must be NNODES x NGPU. A bad
value is one :class:`ConfigError` line naming the variable and what is allowed.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from titan_morph.config import ConfigError, MorphSettings, Settings

__all__ = [
    "DEFAULT_MASTER_PORT",
    "NET_DIR",
    "Nodes",
    "check_interfaces",
    "load_for_nodes",
    "network_interfaces",
    "nodes_from_env",
]

DEFAULT_MASTER_PORT = 29500
"""torchrun's ``--master-port`` default."""
NET_DIR = "/sys/class/net"
BACKENDS = ("static", "c10d")
_PLAIN = re.compile(r"[^A-Za-z0-9._-]+")
_Loaded = TypeVar("_Loaded", bound=tuple[object, Settings])


@dataclass(frozen=True)
class Nodes:
    """The nodes of the job as this node sees them; ``count == 1`` is one node (standalone)."""

    count: int = 1
    rank: int | None = None
    """``NODE_RANK``; None with c10d rendezvous, which assigns it."""
    backend: str = ""
    master_addr: str = ""
    master_port: int = DEFAULT_MASTER_PORT
    endpoint: str = ""
    rdzv_id: str = ""

    @property
    def multi(self) -> bool:
        return self.count > 1

    def rendezvous_args(self) -> list[str]:
        """torchrun's options that make this process one node of the job."""
        if not self.multi:
            return ["--standalone"]
        args = ["--nnodes", str(self.count)]
        if self.backend == "static":
            args += ["--node-rank", str(self.rank), "--rdzv-backend", "static"]
            if not self.endpoint:
                return [*args, "--master-addr", self.master_addr, "--master-port", str(self.master_port)]
        else:
            args += ["--rdzv-backend", self.backend]
        args += ["--rdzv-endpoint", self.endpoint]
        return [*args, "--rdzv-id", self.rdzv_id] if self.rdzv_id else args

    def describe(self) -> str:
        """How this node joins, for the launch banner."""
        where = self.endpoint or f"{self.master_addr}:{self.master_port}"
        rank = f"node {self.rank} of {self.count}" if self.rank is not None else f"one of {self.count} nodes"
        return f"{rank}, {self.backend} rendezvous at {where}"

    def run_id(self, env: Mapping[str, str]) -> str:
        """The run id every node derives alike (the ranks' ``{run_id}`` folder must be one): the
        rendezvous id, else Slurm's job id, else the rendezvous address, after today's date."""
        if not self.multi:
            return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        job = self.rdzv_id or env.get("SLURM_JOB_ID", "") or self.endpoint or f"{self.master_addr}-{self.master_port}"
        return time.strftime("%Y%m%d") + "-" + _PLAIN.sub("_", job).strip("_")

    def ranks_per_node(self, world: int) -> int:
        """This node's ranks when ``NGPU`` is not set: the world split evenly over the nodes."""
        if world % self.count:
            raise ConfigError(
                f"NNODES: {self.count} nodes cannot share the config's {world} ranks equally: set NNODES to a"
                f" divisor of {world}, or NGPU (ranks per node) and the parallel degrees to match"
            )
        return world // self.count

    def shown_ranks(self, spec: str, per_node: int) -> str:
        """torchrun's ``--local-ranks-filter`` on this node for the global ranks of ``spec``: those
        placed here (static: ``NODE_RANK x NGPU`` onwards); a local rank that does not exist when
        none is here (this node shows no rank's output). c10d places nodes at the rendezvous, so
        every node shows the same local ranks (``rank mod NGPU``)."""
        if not self.multi:
            return spec
        wanted = [int(r) for r in spec.split(",")]
        if self.rank is None:
            local = sorted({r % per_node for r in wanted})
        else:
            first = self.rank * per_node
            local = sorted(r - first for r in wanted if first <= r < first + per_node)
        return ",".join(str(r) for r in local) or str(per_node)

    def shown_text(self, shown: str, per_node: int) -> str:
        """``shown`` (a :meth:`shown_ranks` filter) for the launch banner."""
        if not self.multi:
            return f"showing rank(s) {shown}"
        return "showing no rank here" if shown == str(per_node) else f"showing local rank(s) {shown}"

    def mismatch(self, nproc: int, need: Settings) -> ConfigError:
        """The error when ``NNODES x NGPU`` is not the config's world size (``need``: the config
        resolved without NGPU)."""
        job = need.job
        world, total = need.world_size, self.count * nproc
        product = " x ".join(f"{k} {v}" for k, v in job.degrees.items() if v != 1) or "all degrees 1"
        head = f"NGPU: {nproc} ranks per node x NNODES {self.count} = {total} ranks"
        if job.data_parallel_shard_degree == -1:
            return ConfigError(
                f"{head}, but the config needs a multiple of {world} ({product}; data_parallel_shard_degree = -1"
                " takes the rest)"
            )
        fix = f"set NGPU = {world // self.count}" if world % self.count == 0 else "change NNODES or the degrees"
        return ConfigError(f"{head}, but the parallel degrees need {world} ({product}): {fix}")

    def check_job(self, settings: Settings) -> None:
        """What one node of several cannot do yet: relaunch the job, with a new rank order or a new
        split (the supervisor of each node restarts only its own torchrun, so the other nodes would
        wait at the rendezvous)."""
        if not self.multi:
            return
        morph = settings.morph
        if morph.orchestrator != "off":
            raise ConfigError(
                f"morph.orchestrator: {morph.orchestrator!r} moves ranks by relaunching the job, which"
                f" ./run_train.sh does on one node only: use off with NNODES = {self.count}"
            )
        if morph.partition == "auto":
            raise ConfigError(
                f"morph.partition: 'auto' moves layers by relaunching the job, which ./run_train.sh does on one"
                f" node only: use even or manual with NNODES = {self.count}"
            )


def _integer(env: Mapping[str, str], name: str, low: int, high: int | None, what: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if raw.isdigit() and int(raw) >= low and (high is None or int(raw) <= high):
        return int(raw)
    allowed = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
    raise ConfigError(f"{name}: {raw!r} is not {what} ({allowed})")


def _check_endpoint(endpoint: str) -> None:
    host, colon, port = endpoint.rpartition(":")
    if colon and "]" not in port:
        if not host or not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ConfigError(f"RDZV_ENDPOINT: {endpoint!r} is not HOST or HOST:PORT (a port in 1..65535)")


def nodes_from_env(env: Mapping[str, str]) -> Nodes:
    """The job's nodes from torchrun's variables (see the module docstring); checks every value."""
    count = _integer(env, "NNODES", 1, None, "a number of nodes") or 1
    if count == 1:  # the other variables are torchrun's business only with several nodes
        return Nodes()
    rank = _integer(env, "NODE_RANK", 0, count - 1, f"a node rank of NNODES = {count}")
    port = _integer(env, "MASTER_PORT", 1, 65535, "a port") or DEFAULT_MASTER_PORT
    endpoint = env.get("RDZV_ENDPOINT", "").strip()
    backend = env.get("RDZV_BACKEND", "").strip() or ("c10d" if endpoint else "static")
    if backend not in BACKENDS:
        raise ConfigError(f"RDZV_BACKEND: {backend!r} is not one of {', '.join(BACKENDS)}")
    if endpoint:
        _check_endpoint(endpoint)
    elif backend == "c10d":
        raise ConfigError("RDZV_ENDPOINT: not set; RDZV_BACKEND = c10d needs HOST[:PORT] of the rendezvous")
    master = env.get("MASTER_ADDR", "").strip()
    if backend == "static":
        if rank is None:
            raise ConfigError(f"NODE_RANK: not set; with NNODES = {count} each node needs its rank, 0..{count - 1}")
        if not master and not endpoint:
            raise ConfigError(
                f"MASTER_ADDR: not set; with NNODES = {count} it names node 0's host (or set RDZV_ENDPOINT)"
            )
    return Nodes(count, rank if backend == "static" else None, backend, master, port, endpoint,
                 env.get("RDZV_ID", "").strip())  # fmt: skip


def load_for_nodes(load: Callable[[int | None], _Loaded], nodes: Nodes, nproc: int | None) -> _Loaded:
    """``load(ranks)`` (a release's config load with the launcher's ``NGPU``) for a job of
    ``nodes``: NNODES x NGPU ranks, one error naming both when the config needs another number."""
    if not nodes.multi:
        return load(nproc)
    try:
        loaded = load(None if nproc is None else nodes.count * nproc)
    except ConfigError as err:
        if nproc is None or not str(err).startswith("NGPU:"):
            raise
        raise nodes.mismatch(nproc, load(None)[1]) from None
    if nproc is None:
        nodes.ranks_per_node(loaded[1].world_size)
    return loaded


def network_interfaces() -> list[str] | None:
    """This node's network interfaces (None where the system does not list them)."""
    try:
        return sorted(os.listdir(NET_DIR))
    except OSError:
        return None


def check_interfaces(morph: MorphSettings, present: Sequence[str] | None = None) -> None:
    """``[morph] data_ifname`` and every ``host_ifnames`` entry name interfaces of this node
    (``present``; default :func:`network_interfaces`)."""
    names = network_interfaces() if present is None else list(present)
    if names is None:
        return
    wanted = [("morph.data_ifname", name) for name in (morph.data_ifname,) if name]
    wanted += [("morph.host_ifnames", name) for name in morph.host_interfaces]
    for key, name in wanted:
        if name not in names:
            raise ConfigError(
                f"{key}: {name!r} is not a network interface of this node ({socket.gethostname()}); it has"
                f" {', '.join(names) or 'none'}"
            )
