"""Schedule dispatch: ``[parallelism] pipeline_parallel_schedule`` name → a runnable schedule.

titan_morph builds exactly one pipeline stage per rank and hands it, with the microbatch count
and loss, to the builder registered under the schedule's name: torch's own ``1F1B`` and ``GPipe``,
and titan_morph's ``PipeMorph``, ``ZBH1``, ``ZBH2`` and ``Morph1F1B`` (:mod:`.assembly`). Names are
matched case-insensitively; an unknown name is one clear error listing the registered ones.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe, _PipelineSchedule

from titan_morph.integration.assembly import FAMILIES, ScheduleRequest, morph_builder, torch_builder

__all__ = [
    "ScheduleBuilder",
    "ScheduleRequest",
    "build_schedule",
    "check_schedule_name",
    "register_schedule",
    "schedule_names",
]

ScheduleBuilder = Callable[[ScheduleRequest], _PipelineSchedule]

_SCHEDULES: dict[str, tuple[str, ScheduleBuilder]] = {}


def register_schedule(name: str, builder: ScheduleBuilder, *, replace: bool = False) -> None:
    """Make ``pipeline_parallel_schedule = name`` build its schedule with ``builder``."""
    key = name.lower()
    if key in _SCHEDULES and not replace:
        raise ValueError(f"pipeline schedule {name!r} is already registered (pass replace=True to override)")
    _SCHEDULES[key] = (name, builder)


def schedule_names() -> list[str]:
    """Registered schedule names, in their canonical spelling."""
    return sorted(canonical for canonical, _ in _SCHEDULES.values())


def _builder(name: str) -> ScheduleBuilder:
    entry = _SCHEDULES.get(name.lower())
    if entry is None:
        raise ValueError(
            f"[parallelism] pipeline_parallel_schedule = {name!r} is not supported by titan_morph; "
            f"allowed values are {' | '.join(schedule_names())}"
        )
    return entry[1]


def check_schedule_name(name: str) -> None:
    """Raise the 'unknown schedule' error early (before any stage is built)."""
    _builder(name)


def build_schedule(request: ScheduleRequest) -> _PipelineSchedule:
    """Dispatch on ``request.name`` to the registered builder (see :func:`register_schedule`)."""
    return _builder(request.name)(request)


register_schedule("1F1B", torch_builder(Schedule1F1B))
register_schedule("GPipe", torch_builder(ScheduleGPipe))
for _name, _family in FAMILIES.items():
    register_schedule(_name, morph_builder(_family))
