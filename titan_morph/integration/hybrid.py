"""DP x PP in TorchTitan: the DP groups on the emulating backend, the world-wide exchange, and the
orchestrator's moves applied through a checkpoint and a relaunch with a new rank order.

Hosts. One rank runs per host. ``./run_train.sh``'s launcher (:func:`titan_morph.integration.supervisor.supervise`)
starts the ranks in the identity order and, after a move, restarts them with the host of every rank
in ``$TITAN_MORPH_HOSTS``; a process keeps its host for its lifetime, as a real one would. Here all
ranks share one machine, so the host of a rank matters only to the emulated links: ``[morph.inject]
rank_links`` are host pairs (:func:`~titan_morph.config.links.pair_delays`), applied to the
pipeline sends between the two hosts (the link emulator, per pipeline) and to the DP collectives
whose ring uses the pair (:mod:`titan_morph.comm.emulator.collectives`).

Mesh. On a CPU job (gloo) :class:`HybridParallelDims` is TorchTitan's ParallelDims with the
data-parallel mesh dimensions (:data:`DP_MESH_DIMS` and the flattened ``loss`` mesh) created on the
DP backend, so FSDP's all-gathers and reduce-scatters, the gradient-norm and loss all-reduces all
run through it: delayed per host pair and timed, the orchestrator's measurements. That is the data
path, and it needs gloo: on GPUs the DP groups stay NCCL, untimed, so the orchestrator and
``rank_links`` are refused there in one line (:func:`~titan_morph.config.rules.check_dp_backend`).
Both TorchTitan releases build their meshes through torch's ``_unflatten``/``_flatten`` with the
same ``loss_mesh``; they differ in the names (0.2.2 shards over ``fsdp``, 0.3.0 over ``dp_shard``
beside the folded ``dp``) and in the fields of ParallelDims, which is why the names are a union and
the fields are copied as the dataclass lists them.

Control plane. The world-wide exchange and the microbatch rebalance act on every backend: they
talk on gloo groups made beside the job's own (:func:`~titan_morph.comm.groups.cpu_group`; on a CPU
job its own gloo groups unless ``[morph] control_groups = "separate"``), and the replicas are the
ranks of the stage's ``batch`` mesh (FSDP, and HSDP's replicas of shards).

Moves. Every rank's :class:`~titan_morph.runtime.hybrid.HybridExchange` reaches the same
:class:`~titan_morph.monitor.topology.Move` after the same step. The trainer then finishes that
step, saves a full checkpoint (TorchTitan's DCP: model, optimizer, LR schedule, dataloader position,
step), logs the old and new layout, asks the launcher for a relaunch with the new host of every rank
and stops. The relaunched ranks load the checkpoint: rank ``r`` keeps its stage and DP rank (so its
shard of the state and its data order), only its host changed. Losses therefore continue exactly as
without the move. The pairs measured slow travel with the relaunch: a pipeline whose link now
carries one starts planned for its delay, the link delegated (Fig. 13 step 5; the schedule builder
calls :func:`known_link_delays`).

Replicas. A slow device moves with its host, so no move helps it: with ``[morph]
rebalance_microbatches`` (:func:`replica_split`) the replicas' microbatches follow their measured
speeds instead (:mod:`titan_morph.monitor.rebalance`), the global batch unchanged
(:mod:`titan_morph.runtime.replicas`). Both act in one job: a move relaunches, and the relaunched
ranks start from the even split (or ``replica_microbatches``) and measure again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torchtitan.distributed import ParallelDims

from titan_morph.comm.emulator import collectives
from titan_morph.comm.groups import cpu_group, cpu_group_over
from titan_morph.config import Settings
from titan_morph.config.links import pair_delays
from titan_morph.config.rules import check_dp_backend
from titan_morph.integration.relaunch import (
    can_relaunch,
    hosts_from_env,
    known_slow_pairs,
    moves_before,
    request_relaunch,
)
from titan_morph.monitor.rebalance import Rebalancer
from titan_morph.monitor.topology import Layout, Move, PipelineCost, TopologyMonitor
from titan_morph.runtime.hybrid import HybridExchange
from titan_morph.runtime.replicas import ReplicaSplit

__all__ = [
    "DP_MESH_DIMS",
    "HybridParallelDims",
    "before_step",
    "finish_for_move",
    "known_link_delays",
    "lanes_group",
    "layout_of",
    "make_exchange",
    "parallel_dims_for",
    "pipeline_hosts",
    "replica_mesh",
    "replica_split",
    "save_now",
    "shard_mesh",
]

logger = logging.getLogger(__name__)

DP_MESH_DIMS = ("batch", "fsdp", "dp_shard", "dp", "dp_replicate", "efsdp")
"""Mesh dimensions of data parallelism in either release (a release builds only some of them)."""
SHARD_MESHES = ("fsdp", "dp_shard")
"""FSDP's shard dimension: 0.2.2's name, then 0.3.0's (the first one the ParallelDims has is used)."""
LOSS_MESH = "loss_mesh"


