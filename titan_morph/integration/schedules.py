"""Schedule dispatch: ``[parallelism] pipeline_parallel_schedule`` name → a runnable schedule.

titan_morph builds exactly one pipeline stage per rank and hands it, with the microbatch count
and loss, to the builder registered under the schedule's name. This module wires torch's own
``1F1B`` and ``GPipe``; later work registers its schedules (``ZBH1``, ``ZBH2``, ``PipeMorph``...)
with :func:`register_schedule` from ``titan_morph.pipelining.schedule``. Names are matched
case-insensitively; an unknown name is one clear error listing the registered ones.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe, _PipelineSchedule


@dataclass
class ScheduleRequest:
    """Everything a schedule builder may need; one stage per rank."""

    name: str
    """The schedule name as written in the config."""
    stage: PipelineStage
    """This rank's stage (``stage.stage_index``, ``stage.num_stages``, ``stage.group``)."""
    n_microbatches: int
    """N = local_batch_size / pipeline_parallel_microbatch_size."""
    loss_fn: Callable[..., Any] | None
    """TorchTitan's token-summed loss (the trainer rescales the reported loss)."""
    job_config: Any
    """The merged JobConfig (``job_config.morph`` holds the [morph] options)."""
    parallel_dims: Any = None
    """TorchTitan's ParallelDims (``get_mesh("pp")``)."""


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
    _import_plugins()
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


def _torch_single_stage(cls: type) -> ScheduleBuilder:
    def build(req: ScheduleRequest) -> _PipelineSchedule:
        from titan_morph.integration.morph_schedules import make_transport, prepare_stage

        prepare_stage(req)
        # scale_grads=False as TorchTitan does: the loss is token-summed and the trainer rescales.
        schedule = cls(req.stage, n_microbatches=req.n_microbatches, loss_fn=req.loss_fn, scale_grads=False)
        transport = make_transport(req)
        if transport is not None:
            route_through(schedule, transport)
        return schedule

    build.__doc__ = f"torch's {cls.__name__} on this rank's single stage."
    return build


def route_through(schedule: _PipelineSchedule, transport: Any) -> None:
    """Run every step of a torch schedule with its p2p routed through ``transport`` (emulated links)."""
    from titan_morph.comm.scope import use_transport

    inner = schedule._step_microbatches
    steps = 0

    def step_microbatches(*args: Any, **kwargs: Any) -> Any:
        nonlocal steps
        steps += 1
        transport.set_step(steps)
        with use_transport(transport):
            return inner(*args, **kwargs)

    schedule._step_microbatches = step_microbatches  # type: ignore[method-assign]


register_schedule("1F1B", _torch_single_stage(Schedule1F1B))
register_schedule("GPipe", _torch_single_stage(ScheduleGPipe))

_plugins_imported = False


def _import_plugins() -> None:
    """Register titan_morph's own schedules (PipeMorph, ZBH1, ZBH2, Morph1F1B) on first use."""
    global _plugins_imported
    if _plugins_imported:
        return
    _plugins_imported = True
    from titan_morph.integration.morph_schedules import register

    register()
