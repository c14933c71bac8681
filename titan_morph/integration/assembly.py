"""From the ``[morph]`` config to the runtime objects of one pipeline stage.

A schedule builder (:mod:`.schedules`) gets a :class:`ScheduleRequest` and assembles, per rank:

* the cost model plans are made from: ``[morph] stage_times_ms`` when given; else the
  ``[morph.synthetic]`` times when the testbed is on; else uniform unit times (the plan's *shape*,
  Alg. 1, does not depend on times; measured times replace them after ``profile_steps`` steps);
* the initial plan: PipeMorph's Alg. 1 warm-up under ``memory_budget`` (Alg. 2 for
  ``plan_delays_ms`` when given, + the search when ``search``), or a baseline's fixed warm-up;
* the transport of ``[morph] transport`` with the ``[morph.inject]`` link emulator, on the
  pipeline's common clock (the world's, for DP x PP);
* the testbed's padding (``[morph.synthetic]``) and the monitor's policy;
* for DP x PP, the world-wide exchange and the topology monitor (:mod:`.hybrid`), with this
  pipeline's simulated step under link delays as the placement cost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineSchedule

from titan_morph.comm.clock import CommonClock, sync_clock
from titan_morph.comm.transport import TorchTransport, Transport
from titan_morph.integration.config import (
    detect_rule,
    link_model_from_config,
    parse_rank_pairs,
    plan_delays,
    stage_times,
)
from titan_morph.integration.hybrid import HybridParallelDims, known_link_delays, make_exchange, pipeline_hosts
from titan_morph.monitor.adapt import AdaptPolicy, Monitor
from titan_morph.monitor.replan import adapted_plan
from titan_morph.monitor.topology import PipelineCost
from titan_morph.pipelining.builders import build
from titan_morph.pipelining.model import CostModel, Plan
from titan_morph.pipelining.simulate import simulate
from titan_morph.runtime.schedule import MorphSchedule
from titan_morph.runtime.testbed import DeviceClock, StageTimes, pad_stage_compute

__all__ = [
    "FAMILIES",
    "ScheduleRequest",
    "cost_model",
    "initial_plan",
    "make_transport",
    "morph_builder",
    "prepare_stage",
    "torch_builder",
    "transport_depth",
]

logger = logging.getLogger(__name__)

# TOML name -> builders.build name
FAMILIES = {"PipeMorph": "pipemorph", "ZBH1": "zb-h1", "ZBH2": "zb-h2", "Morph1F1B": "1f1b-iw"}


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


def cost_model(
    morph: Any,
    stages: int,
    n_microbatches: int,
    *,
    memory: bool,
    times: tuple[tuple[float, float, float], ...] | None = None,
) -> CostModel:
    """The cost model plans are made from (``memory`` applies ``[morph] memory_budget``; ``times``
    replaces the configured stage times, e.g. by measured ones)."""
    times = times or stage_times(morph, stages) or ((1.0, 1.0, 1.0),) * stages
    budget = (morph.memory_budget or stages) if memory else None
    return CostModel(
        stages,
        n_microbatches,
        tuple(t[0] for t in times),
        tuple(t[1] for t in times),
        tuple(t[2] for t in times),
        memory=budget,
    )


def transport_depth(morph: Any) -> int | None:
    """Link-queue depth of the configured transport: ``link_queue_depth`` for the blocking default
    transport (NCCL model; also ``auto``, which runs it until a link is delegated), None (never
    blocks) for the delegated one."""
    return None if morph.transport == "delegate" else morph.link_queue_depth


def initial_plan(
    family: str,
    morph: Any,
    stages: int,
    n_microbatches: int,
    times: tuple[tuple[float, float, float], ...] | None = None,
) -> Plan:
    """The plan a schedule starts with (same on every rank: a pure function of the config).

    PipeMorph: Alg. 1 under ``memory_budget``; with ``plan_delays_ms``, Alg. 2 for those delays,
    and with ``search`` the simulator-guided search (for the configured transport's link queue) on
    top. Without planned delays the search is not applied: every plan with no delay has the same
    makespan, and Alg. 1's maximal slackness is what absorbs stragglers until they are detected.
    """
    model = cost_model(morph, stages, n_microbatches, memory=family == "pipemorph", times=times)
    if family != "pipemorph":
        return build(family, model)
    delays = plan_delays(morph, stages - 1)
    if delays is not None:
        model = model.with_delays(delays)
    if morph.search and delays is not None:  # without known delays Alg. 1's max-min slackness stands
        return build(family, model, search=True, depth=transport_depth(morph), time_budget_ms=morph.search_budget_ms)
    return build(family, model)


def make_transport(req: ScheduleRequest, clock: CommonClock, *, monitored: bool = False) -> Transport | None:
    """The transport of ``[morph] transport`` for this rank, on ``clock``; None for plain
    torch.distributed (no injection, default transport, nothing to record).

    ``default``: torch P2P, through the ``[morph.inject]`` link emulator when it is on (a send
    blocks once ``link_queue_depth`` messages are in flight: NCCL's head-of-line blocking, §3.2),
    else recording message stamps for the monitor when ``monitored``. ``delegate``: the delegated
    data plane (§5), which applies the injected delays inside its delegates and never blocks the
    training thread on the wire. ``auto``: the default path, moved per link to the delegates when
    a link is slow or goes down.
    """
    morph = req.job_config.morph
    stage = req.stage
    # with rank_links the delays follow the hosts of this pipeline's stages
    hosts = pipeline_hosts(stage.group) if parse_rank_pairs(morph.inject.rank_links) else None
    links = link_model_from_config(morph.inject, stage.num_stages - 1, steps=req.job_config.training.steps, hosts=hosts)
    where = {"stage": stage.stage_index, "num_stages": stage.num_stages, "group": stage.group}
    if morph.transport == "delegate":  # all PP traffic via delegates; they apply the injected delays
        from titan_morph.comm.delegate import DelegateTransport

        return DelegateTransport(**where, links=links, delegates_per_link=morph.delegates_per_link, epoch=clock.epoch)
    primary: Transport = TorchTransport(clock.epoch)
    if links is not None:
        from titan_morph.comm.emulator import EmulatedTransport

        primary = EmulatedTransport(primary, links, **where, depth=morph.link_queue_depth, epoch=clock.epoch)
    elif monitored:  # the real network: message stamps for the monitor
        from titan_morph.comm.recorded import RecordedTransport

        primary = RecordedTransport(primary, **where, epoch=clock.epoch)
    elif morph.transport == "default":
        return None
    if morph.transport == "default":
        return primary
    from titan_morph.comm.delegate import DelegateTransport
    from titan_morph.comm.failover import FailoverTransport

    delegate = DelegateTransport(**where, links=links, delegates_per_link=morph.delegates_per_link, epoch=clock.epoch)
    return FailoverTransport(primary, delegate, **where)


def needs_transport(morph: Any) -> bool:
    """Whether a torch schedule's traffic must be routed (injected delays or a non-default path)."""
    return morph.inject.mode != "none" or morph.transport != "default"


def prepare_stage(req: ScheduleRequest) -> DeviceClock | None:
    """Pad this rank's stage compute when ``[morph.synthetic]`` is on; its device clock, else None."""
    morph = req.job_config.morph
    times = stage_times(morph, req.stage.num_stages) if morph.synthetic.enabled else None
    if times is None:
        return None
    f, b, w = times[req.stage.stage_index]
    return pad_stage_compute(req.stage, StageTimes(f, b, w))


def adapt_policy(family: str, morph: Any, stages: int) -> AdaptPolicy:
    """What a monitor decision may change: it re-plans only PipeMorph with ``adapt``. Adapted plans
    are searched for the delegated (non-blocking) path and, per §4.2, without the memory cap (or
    under ``adapt_memory_budget``) when slow links are delegated (``auto``/``delegate``); with the
    default transport they keep ``memory_budget`` and its blocking link queue."""
    delegated = morph.transport in ("auto", "delegate")
    if delegated:
        memory, depth = morph.adapt_memory_budget or None, None
    else:
        memory, depth = morph.memory_budget or stages, morph.link_queue_depth
    return AdaptPolicy(
        enabled=morph.adapt and family == "pipemorph",
        memory=memory,
        search=morph.search,
        search_budget_ms=morph.search_budget_ms,
        depth=depth,
        delegate_slow_links=morph.transport == "auto",
    )


def pipeline_cost(family: str, morph: Any, plan: Plan) -> PipelineCost:
    """This pipeline's simulated step (ms) when its links carry given delays: the plan it would run
    then (Alg. 2 for them when PipeMorph adapts, else ``plan``'s fixed orders) on its transport. The
    orchestrator's placement cost, the PP links' slackness included."""
    policy = adapt_policy(family, morph, plan.model.stages)

    def cost(delays: tuple[float, ...]) -> float:
        model = plan.model.with_delays(delays)
        if policy.enabled and any(delays):
            adapted = adapted_plan(model.with_memory(policy.memory), search=False, depth=policy.depth)
            return simulate(model, adapted.orders, depth=policy.depth).makespan
        return simulate(model, plan.orders, depth=transport_depth(morph)).makespan

    return cost


def make_monitor(family: str, morph: Any, plan: Plan, stages: int, n_microbatches: int) -> Monitor:
    """The monitor of a titan_morph schedule: it measures every one; it re-plans only PipeMorph with
    ``adapt`` (:func:`adapt_policy`). When the stage times are unknown, the initial plan is rebuilt
    from the times measured over the first ``profile_steps`` steps."""
    policy = adapt_policy(family, morph, stages)
    rule = detect_rule(morph)
    known = stage_times(morph, stages)
    planner = None
    if known is None and family == "pipemorph" and plan_delays(morph, stages - 1):

        def planner(measured: CostModel) -> Plan:
            times = tuple(zip(measured.fwd, measured.bwd, measured.wgt))
            return initial_plan(family, morph, stages, n_microbatches, times)

    return Monitor(
        num_stages=stages,
        microbatches=n_microbatches,
        initial_plan=plan,
        fallback_times=known or ((1.0, 1.0, 1.0),) * stages,
        rule=rule,
        policy=policy,
        initial_planner=planner,
        profile_steps=morph.profile_steps,
    )


def torch_builder(cls: type) -> Callable[[ScheduleRequest], _PipelineSchedule]:
    """A builder of torch's single-stage schedule ``cls`` on this rank's stage, its P2P routed
    through the configured transport when one is needed (so it sees the same injected delays)."""

    def build_schedule(req: ScheduleRequest) -> _PipelineSchedule:
        from titan_morph.comm.scope import use_transport

        prepare_stage(req)
        # scale_grads=False as TorchTitan does: the loss is token-summed and the trainer rescales.
        schedule = cls(req.stage, n_microbatches=req.n_microbatches, loss_fn=req.loss_fn, scale_grads=False)
        if not needs_transport(req.job_config.morph):
            return schedule
        transport = make_transport(req, sync_clock(req.stage.group))
        assert transport is not None
        inner, steps = schedule._step_microbatches, 0

        def step_microbatches(*args: Any, **kwargs: Any) -> Any:
            nonlocal steps
            steps += 1
            transport.set_step(steps)
            with use_transport(transport):
                return inner(*args, **kwargs)

        schedule._step_microbatches = step_microbatches  # type: ignore[method-assign]
        return schedule

    build_schedule.__doc__ = f"torch's {cls.__name__} on this rank's single stage."
    return build_schedule


def morph_builder(family: str) -> Callable[[ScheduleRequest], _PipelineSchedule]:
    """A builder of titan_morph's ``family`` plan (``builders.build`` name) in :class:`MorphSchedule`."""

    def build_schedule(req: ScheduleRequest) -> _PipelineSchedule:
        morph = req.job_config.morph
        stages = req.stage.num_stages
        plan = initial_plan(family, morph, stages, req.n_microbatches)
        device_clock = prepare_stage(req)
        multi = stages > 1
        transport = exchange = monitor = None
        if multi:
            hybrid = isinstance(req.parallel_dims, HybridParallelDims)
            clock = sync_clock(None if hybrid else req.stage.group)  # DP x PP: one clock for the world
            transport = make_transport(req, clock, monitored=morph.monitor) or TorchTransport(clock.epoch)
            if morph.monitor:
                monitor = make_monitor(family, morph, plan, stages, req.n_microbatches)
                cost = pipeline_cost(family, morph, plan)
                exchange = make_exchange(
                    req.job_config, req.stage.group, req.n_microbatches, clock.epoch, req.parallel_dims, cost
                )
            if monitor is not None and hybrid:  # slow pairs the orchestrator moved onto this pipeline
                known = known_link_delays(req.stage.group)
                why = "known before the first step (the orchestrator moved a slow pair onto it)"
                change = monitor.assume_slow(known, why)
                if change is not None:
                    plan = change.plan
                    transport.switch(change.switch)
                    times, delegated = monitor.times.times(), sorted(transport.delegated())
                    logger.warning("titan_morph: %s", change.describe(plan, times, delegated))
        return MorphSchedule(
            [req.stage],
            req.n_microbatches,
            req.loss_fn,
            plan=plan,
            transport=transport,
            scale_grads=False,
            planned_depth=transport_depth(morph),
            predict=stage_times(morph, stages) is not None,
            monitor=monitor,
            device_clock=device_clock,
            exchange=exchange,
        )

    build_schedule.__doc__ = f"titan_morph's {family} plan in MorphSchedule (one stage per rank)."
    return build_schedule