def layout_of(settings: Settings) -> Layout:
    """The rank layout this launch runs: stages x replicas, hosts from the launcher (identity)."""
    stages, replicas = settings.stages, settings.dp_degree
    hosts = hosts_from_env(stages * replicas)
    return Layout(stages, replicas, hosts) if hosts is not None else Layout.identity(stages, replicas)


def pipeline_hosts(group: dist.ProcessGroup) -> list[int]:
    """The host of each stage of the pipeline ``group`` (its ranks, first stage first)."""
    return collectives.hosts(dist.get_process_group_ranks(group))


def known_link_delays(group: dist.ProcessGroup) -> tuple[float, ...]:
    """Per link of the pipeline ``group``: the planned delay of a host pair the orchestrator found
    slow before this launch (0 = none known), for the pipeline scheduler (§6, Fig. 13 step 5)."""
    known = known_slow_pairs()
    hosts = pipeline_hosts(group)
    return tuple(known.get((min(a, b), max(a, b)), 0.0) for a, b in zip(hosts, hosts[1:]))


@contextlib.contextmanager
def _dp_dims_on(backend: str) -> Iterator[None]:
    """While TorchTitan builds its meshes, create the DP dimensions (and the loss mesh) on
    ``backend``: its ``build_mesh`` passes only ``fake`` overrides (for size-1 dimensions)."""
    unflatten, flatten = DeviceMesh._unflatten, DeviceMesh._flatten

    def _unflatten(mesh: DeviceMesh, dim: Any, sizes: Any, names: Any, backend_override: Any = None) -> DeviceMesh:
        override = dict(backend_override or {})
        for name, size in zip(names, sizes):
            if name in DP_MESH_DIMS and size > 1 and name not in override:
                override[name] = backend
        return unflatten(mesh, dim, sizes, names, backend_override=override)

    def _flatten(mesh: DeviceMesh, mesh_dim_name: str | None = None, backend_override: Any = None) -> DeviceMesh:
        if mesh_dim_name == LOSS_MESH and backend_override is None:
            backend_override = backend
        return flatten(mesh, mesh_dim_name, backend_override=backend_override)

    # TorchTitan's build_mesh offers no backend choice per dimension: torch's mesh methods are swapped
    # for the duration of that one call, and restored whatever happens.
    DeviceMesh._unflatten, DeviceMesh._flatten = _unflatten, _flatten  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        DeviceMesh._unflatten, DeviceMesh._flatten = unflatten, flatten  # type: ignore[method-assign,assignment]


class HybridParallelDims(ParallelDims):
    """TorchTitan's ParallelDims whose data-parallel dimensions run on the DP backend (gloo jobs)."""

    def build_mesh(self) -> DeviceMesh:
        with _dp_dims_on(collectives.register()):
            return super().build_mesh()


