"""TorchTitan builders for titan_morph's schedules, and the per-run link emulation and testbed.

``[parallelism] pipeline_parallel_schedule`` selects:

* ``PipeMorph``: Alg. 1 warm-up under ``[morph] memory_budget`` — Alg. 2 for ``[morph]
  plan_delays_ms`` when given, + the search when ``[morph] search`` — orders from the generator
  (Alg. 3/4), run by :class:`MorphSchedule`;
* ``ZBH1`` / ``ZBH2`` / ``Morph1F1B``: the same runtime with the ZB-H1, ZB-H2 and 1F1B (I+W) orders
  of ``titan_morph.pipelining.builders`` — baselines that differ from PipeMorph only in the plan;
* torch's ``1F1B`` / ``GPipe`` (wired in ``schedules``), which this module also routes through the
  emulated links when ``[morph.inject]`` is on, so every variant sees the same injected delays.

Cost model: ``[morph] stage_times_ms`` when given; else the ``[morph.synthetic]`` times when the
testbed is on; else uniform unit times (the plan's *shape* — Alg. 1 — does not depend on times;
measured times replace them when the monitor re-plans).
"""

from typing import Any

import torch.distributed as dist
from torch.distributed.pipelining.schedules import _PipelineSchedule

from titan_morph.integration.config import (
    link_model_from_config,
    parse_per_stage,
    parse_plan_delays,
    parse_stage_times,
)
from titan_morph.integration.schedules import ScheduleRequest, register_schedule
from titan_morph.pipelining.builders import build
from titan_morph.pipelining.model import CostModel, Plan

# TOML name -> builders.build name
FAMILIES = {"PipeMorph": "pipemorph", "ZBH1": "zb-h1", "ZBH2": "zb-h2", "Morph1F1B": "1f1b-iw"}


def stage_times(morph: Any, stages: int) -> tuple[tuple[float, float, float], ...] | None:
    """Per-stage (F, B, W) ms from ``stage_times_ms`` or the synthetic testbed; None if unknown."""
    configured = parse_stage_times(morph.stage_times_ms, stages)
    if configured is not None:
        return configured
    syn = morph.synthetic
    if syn.enabled:
        f = parse_per_stage(syn.fwd_ms, stages, "morph.synthetic.fwd_ms")
        b = parse_per_stage(syn.bwd_ms, stages, "morph.synthetic.bwd_ms")
        w = parse_per_stage(syn.wgt_ms, stages, "morph.synthetic.wgt_ms")
        return tuple(zip(f, b, w))
    return None


def cost_model(morph: Any, stages: int, n_microbatches: int, *, memory: bool) -> CostModel:
    """The cost model plans are made from (``memory`` applies ``[morph] memory_budget``)."""
    times = stage_times(morph, stages) or ((1.0, 1.0, 1.0),) * stages
    budget = (morph.memory_budget or stages) if memory else None
    return CostModel(
        stages,
        n_microbatches,
        tuple(t[0] for t in times),
        tuple(t[1] for t in times),
        tuple(t[2] for t in times),
        memory=budget,
    )


def make_transport(req: ScheduleRequest, *, monitored: bool = False) -> Any | None:
    """The emulated transport of ``[morph.inject]`` for this rank, or None (plain torch.distributed);
    with ``[morph] transport = "delegate"`` the delegated data plane (§5), which applies the
    injected delays inside its delegates and never blocks the training thread on the wire; with
    ``"auto"`` the default path, failing over per link to the delegates when a link goes down.

    With ``[morph] transport = "default"`` the emulated link blocks the sender once
    ``link_queue_depth`` messages are in flight (NCCL's head-of-line blocking, §3.2). With no
    injection and ``monitored``, plain torch.distributed P2P whose messages are stamped for the
    monitor (:class:`~titan_morph.comm.recorded.RecordedTransport`).
    """
    morph = req.job_config.morph
    stage = req.stage
    links = link_model_from_config(morph.inject, stage.num_stages - 1, steps=req.job_config.training.steps)
    if morph.transport == "delegate":  # all PP traffic via delegates; they apply the injected delays
        from titan_morph.comm.delegate import DelegateTransport

        return DelegateTransport(
            stage=stage.stage_index,
            num_stages=stage.num_stages,
            group=stage.group,
            links=links,
            delegates_per_link=morph.delegates_per_link,
        )
    if morph.transport not in ("default", "auto"):
        raise ValueError(f'[morph] transport must be "default", "delegate" or "auto", got {morph.transport!r}')
    from titan_morph.comm.emulator import EmulatedTransport, sync_epoch
    from titan_morph.comm.transport import TorchTransport

    if links is None and morph.transport == "default":
        if not monitored:
            return None
        from titan_morph.comm.recorded import RecordedTransport  # message stamps for the monitor

        epoch = sync_epoch(stage.group)
        return RecordedTransport(
            TorchTransport(), stage=stage.stage_index, num_stages=stage.num_stages, group=stage.group, epoch=epoch
        )
    epoch = sync_epoch(stage.group)
    primary = (
        TorchTransport()
        if links is None
        else EmulatedTransport(
            TorchTransport(),
            links,
            stage=stage.stage_index,
            num_stages=stage.num_stages,
            group=stage.group,
            depth=morph.link_queue_depth,
            epoch=epoch,
        )
    )
    if morph.transport == "default":
        return primary
    # auto: default path per link; a link that goes down (inf) fails over to the delegates
    from titan_morph.comm.delegate import DelegateTransport
    from titan_morph.comm.failover import FailoverTransport

    delegate = DelegateTransport(
        stage=stage.stage_index,
        num_stages=stage.num_stages,
        group=stage.group,
        links=links,
        delegates_per_link=morph.delegates_per_link,
        epoch=epoch,
    )
    return FailoverTransport(primary, delegate, stage=stage.stage_index, num_stages=stage.num_stages)


