"""From the ``[morph]`` config to the schedule of one pipeline rank.

A schedule builder (:mod:`.schedules`) gets a :class:`~.request.ScheduleRequest` and assembles, per
rank, from the builders by component: the initial plan, the monitor and its policy (:mod:`.plans`);
the transport of ``[morph] transport`` with the ``[morph.inject]`` link emulator, on the pipeline's
common clock (the world's, for DP x PP) (:mod:`.transports`), whose link model
(:meth:`~.request.ScheduleRequest.links`) is built once and shared by the emulator, the initial plan
and the runtime's simulator; the testbed's padding (``[morph.synthetic]``: compute times, message
size); and, for DP x PP, the world-wide exchange and the topology monitor (:mod:`.hybrid`), with
this pipeline's simulated step under link delays as the placement cost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch.distributed.pipelining.schedules import _PipelineSchedule

from titan_morph.comm.clock import sync_clock
from titan_morph.comm.transport import TorchTransport, warms_up_own_rank
from titan_morph.config.links import configured_message_bytes, plan_transmit
from titan_morph.integration.cpu import shared_gpu
from titan_morph.integration.hybrid import known_link_delays, lanes_group, make_exchange, replica_split
from titan_morph.integration.plans import initial_plan, make_monitor, pipeline_cost
from titan_morph.integration.request import ScheduleRequest, group_of
from titan_morph.integration.transports import make_transport
from titan_morph.runtime.exchange import StepExchange
from titan_morph.runtime.schedule import MorphSchedule
from titan_morph.runtime.testbed import DeviceClock, StageTimes, pad_stage_compute, pad_stage_messages

__all__ = ["morph_builder", "prepare_stage", "torch_builder"]

logger = logging.getLogger(__name__)


def prepare_stage(req: ScheduleRequest) -> DeviceClock | None:
    """Pad this rank's stage compute when ``[morph.synthetic]`` is on (all of its stages on one
    device clock); the clock, else None."""
    morph = req.settings.morph
    times = morph.stage_times(req.stage.num_stages) if morph.synthetic.enabled else None
    if times is None:
        return None
    clock = None
    size = configured_message_bytes(req.settings)
    for stage in req.local_stages:
        f, b, w = times[stage.stage_index]
        clock = pad_stage_compute(stage, StageTimes(f, b, w), clock=clock)
        if size is not None:
            pad_stage_messages(stage, size)
    return clock


def torch_builder(cls: type[_PipelineSchedule]) -> Callable[[ScheduleRequest], _PipelineSchedule]:
    """A builder of torch's schedule ``cls`` on this rank's stage (or stages, for torch's
    multi-stage schedules), its P2P routed through the configured transport when one is needed (so
    it sees the same injected delays)."""

    def build_schedule(req: ScheduleRequest) -> _PipelineSchedule:
        from torch.distributed.pipelining.schedules import PipelineScheduleMulti

        from titan_morph.comm.scope import use_transport

        prepare_stage(req)
        multi = issubclass(cls, PipelineScheduleMulti)
        # scale_grads=False as TorchTitan does: the loss is token-summed and the trainer rescales.
        make: Callable[..., _PipelineSchedule] = cls  # the subclasses take the stage(s) first
        schedule = make(
            req.local_stages if multi else req.stage,
            n_microbatches=req.n_microbatches,
            loss_fn=req.loss_fn,
            scale_grads=False,
        )
        morph = req.settings.morph
        shared = shared_gpu() is not None  # Gloo carries no device memory: the transport must
        own = warms_up_own_rank(schedule, req.stage.group)  # torch 2.11's V over gloo
        if not (morph.routed or shared or own):
            return schedule
        hop = _non_adjacent_hop(req, schedule)
        if hop is not None:
            if morph.inject.mode == "none" and morph.transport == "auto" and not shared:
                # auto only fails over links between adjacent ranks; torch's own P2P carries the rest
                logger.warning("titan_morph: %s; transport auto: torch's P2P carries this schedule", hop)
                return schedule
            raise ValueError(
                f"[parallelism] pipeline_parallel_schedule = {req.name!r}: {hop}: the [morph.inject] link emulator"
                " and the delegated transport (which carries every link where ranks share a GPU) cannot carry it;"
                " with [morph.inject], transport = 'delegate' or ranks sharing a GPU use"
                " pipeline_parallel_degree = 2, a V schedule (ZBVZeroBubble, DualPipeV, PipeMorphV) or a"
                " one-stage-per-rank schedule"
            )
        clock = sync_clock(req.stage.group, timeouts=req.settings.timeouts)
        transport = make_transport(req, clock) or TorchTransport(clock.epoch)
        inner, steps = schedule._step_microbatches, 0

        def step_microbatches(*args: Any, **kwargs: Any) -> Any:
            nonlocal steps
            steps += 1
            transport.set_step(steps)
            with use_transport(transport):
                return inner(*args, **kwargs)

        # torch's schedules have no hook around one step's P2P: the step is wrapped to route it.
        schedule._step_microbatches = step_microbatches  # type: ignore[method-assign]
        return schedule

    build_schedule.__doc__ = f"torch's {cls.__name__} on this rank's stage(s)."
    return build_schedule


def _non_adjacent_hop(req: ScheduleRequest, schedule: Any) -> str | None:
    """The transports carry traffic between adjacent ranks only (link i joins ranks i and i+1); a
    looped schedule's hop from the last rank back to rank 0 is no such link once PP > 2. Returns
    the first such hop, described, or None."""
    mapping = getattr(schedule, "stage_index_to_group_rank", None) or {}
    for s in range(req.stage.num_stages - 1):
        a, b = mapping.get(s, 0), mapping.get(s + 1, 0)
        if abs(a - b) > 1:
            return f"stage {s}'s output goes from rank {a} to rank {b}, not a link between adjacent ranks"
    return None


def morph_builder(family: str) -> Callable[[ScheduleRequest], _PipelineSchedule]:
    """A builder of titan_morph's ``family`` plan (``builders.build`` name) in :class:`MorphSchedule`."""

    def build_schedule(req: ScheduleRequest) -> _PipelineSchedule:
        morph, timeouts = req.settings.morph, req.settings.timeouts  # timeouts: of the CPU groups made here
        stages, multi = req.stage.num_stages, req.stage.group_size > 1
        transmit = plan_transmit(morph, req.links()) if multi else None
        replicas = replica_split(req.settings, req.parallel_dims)  # DP x PP: microbatches per replica
        n, most = (replicas.mine, req.settings.replica_capacity) if replicas else (req.n_microbatches,) * 2
        plan = initial_plan(family, morph, stages, n, transmit=transmit)
        device_clock = prepare_stage(req)
        transport = monitor = None
        exchange: StepExchange | None = None
        if multi:
            hybrid, lanes, dims = req.settings.hybrid, req.settings.job.tensor_parallel_degree, req.parallel_dims
            # DP x PP or TP lanes: one clock for the world (stamps of other pipelines' ranks compare)
            clock = sync_clock(None if hybrid or lanes > 1 else req.stage.group, timeouts=timeouts)
            transport = make_transport(req, clock, monitored=morph.monitor) or TorchTransport(clock.epoch)
            group, per_rank = group_of(req.stage), plan.model.stages_per_rank
            rows = lanes_group(req.settings, dims) or group  # with TP: every lane's rows
            if morph.monitor:
                monitor = make_monitor(family, morph, plan, stages, n, transmit)
                cost = pipeline_cost(family, morph, plan)
                exchange = make_exchange(req.settings, rows, most, clock.epoch, dims, cost, per_rank, replicas, lanes)
            if exchange is None:  # the per-step exchange (on the host NIC when one is set)
                exchange = StepExchange(rows, most, per_rank, next(iter(morph.host_interfaces), ""), timeouts, lanes)
            if monitor is not None and hybrid:  # slow pairs the orchestrator moved onto this pipeline
                known = known_link_delays(group)
                why = "known before the first step (the orchestrator moved a slow pair onto it)"
                change = monitor.assume_slow(known, why)
                if change is not None:
                    plan = change.plan
                    transport.switch(change.switch)
                    times, delegated = monitor.times.times(), sorted(transport.delegated())
                    logger.warning("titan_morph: %s", change.describe(plan, times, delegated))
        return MorphSchedule(
            req.local_stages,
            n,
            req.loss_fn,
            plan=plan,
            transport=transport,
            scale_grads=False,
            planned_depth=morph.depth,
            predict=morph.stage_times(stages) is not None,
            monitor=monitor,
            device_clock=device_clock,
            exchange=exchange,
            summary_window=morph.inject.window(req.settings.job.steps),
            replicas=replicas,
            max_microbatches=most,
            profiles_file=morph.profiles_file,
        )

    build_schedule.__doc__ = f"titan_morph's {family} plan in MorphSchedule."
    return build_schedule