def _mesh(dims: ParallelDims, names: tuple[str, ...]) -> DeviceMesh | None:
    """The first of the meshes ``names`` this release builds (None when none is)."""
    for name in names:
        try:
            mesh = dims.get_optional_mesh(name)
        except ValueError:  # a dimension this release does not build
            continue
        if mesh is not None:
            return mesh
    return None


def shard_mesh(dims: ParallelDims) -> DeviceMesh | None:
    """This rank's FSDP shard mesh (None when sharding is off), under the release's name."""
    return _mesh(dims, SHARD_MESHES)


def replica_mesh(dims: ParallelDims) -> DeviceMesh | None:
    """The data-parallel ranks of this rank's stage, in the dataloader's order (both releases'
    ``batch`` mesh: the shards of FSDP, and with HSDP its replicas of them too)."""
    return _mesh(dims, ("batch",))


def _init_fields(dims: ParallelDims) -> dict[str, Any]:
    """The public constructor arguments of ``dims`` (its release's ParallelDims dataclass fields)."""
    return {f.name: getattr(dims, f.name) for f in dataclasses.fields(dims) if f.init and not f.name.startswith("_")}


def lanes_group(settings: Settings, dims: ParallelDims | None) -> dist.ProcessGroup | None:
    """With tensor parallelism, a CPU group over every TP lane of every stage of this rank's
    pipeline replica (TorchTitan's ``pp`` x ``tp`` mesh of this rank's data-parallel coordinate):
    the exchange gathers there so that all lanes of a stage decide together. None without TP."""
    if dims is None or settings.job.tensor_parallel_degree < 2 or settings.stages < 2:
        return None
    mesh = dims.get_optional_mesh(["pp", "tp"])
    if mesh is None:
        raise RuntimeError("titan_morph: tensor parallelism with PP, but TorchTitan built no pp x tp mesh")
    morph = settings.morph
    ranks = [int(r) for r in mesh.mesh.flatten().tolist()]
    return cpu_group_over(ranks, morph.control_interface, settings.timeouts)


def parallel_dims_for(settings: Settings, dims: ParallelDims) -> ParallelDims:
    """For DP x PP: the hosts of this launch for every rank (the host table of the pair delays and
    of a moved pipeline's known links), and on gloo ``dims`` as :class:`HybridParallelDims` (the DP
    backend configured with this launch's pair delays); unchanged otherwise. Off gloo, what the DP
    backend alone can do is refused (:func:`~titan_morph.config.rules.check_dp_backend`)."""
    if not settings.hybrid:
        return dims
    backend = dist.get_backend()
    check_dp_backend(settings, backend)
    # one rank per host in a DP x PP layout; with TP a stage spans several ranks (hosts are not moved)
    hosts = layout_of(settings).hosts if settings.job.tensor_parallel_degree == 1 else None
    collectives.configure(hosts, pair_delays(settings.morph.inject))
    if backend != "gloo":
        return dims
    return HybridParallelDims(**_init_fields(dims))


def replica_split(settings: Settings, parallel_dims: ParallelDims | None) -> ReplicaSplit | None:
    """This rank's replica and the microbatches of every replica, for a DP x PP run whose counts may
    differ: ``[morph] replica_microbatches`` given, or ``rebalance_microbatches`` with ``monitor``
    (the world-wide exchange carries the speeds). None otherwise (N each, as TorchTitan splits). A
    collective over this stage's DP ranks (:func:`replica_mesh`) on their CPU group, any backend."""
    morph = settings.morph
    moving = morph.rebalance_microbatches and morph.monitor
    if parallel_dims is None or not settings.hybrid or not (moving or morph.replica_microbatches):
        return None
    dp = replica_mesh(parallel_dims)
    if dp is None or dp.size() != settings.dp_degree:
        raise RuntimeError(
            f"titan_morph: the data-parallel mesh of this stage has {dp.size() if dp else 'no'} rank(s), the"
            f" configured degrees {settings.dp_degree}: the replicas' microbatches cannot be split"
        )
    group = cpu_group(dp.get_group(), morph.control_interface, settings.timeouts)
    counts = settings.replica_counts
    rebalancer = None
    if moving:
        n, cap, rule = settings.microbatches, settings.replica_capacity, morph.detect_rule()
        rebalancer = Rebalancer(settings.stages, settings.dp_degree, n, cap=cap, rule=rule, counts=counts)
    return ReplicaSplit(counts, dp.get_local_rank(), group, rebalancer)