def prepare_stage(req: ScheduleRequest) -> None:
    """Apply the synthetic-compute pad to this rank's stage when ``[morph.synthetic]`` is on."""
    morph = req.job_config.morph
    times = stage_times(morph, req.stage.num_stages) if morph.synthetic.enabled else None
    if times is not None:
        from titan_morph.testbed import StageTimes, pad_stage_compute

        f, b, w = times[req.stage.stage_index]
        pad_stage_compute(req.stage, StageTimes(f, b, w))


def transport_depth(morph: Any) -> int | None:
    """Link-queue depth of the configured transport: ``link_queue_depth`` for the blocking default
    transport (NCCL model; also ``auto``, which runs it until a link fails over), None (never
    blocks) for the delegated one."""
    return None if morph.transport == "delegate" else morph.link_queue_depth


def initial_plan(family: str, morph: Any, stages: int, n_microbatches: int) -> Plan:
    """The plan a schedule starts with (same on every rank: a pure function of the config).

    PipeMorph: Alg. 1 under ``memory_budget``; with ``plan_delays_ms``, Alg. 2 for those delays,
    and with ``search`` the simulator-guided search (for the configured transport's link queue) on
    top. Without planned delays the search is not applied: every plan with no delay has the same
    makespan, and Alg. 1's maximal slackness is what absorbs stragglers until they are detected.
    """
    model = cost_model(morph, stages, n_microbatches, memory=family == "pipemorph")
    if family != "pipemorph":
        return build(family, model)
    delays = parse_plan_delays(morph.plan_delays_ms, stages - 1)
    if delays is not None:
        model = model.with_delays(delays)
    if morph.search and delays is not None:  # without known delays Alg. 1's max-min slackness stands
        return build(
            family,
            model,
            search=True,
            depth=transport_depth(morph),
            time_budget_ms=morph.search_budget_ms,
        )
    return build(family, model)


def attach_monitor(schedule: Any, family: str, morph: Any) -> None:
    """Give ``schedule`` a :class:`~titan_morph.monitor.live.LiveMonitor` (collective: all ranks).

    It measures every titan_morph schedule; it re-plans only PipeMorph with ``adapt``. Adapted
    plans are searched for the delegated (non-blocking) path and, per §4.2, without the memory
    cap (or under ``adapt_memory_budget``) when slow links are delegated (``auto``/``delegate``);
    with the default transport they keep ``memory_budget`` and its blocking link queue.
    """
    from titan_morph.monitor.detect import DetectRule
    from titan_morph.monitor.live import AdaptPolicy, LiveMonitor

    stage = schedule._stages[0]
    stages, n = stage.num_stages, schedule._n_microbatches
    delegated = morph.transport in ("auto", "delegate")
    if delegated:
        memory = morph.adapt_memory_budget or None
        depth = None
    else:
        memory, depth = morph.memory_budget or stages, morph.link_queue_depth
    policy = AdaptPolicy(
        enabled=morph.adapt and family == "pipemorph",
        memory=memory,
        search=morph.search,
        search_budget_ms=morph.search_budget_ms,
        depth=depth,
        delegate_slow_links=morph.transport == "auto",
    )
    rule = DetectRule(
        detect_steps=morph.detect_consecutive,
        recover_steps=morph.recover_consecutive,
        margin=morph.detect_margin,
        recover_ratio=morph.recover_ratio,
        floor_ms=morph.detect_min_ms,
    )
    fallback = stage_times(morph, stages) or ((1.0, 1.0, 1.0),) * stages
    schedule.monitor = LiveMonitor(
        stage=stage.stage_index,
        num_stages=stages,
        microbatches=n,
        group=stage.group if stage.group is not None else dist.group.WORLD,
        initial_plan=schedule.plan,
        fallback_times=fallback,
        rule=rule,
        policy=policy,
    )


def _morph_builder(family: str):
    def build_schedule(req: ScheduleRequest) -> _PipelineSchedule:
        from titan_morph.pipelining.schedule import MorphSchedule

        morph = req.job_config.morph
        plan = initial_plan(family, morph, req.stage.num_stages, req.n_microbatches)
        prepare_stage(req)
        schedule = MorphSchedule(
            [req.stage],
            req.n_microbatches,
            req.loss_fn,
            plan=plan,
            transport=make_transport(req, monitored=morph.monitor),
            scale_grads=False,
            planned_depth=transport_depth(morph),
            predict=stage_times(morph, req.stage.num_stages) is not None,
        )
        if morph.monitor and req.stage.num_stages > 1:
            attach_monitor(schedule, family, morph)
        return schedule

    build_schedule.__doc__ = f"titan_morph's {family} plan in MorphSchedule (one stage per rank)."
    return build_schedule


def register() -> None:
    """Register PipeMorph, ZBH1, ZBH2 and Morph1F1B (idempotent)."""
    for name, family in FAMILIES.items():
        register_schedule(name, _morph_builder(family), replace=True)
