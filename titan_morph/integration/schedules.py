"""Schedule dispatch: ``[parallelism] pipeline_parallel_schedule`` name → a runnable schedule.

Every schedule TorchTitan 0.2.2 accepts is registered, each with its stage placement, which the
TrainSpec's ``pipelining_fn`` uses to split the model as TorchTitan does:

* one stage per rank: torch's ``1F1B`` and ``GPipe``; titan_morph's ``PipeMorph``, ``ZBH1``,
  ``ZBH2`` and ``Morph1F1B`` (:mod:`.assembly`, their plans from :mod:`.plans`);
* several stages per rank, looped (stage s on rank s mod R): torch's ``Interleaved1F1B``,
  ``LoopedBFS`` and ``InterleavedZeroBubble``;
* two stages per rank in a V (rank r runs stages r and 2R-1-r): torch's ``ZBVZeroBubble`` and
  ``DualPipeV``, and titan_morph's ``PipeMorphV`` (slackness-aware, re-planned live).

Builders get a :class:`ScheduleRequest` with this rank's stage(s). Names are matched
case-insensitively; an unknown name is one clear error listing the registered ones.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
    _PipelineSchedule,
)

from titan_morph.integration.assembly import morph_builder, torch_builder
from titan_morph.integration.plans import FAMILIES, V_FAMILIES
from titan_morph.integration.request import ScheduleRequest

__all__ = [
    "PLACEMENTS",
    "ScheduleBuilder",
    "ScheduleRequest",
    "build_schedule",
    "check_schedule_name",
    "register_schedule",
    "schedule_names",
    "schedule_placement",
    "stages_per_rank_of",
]

ScheduleBuilder = Callable[[ScheduleRequest], _PipelineSchedule]

PLACEMENTS = ("single", "loop", "v")
"""How a schedule places stages on ranks: one per rank; several, looped (TorchTitan's "loop" style:
stage s on rank s mod R); or two in a V (its "v" style)."""

# The registry TorchTitan's schedule names resolve through; module-wide so that a custom_import may add to it.
_SCHEDULES: dict[str, tuple[str, ScheduleBuilder, str]] = {}


def register_schedule(name: str, builder: ScheduleBuilder, *, replace: bool = False, placement: str = "single") -> None:
    """Make ``pipeline_parallel_schedule = name`` build its schedule with ``builder``; ``placement``
    (one of :data:`PLACEMENTS`) tells the TrainSpec how to split the model into stages."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement of schedule {name!r} must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    key = name.lower()
    if key in _SCHEDULES and not replace:
        raise ValueError(f"pipeline schedule {name!r} is already registered (pass replace=True to override)")
    _SCHEDULES[key] = (name, builder, placement)


def schedule_names() -> list[str]:
    """Registered schedule names, in their canonical spelling."""
    return sorted(entry[0] for entry in _SCHEDULES.values())


def _entry(name: str) -> tuple[str, ScheduleBuilder, str]:
    entry = _SCHEDULES.get(name.lower())
    if entry is None:
        raise ValueError(
            f"[parallelism] pipeline_parallel_schedule = {name!r} is not supported by titan_morph; "
            f"allowed values are {' | '.join(schedule_names())}"
        )
    return entry


def check_schedule_name(name: str) -> None:
    """Raise the 'unknown schedule' error early (before any stage is built)."""
    _entry(name)


def schedule_placement(name: str) -> str:
    """The stage placement of schedule ``name`` (one of :data:`PLACEMENTS`)."""
    return _entry(name)[2]


def stages_per_rank_of(name: str, layers_per_stage: int | None = None) -> int | None:
    """Stages per rank of schedule ``name`` for the config checks: 1 (one stage per rank), 2 (a V,
    or a looped schedule with TorchTitan's default split), None when the model decides it (a looped
    schedule with ``pipeline_parallel_layers_per_stage``) or the name is not registered (yet)."""
    entry = _SCHEDULES.get(name.lower())
    if entry is None:
        return None
    placement = entry[2]
    if placement == "single":
        return 1
    return 2 if placement == "v" or layers_per_stage is None else None


def build_schedule(request: ScheduleRequest) -> _PipelineSchedule:
    """Dispatch on ``request.name`` to the registered builder (see :func:`register_schedule`)."""
    return _entry(request.name)[1](request)


register_schedule("1F1B", torch_builder(Schedule1F1B))
register_schedule("GPipe", torch_builder(ScheduleGPipe))
for _cls, _name in ((ScheduleInterleaved1F1B, "Interleaved1F1B"), (ScheduleLoopedBFS, "LoopedBFS")):
    register_schedule(_name, torch_builder(_cls), placement="loop")
register_schedule("InterleavedZeroBubble", torch_builder(ScheduleInterleavedZeroBubble), placement="loop")
register_schedule("ZBVZeroBubble", torch_builder(ScheduleZBVZeroBubble), placement="v")
register_schedule("DualPipeV", torch_builder(ScheduleDualPipeV), placement="v")
for _name, _family in FAMILIES.items():
    register_schedule(_name, morph_builder(_family))
for _name, _family in V_FAMILIES.items():
    register_schedule(_name, morph_builder(_family), placement="v")