def make_exchange(
    settings: Settings,
    pipeline_group: dist.ProcessGroup,
    microbatches: int,
    epoch: float,
    parallel_dims: ParallelDims | None,
    cost: PipelineCost | None,
    stages_per_rank: int = 1,
    replicas: ReplicaSplit | None = None,
    lanes: int = 1,
) -> HybridExchange | None:
    """The world-wide exchange of a DP x PP run, on any backend (None without DP x PP);
    ``microbatches``: the most a step of this pipeline may run, ``replicas``: the rebalancer it
    feeds, ``lanes``: the TP degree (``pipeline_group`` then spans every lane, :func:`lanes_group`).
    The DP stamps and the ring probes come from the DP backend, on gloo jobs only."""
    if parallel_dims is None or not settings.hybrid:
        return None
    morph = settings.morph
    rule = morph.detect_rule(floor_ms=morph.dp_detect_min_ms)
    topology = TopologyMonitor(layout_of(settings), rule, morph.orchestrator, cost)
    dp = shard_mesh(parallel_dims) if isinstance(parallel_dims, HybridParallelDims) else None
    return HybridExchange(
        pipeline_group,
        microbatches,
        topology=topology,
        epoch=epoch,
        dp_group=dp.get_group() if dp is not None else None,
        moves_before=moves_before(),
        stages_per_rank=stages_per_rank,
        interface=morph.control_interface,
        replicas=replicas,
        timeouts=settings.timeouts,
        lanes=lanes,
    )


def _exchange_of(trainer: Any) -> HybridExchange | None:
    schedule = getattr(trainer, "pp_schedule", None)
    exchange = getattr(schedule, "exchange", None)
    return exchange if isinstance(exchange, HybridExchange) else None


def before_step(trainer: Any) -> None:
    """Tell the DP backend and the schedule which training step runs now (also after a resume)."""
    collectives.set_step(trainer.step)
    schedule = getattr(trainer, "pp_schedule", None)
    set_step: Callable[[int], None] | None = getattr(schedule, "set_step", None)
    if set_step is not None:
        set_step(trainer.step)


def save_now(checkpointer: Any, step: int) -> None:
    """A full checkpoint of ``step`` through TorchTitan's own save (its interval made 1 for it)."""
    interval = checkpointer.interval
    checkpointer.interval = 1
    try:
        checkpointer.save(step, last_step=False)
    finally:
        checkpointer.interval = interval


def finish_for_move(trainer: Any) -> bool:
    """After a step: when the orchestrator decided a move, checkpoint, ask for the relaunch and return
    True (training stops here and resumes in the new layout); else False."""
    exchange = _exchange_of(trainer)
    move: Move | None = exchange.move if exchange is not None else None
    if move is None or exchange is None or exchange.applied:
        return False
    exchange.applied = True
    step, last = trainer.step, trainer.job_config.training.steps
    if not can_relaunch(move.describe(), step, last, "the new rank order", logger):
        return False
    save_now(trainer.checkpointer, step)
    if dist.get_rank() == 0:
        slow = {**known_slow_pairs(), **move.slow}
        request_relaunch(move.new.hosts, step, exchange.moves_before + 1, move.describe(), slow)
    dist.barrier()
    return True
