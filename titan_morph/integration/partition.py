"""``[morph] partition`` in TorchTitan (both releases): which modules each stage holds, the compute
stragglers of ``[morph.inject] compute_factor``, the partition's monitor, and the re-partition
through a checkpoint and a relaunch.

Splits. ``even`` and ``manual`` keep TorchTitan's own module split (its options; ``even`` refuses
them, ``manual`` needs one), except that the synthetic model with ``[morph.synthetic] layers`` is
split into equal layer counts (its embedding and output are not padded: they cost nothing). A
relaunch after a re-partition runs the split in ``$TITAN_MORPH_SPLIT``. A split is transformer
layers per stage; the first stage also holds the embedding and the last the norm and output, named
as the release's own split function names them (:func:`module_names`).

Re-partition (``auto``; :mod:`titan_morph.monitor.repartition` decides). After the step whose
exchange decided it, every rank finishes the step, the run saves a full checkpoint through
TorchTitan (model, optimizer, LR schedule, data position, step; DCP stores tensors by name, so a
rank loads whichever layers it holds next), rank 0 asks the launcher for a relaunch with the new
split and what the monitor carries, and the ranks stop. The relaunched ranks build the new split,
load the checkpoint and go on: the same model, the same data, the losses of an undisturbed run.
The same TorchTitan hooks as the topology orchestrator's moves (:mod:`.hybrid`), so 0.2.2 and 0.3.0
both re-partition.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from titan_morph.config import ConfigError, Settings
from titan_morph.config.links import compute_model
from titan_morph.config.model import GB, ModelShape, check_split_memory, model_entries
from titan_morph.integration.relaunch import (
    PARTITION_ENV,
    SPLIT_ENV,
    can_relaunch,
    hosts_from_env,
    launch_time,
    moves_before,
    request_relaunch,
)
from titan_morph.monitor.repartition import Partitioner, PartitionState, entries_of, layers_of
from titan_morph.pipelining.partition import even_split

if TYPE_CHECKING:
    from torch.distributed.pipelining import PipelineStage

    from titan_morph.integration.boundary import ParallelismSection

__all__ = [
    "attach_partitioner",
    "check_model",
    "finish_for_repartition",
    "launch_split",
    "ModuleSplit",
    "module_names",
    "prepare_compute",
    "running_split",
    "stage_module_names",
    "started_launch",
]

logger = logging.getLogger(__name__)

ModuleSplit = Callable[[int, int, int, int], list[list[str]]]
"""A release's ``generate_llm_fqn_per_model_part(num_stages, num_layers, input_weight, output_weight)``."""


def stage_module_names(
    parallelism: ParallelismSection, num_stages: int, num_layers: int, generate: ModuleSplit, section: str
) -> list[list[str]]:
    """Module FQNs per stage: the config's ``module_fqns_per_model_part`` or TorchTitan's split
    (``generate``: the release's ``generate_llm_fqn_per_model_part``)."""
    par = parallelism
    names = par.module_fqns_per_model_part
    if names is None:
        names = generate(
            num_stages,
            num_layers,
            par.pipeline_parallel_first_stage_less_layers,
            par.pipeline_parallel_last_stage_less_layers,
        )
    if len(names) != num_stages:
        raise ValueError(
            f"{section}module_fqns_per_model_part has {len(names)} parts; the schedule runs {num_stages} stages"
            " (PP degree x stages per rank), so it needs exactly that many parts"
        )
    return list(names)


def launch_split(settings: Settings, num_layers: int, stages: int) -> tuple[int, ...] | None:
    """Transformer layers per stage when titan_morph splits this launch itself (a relaunch's
    ``$TITAN_MORPH_SPLIT``, or the synthetic model's layers); None: TorchTitan's split. A split that
    does not fit the model is a ``ValueError`` naming where it came from."""
    morph = settings.morph
    if morph.split is not None:
        split = morph.split
        where = SPLIT_ENV
    elif morph.synthetic.enabled and morph.synthetic.layers:
        if num_layers != morph.synthetic.layers:
            raise ValueError(
                f"[morph.synthetic] layers = {morph.synthetic.layers} needs [model] flavor = 'synthetic'"
                f" (this model has {num_layers} layers)"
            )
        return morph.synthetic_split(stages)
    else:
        return None
    if len(split) != stages or sum(split) != num_layers or any(n < 1 for n in split[1:-1]):
        raise ValueError(f"{where}: {list(split)} is not a split of {num_layers} layers into {stages} stages")
    return split


def running_split(settings: Settings, num_layers: int, stages: int) -> tuple[int, ...]:
    """Transformer layers per stage this launch runs: :func:`launch_split`, else TorchTitan's even
    split (the embedding and the output counted as a layer each, its defaults)."""
    own = launch_split(settings, num_layers, stages)
    return own if own is not None else layers_of(even_split(num_layers + 2, stages))


def module_names(generate: ModuleSplit, num_layers: int, layers_per_stage: Sequence[int]) -> list[list[str]]:
    """Module FQNs per stage for a split of the transformer layers, named as the release's split
    function (``generate``) names the whole model: its first module on the first stage, its last
    ones (norm, output) on the last."""
    whole = generate(1, num_layers, 1, 1)[0]
    first, layers, last = whole[0], whole[1 : 1 + num_layers], whole[1 + num_layers :]
    out, at = [], 0
    for s, count in enumerate(layers_per_stage):
        names = [first] if s == 0 else []
        names += layers[at : at + count]
        at += count
        out.append(names + (last if s == len(layers_per_stage) - 1 else []))
    return out


def check_model(
    settings: Settings, shape: ModelShape, parallelism: ParallelismSection, generate: ModuleSplit, section: str
) -> None:
    """The checks that need the model (before any rank, and on every rank): the split of this
    launch (``manual``: TorchTitan's, from ``parallelism`` and the release's ``generate``) fits the
    model and every rank's ``rank_memory_gb``. One :class:`ConfigError`."""
    morph = settings.morph
    stages = settings.stages
    if stages < 2 or settings.job.stages_per_rank != 1:
        return
    try:
        if morph.partition == "manual":
            names = stage_module_names(parallelism, stages, shape.layers, generate, section)
            split = tuple(sum(1 for n in part if n.startswith("layers.")) for part in names)
        else:
            split = running_split(settings, shape.layers, stages)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if morph.rank_memory_gb:
        layer_times = morph.layer_times() if morph.synthetic.enabled and morph.synthetic.layers else None
        entries = model_entries(shape, layer_times)
        check_split_memory(entries, split, morph.rank_memory_gb, settings.job.schedule, settings.microbatches)


def prepare_compute(settings: Settings, stages: Sequence[PipelineStage]) -> None:
    """Emulate ``[morph.inject] compute_factor`` on this rank: the testbed's pads read the factor;
    a real model's ops get their extra time (:mod:`titan_morph.runtime.slowdown`)."""
    from titan_morph.runtime.slowdown import ACTIVE, slow_stage_compute

    model = compute_model(settings.morph.inject, settings.stages)
    rank = stages[0].group_rank
    if model is not None and model.ranks != settings.stages:  # one factor per host (DP x PP): this rank's host's
        import torch.distributed as dist

        world = dist.get_world_size()
        rank = (hosts_from_env(world) or tuple(range(world)))[dist.get_rank()]
    ACTIVE.configure(model, rank if model is not None else 0)
    if model is None or settings.morph.synthetic.enabled:
        return
    for stage in stages:
        slow_stage_compute(stage)


def attach_partitioner(settings: Settings, schedule: object, shape: ModelShape) -> None:
    """``partition = "auto"``: give the schedule's monitor its :class:`Partitioner`."""
    from titan_morph.runtime.schedule import MorphSchedule

    morph = settings.morph
    if morph.partition != "auto" or not isinstance(schedule, MorphSchedule) or schedule.monitor is None:
        return
    monitor = schedule.monitor
    stages = settings.stages
    layer_times = morph.layer_times() if morph.synthetic.enabled else None
    cap = monitor.policy.memory
    memory = morph.rank_memory_gb
    carried = os.environ.get(PARTITION_ENV, "")
    monitor.partitioner = Partitioner(
        model_entries(shape, layer_times),
        entries_of(running_split(settings, shape.layers, stages)),
        settings.microbatches,
        settings.job.schedule,
        settings.job.steps,
        profile_steps=morph.profile_steps,
        rule=morph.detect_rule(),
        after=morph.repartition_after,
        # DP replicas hold one split: under DP it stays, and microbatches move instead (rebalance)
        min_gain=morph.repartition_min_gain if settings.dp_degree == 1 else math.inf,
        max_in_flight=cap if isinstance(cap, int) else (min(cap) if cap else None),
        memory=tuple(m * GB for m in (memory * stages if len(memory) == 1 else memory)) or None,
        carried=PartitionState.from_json(carried) if carried else None,
    )


def _partitioner(trainer: Any) -> tuple[Any, Partitioner | None]:
    """The trainer's schedule and its monitor's partitioner (None without ``partition = "auto"``)."""
    schedule = getattr(trainer, "pp_schedule", None)
    part = getattr(getattr(schedule, "monitor", None), "partitioner", None)
    return schedule, part if isinstance(part, Partitioner) else None


def started_launch(trainer: Any) -> None:
    """After a step: on the first of this launch, every rank agrees on the time since the launch
    began (a relaunch: since the move was decided), from which the partitioner's relaunch cost
    follows; a first launch that may move also probes the checkpoint's save and load
    (:mod:`.relaunch_price`). A few collectives, once per launch."""
    schedule, part = _partitioner(trainer)
    if part is None or part.startup_known or schedule.exchange is None:
        return
    part.startup_known = True
    began = part.carried.decided_at if part.carried is not None else launch_time()
    if began is None:  # no launcher: nothing relaunches this run
        return
    startup_ms = schedule.exchange.agree_max((time.time() - began) * 1e3)
    parts = None
    checkpointer = trainer.checkpointer
    if part.carried is None and math.isfinite(part.min_gain) and checkpointer.enable:
        import torch.distributed as dist

        from titan_morph.comm.groups import cpu_group
        from titan_morph.integration.relaunch_price import relaunch_parts

        settings: Settings = trainer.morph_settings
        world = dist.group.WORLD
        if world is None:  # torch types WORLD as optional: None before init_process_group
            raise RuntimeError("partition = auto: torch.distributed has no default process group")
        group = cpu_group(world, settings.morph.control_interface, settings.timeouts)
        parts = relaunch_parts(checkpointer.folder, trainer.model_parts, trainer.optimizers, group)
    part.set_startup(startup_ms, parts)


def finish_for_repartition(trainer: Any, save: Callable[[Any, int], None]) -> bool:
    """After a step: when the partition's monitor decided a move, checkpoint (``save``), ask the
    launcher for a relaunch with the new split and return True (training stops here); else False."""
    import torch.distributed as dist

    _, part = _partitioner(trainer)
    move = part.repartition if part is not None else None
    if part is None or move is None or part.applied:
        return False
    part.applied = True
    step = trainer.step
    if not can_relaunch(move.describe(), step, part.steps, "the new split", logger):
        return False
    decided_at = time.time()
    save(trainer.checkpointer, step)
    if dist.get_rank() == 0:
        world = dist.get_world_size()
        hosts = hosts_from_env(world) or tuple(range(world))
        env = {SPLIT_ENV: ",".join(map(str, layers_of(move.entries))), PARTITION_ENV: part.state(decided_at).to_json()}
        request_relaunch(hosts, step, moves_before(), move.describe(), env=env)
    dist.barrier()
    return True
