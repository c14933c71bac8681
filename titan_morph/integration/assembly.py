"""From the ``[morph]`` config to the runtime objects of one pipeline stage.

A schedule builder (:mod:`.schedules`) gets a :class:`ScheduleRequest` and assembles, per rank:

* the cost model plans are made from: ``[morph] stage_times_ms`` when given; else the
  ``[morph.synthetic]`` times when the testbed is on; else uniform unit times (the plan's *shape*,
  Alg. 1, does not depend on times; measured times replace them after ``profile_steps`` steps);
* the initial plan: PipeMorph's Alg. 1 warm-up under ``memory_budget`` (Alg. 2 for
  ``plan_delays_ms`` when given, + the search when ``search``), or a baseline's fixed warm-up;
* the transport of ``[morph] transport`` with the ``[morph.inject]`` link emulator, on the
  pipeline's common clock (the world's, for DP x PP); its link model (:meth:`ScheduleRequest.links`,
  rates turned into transmit times for this pipeline's message size) is built once and shared by
  the emulator, the initial plan and the runtime's simulator;
* the testbed's padding (``[morph.synthetic]``: compute times, message size) and the monitor's policy;
* for DP x PP, the world-wide exchange and the topology monitor (:mod:`.hybrid`), with this
  pipeline's simulated step under link delays as the placement cost.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineSchedule

from titan_morph.comm.clock import CommonClock, sync_clock
from titan_morph.comm.transport import TorchTransport, Transport, warms_up_own_rank
from titan_morph.config import MorphSettings, Settings
from titan_morph.config.links import break_window, configured_message_bytes, link_model, plan_transmit
from titan_morph.integration.cpu import shared_gpu
from titan_morph.integration.hybrid import known_link_delays, lanes_group, make_exchange, pipeline_hosts, replica_split
from titan_morph.monitor.adapt import AdaptPolicy, Monitor
from titan_morph.monitor.replan import adapted_plan, search_iterations
from titan_morph.monitor.topology import PipelineCost
from titan_morph.pipelining.core.links import LinkModel
from titan_morph.pipelining.core.model import CostModel, Plan
from titan_morph.pipelining.schedules.baselines import zbv_memory
from titan_morph.pipelining.search.builders import V_SCHEDULES, build
from titan_morph.pipelining.timing.simulate import simulate
from titan_morph.runtime.exchange import StepExchange
from titan_morph.runtime.schedule import MorphSchedule
from titan_morph.runtime.testbed import DeviceClock, StageTimes, pad_stage_compute, pad_stage_messages

__all__ = [
    "FAMILIES",
    "ScheduleRequest",
    "adapt_policy",
    "close_transports",
    "cost_model",
    "initial_plan",
    "make_transport",
    "morph_builder",
    "prepare_stage",
    "torch_builder",
]

logger = logging.getLogger(__name__)
# Per-link group namespaces: module-wide so that every rank numbers them in the same construction order.
_link_groups = itertools.count()

# This process's transports: TorchTitan's trainer closes the schedule, not what it built, so they are kept
# here and closed by the trainer's close() while the process groups still exist.
_opened: list[Transport] = []

# TOML name -> builders.build name
FAMILIES = {"PipeMorph": "pipemorph", "ZBH1": "zb-h1", "ZBH2": "zb-h2", "Morph1F1B": "1f1b-iw"}
V_FAMILIES = {"PipeMorphV": "pipemorph-v"}
"""titan_morph's schedules with two stages per rank (TorchTitan's V-style stage split)."""


@dataclass
class ScheduleRequest:
    """Everything a schedule builder may need: this rank's stage(s) and the run's settings."""

    name: str
    """The schedule name as written in the config."""
    stage: PipelineStage
    """This rank's (first) stage (``stage.stage_index``, ``stage.num_stages``, ``stage.group``,
    ``stage.group_rank``)."""
    n_microbatches: int
    """N = local_batch_size / pipeline_parallel_microbatch_size."""
    loss_fn: Callable[..., Any] | None
    """TorchTitan's token-summed loss (the trainer rescales the reported loss)."""
    settings: Settings
    """The job's resolved configuration (``settings.morph``: the [morph] options)."""
    parallel_dims: Any = None
    """TorchTitan's ParallelDims (``get_mesh("pp")``)."""
    stages: list[PipelineStage] | None = None
    """All of this rank's stages when it runs several (TorchTitan's loop or V split); None: [stage]."""
    _links: tuple[LinkModel | None] | None = field(default=None, init=False, repr=False)

    @property
    def local_stages(self) -> list[PipelineStage]:
        """This rank's stages (one, or several for a multi-stage schedule)."""
        return list(self.stages) if self.stages else [self.stage]

    def links(self) -> LinkModel | None:
        """The ``[morph.inject]`` link model of this pipeline (None: nothing injected), built on the
        first call: transports name traffic by the link between adjacent ranks (a V's two legs share
        them); with ``rank_links`` the delays follow the hosts of this pipeline's ranks (a collective)."""
        if self._links is None:
            inject = self.settings.morph.inject
            ranks = self.stage.group_size
            hosts = pipeline_hosts(_group_of(self.stage)) if inject.rank_links else None
            steps = self.settings.job.steps
            self._links = (link_model(inject, ranks - 1, steps=steps, hosts=hosts, message_bytes=message_bytes(self)),)
        return self._links[0]


def message_bytes(req: ScheduleRequest) -> int | None:
    """Bytes of one message between stages (a microbatch's activations, and their gradients):
    ``[morph.synthetic] message_kb`` when set, else microbatch x seq_len x dim x the parameters'
    element size of the model (TorchTitan's llama3 args: ``dim``, ``max_seq_len`` = the training
    ``seq_len``); None for a model without those. Every rank computes the same value."""
    fixed = configured_message_bytes(req.settings)
    if fixed is not None:
        return fixed
    submod = req.stage.submod
    args = getattr(submod, "model_args", None)
    dim, seq = getattr(args, "dim", None), getattr(args, "max_seq_len", None)
    if not (isinstance(dim, int) and isinstance(seq, int)):
        return None
    param = next((p for p in submod.parameters() if p.is_floating_point()), None)
    return req.settings.job.microbatch_size * seq * dim * (4 if param is None else param.element_size())


def cost_model(
    morph: MorphSettings,
    stages: int,
    n_microbatches: int,
    *,
    memory: bool,
    times: tuple[tuple[float, float, float], ...] | None = None,
    stages_per_rank: int = 1,
) -> CostModel:
    """The cost model plans are made from (``memory`` applies ``[morph] memory_budget``; ``times``
    replaces the configured stage times, e.g. by measured ones; ``stages_per_rank = 2``: the V).
    A budget of 0 means the PP degree with one stage per rank, and what ZB-V holds in the V."""
    times = times or morph.stage_times(stages) or ((1.0, 1.0, 1.0),) * stages
    model = CostModel(
        stages,
        n_microbatches,
        tuple(t[0] for t in times),
        tuple(t[1] for t in times),
        tuple(t[2] for t in times),
        stages_per_rank=stages_per_rank,
    )
    return model.with_memory(default_memory(model, morph.memory_budget) if memory else None)


def default_memory(model: CostModel, budget: int) -> int | tuple[int, ...]:
    """``[morph] memory_budget`` for ``model``'s placement: itself when set, else the PP degree (one
    stage per rank) or what ZB-V holds per rank (the V), so that PipeMorph-V spends ZB-V's memory."""
    if budget:
        return budget
    return model.ranks if model.stages_per_rank == 1 else zbv_memory(model)


def initial_plan(
    family: str,
    morph: MorphSettings,
    stages: int,
    n_microbatches: int,
    times: tuple[tuple[float, float, float], ...] | None = None,
    transmit: tuple[float, ...] | None = None,
) -> Plan:
    """The plan a schedule starts with (same on every rank: a pure function of the config).

    PipeMorph (and PipeMorph-V, two stages per rank): Alg. 1 under ``memory_budget``; with
    ``plan_delays_ms``, Alg. 2 for those delays (and the transmit times of ``plan_transmit_ms``, else
    ``transmit``: the injected rates', :func:`~titan_morph.config.links.plan_transmit`), and with
    ``search`` the simulator-guided search (for the configured transport's link queue) on top, or
    with ``plan_delays_std_ms`` the plan with the lowest expected makespan over sampled delays.
    Without planned delays the search is not applied: every plan with no delay has the same
    makespan, and Alg. 1's maximal slackness absorbs stragglers until they are detected."""
    morph_family = family in ("pipemorph", "pipemorph-v")
    per_rank = 2 if family in V_SCHEDULES else 1
    model = cost_model(morph, stages, n_microbatches, memory=morph_family, times=times, stages_per_rank=per_rank)
    if not morph_family:
        return build(family, model)
    delays = morph.plan_delays(model.num_links)
    if delays is not None:
        model = model.with_delays(delays)
        transmit = morph.plan_transmit(model.num_links) or transmit  # given for real links, else injected
        if transmit is not None:
            model = model.with_transmit(transmit)
    if not (morph.search and delays is not None):  # without known delays Alg. 1's max-min slackness stands
        return build(family, model)
    iterations = search_iterations(model, morph.search_iterations, morph.search_budget_ms)
    samples = morph.plan_delay_samples(model.num_links)
    if samples is not None:  # plan for N(plan_delays_ms, plan_delays_std_ms): the expected makespan
        return build(family, model, search=True, samples=samples, iterations=iterations)
    return build(family, model, search=True, depth=morph.depth, iterations=iterations)


class _Where(TypedDict):
    """Where a transport sits: this rank's place in the pipeline and the pipeline's group."""

    stage: int
    num_stages: int
    group: dist.ProcessGroup | None


def _group_of(stage: PipelineStage) -> dist.ProcessGroup:
    """The stage's pipeline group (the world's when it has none)."""
    group = stage.group or dist.group.WORLD
    if group is None:
        raise RuntimeError("torch.distributed is not initialised: a pipeline stage needs a process group")
    return group


def make_transport(req: ScheduleRequest, clock: CommonClock, *, monitored: bool = False) -> Transport | None:
    """:func:`_transport` for this rank, remembered so that :func:`close_transports` closes it."""
    transport = _transport(req, clock, monitored=monitored)
    if transport is not None:
        _opened.append(transport)
    return transport


def close_transports(*, drain: bool) -> None:
    """Close this process's transports (their threads and delegate processes) while the process
    groups still exist: called at the end of training, before TorchTitan destroys them. ``drain``:
    let queued sends leave first (a finished run), else abandon them (a failed one)."""
    while _opened:
        _opened.pop().close(drain=drain)


def _transport(req: ScheduleRequest, clock: CommonClock, *, monitored: bool = False) -> Transport | None:
    """The transport of ``[morph] transport`` for this rank, on ``clock``; None for plain
    torch.distributed (no injection, default transport, nothing to record).

    ``default``: torch P2P (on one process group per link over ``[morph] data_ifname`` when that
    is set), through the ``[morph.inject]`` link emulator when it is on (a send
    blocks once ``link_queue_depth`` messages are in flight: NCCL's head-of-line blocking, §3.2),
    else recording message stamps for the monitor when ``monitored``. ``delegate``: the delegated
    data plane (§5), which applies the injected delays inside its delegates and never blocks the
    training thread on the wire; a failed delegate stops the job with one error. ``auto``: the
    default path on one process group per link (so one link can fail and be re-made alone), moved
    per link to the delegates when a link is slow or its default path fails (and back when probes
    succeed again), and back from the delegates when one of them dies (§5.3).

    Ranks sharing a GPU (:func:`~titan_morph.integration.cpu.shared_gpu`: Gloo, without point-to-point
    of device memory): the delegated path carries every link, ``auto``'s delegate side; ``default``
    moves its bytes over it, under the link emulator (and its blocking queue) when injecting.

    Every wait is bounded by TorchTitan's ``[comm]`` timeouts (start-up, then training).
    """
    settings = req.settings
    morph = settings.morph
    stage = req.stage
    ranks = stage.group_size
    links = req.links()
    timeouts = settings.timeouts
    device = stage.device
    where: _Where = {"stage": stage.group_rank, "num_stages": ranks, "group": stage.group}
    from titan_morph.comm.delegate.transport import DelegateTransport  # spawns processes: loaded only when used

    def delegates(strict: bool, delays: LinkModel | None = links) -> DelegateTransport:
        """The delegated path (§5); ``strict``: a failed delegate stops the job (no failover behind);
        ``delays``: the link model its delegates apply (None: the emulator above applies it)."""
        return DelegateTransport(
            **where,
            links=delays,
            delegates_per_link=morph.delegates_per_link,
            epoch=clock.epoch,
            timeouts=timeouts,
            strict=strict,
            device=device,
            host_interfaces=morph.host_interfaces,
        )

    if shared_gpu() is not None and morph.transport != "delegate":
        return _shared_gpu_transport(req, clock, where, delegates)
    if morph.transport == "delegate":  # all PP traffic via delegates; they apply the injected delays
        return delegates(strict=True)
    primary: Transport = TorchTransport(clock.epoch)
    pairs = None
    if morph.transport == "auto" or morph.data_ifname:  # per-link groups: on their own NIC, or to fail alone
        from titan_morph.comm.pairs import BreakPlan, LinkGroups, LinkTransport

        window = break_window(morph.inject, ranks - 1)
        group_name = _group_of(stage).group_name
        pairs = LinkGroups(
            stage=stage.group_rank,
            num_stages=ranks,
            namespace=f"{group_name}/{next(_link_groups)}",
            backend="nccl" if device is not None and torch.device(device).type == "cuda" else "gloo",
            timeouts=timeouts,
            device=device,
            breaks=BreakPlan(*window) if window is not None else None,
            interface=morph.data_ifname,
        )
        primary = LinkTransport(pairs, group=stage.group, epoch=clock.epoch)
    if links is not None:
        from titan_morph.comm.emulator.transport import EmulatedTransport

        primary = EmulatedTransport(
            primary,
            links,
            **where,
            depth=morph.link_queue_depth,
            epoch=clock.epoch,
            timeouts=timeouts,
        )
    elif monitored:  # the real network: message stamps for the monitor
        from titan_morph.comm.recorded import RecordedTransport

        primary = RecordedTransport(primary, **where, epoch=clock.epoch)
    elif morph.transport == "default" and pairs is None:
        return None
    if morph.transport == "default":
        return primary
    from titan_morph.comm.failover.transport import FailoverTransport

    return FailoverTransport(
        primary,
        delegates(strict=False),
        **where,
        pairs=pairs,
        timeouts=timeouts,
        recover_probes=morph.recover_consecutive,
    )


def _shared_gpu_transport(
    req: ScheduleRequest, clock: CommonClock, where: _Where, delegates: Callable[..., Transport]
) -> Transport:
    """The data plane of ranks that share a GPU (see :func:`_transport`), logged once per rank."""
    morph, links, transport = req.settings.morph, req.links(), req.settings.morph.transport
    emulated = transport == "default" and links is not None
    how = "on its delegate side" if transport == "auto" else "over the delegated path"
    extra = f", under the link emulator (link_queue_depth {morph.link_queue_depth})" if emulated else ""
    logger.warning(f"titan_morph: ranks share a GPU: transport {transport!r} runs every link {how}{extra}")
    if not emulated or links is None:
        return delegates(strict=True)
    from titan_morph.comm.emulator.transport import EmulatedTransport

    wire = delegates(strict=True, delays=None)
    return EmulatedTransport(
        wire, links, **where, depth=morph.link_queue_depth, epoch=clock.epoch, timeouts=req.settings.timeouts
    )


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


def adapt_policy(
    family: str, morph: MorphSettings, stages: int, memory_default: int | tuple[int, ...] | None = None
) -> AdaptPolicy:
    """What the monitor's decisions may change: it re-plans only PipeMorph with ``adapt``. Adapted
    plans are searched for the delegated (non-blocking) path and, per §4.2, without the memory cap
    (or under ``adapt_memory_budget``) when slow links are delegated (``auto``/``delegate``); with
    the default transport they keep ``memory_budget`` and its blocking link queue."""
    memory: int | tuple[int, ...] | None
    depth: int | None
    if morph.transport in ("auto", "delegate"):
        memory, depth = morph.adapt_memory_budget or None, None
    else:
        memory, depth = morph.memory_budget or memory_default or stages, morph.link_queue_depth
    return AdaptPolicy(
        enabled=morph.adapt and family in ("pipemorph", "pipemorph-v"),
        memory=memory,
        search=morph.search,
        search_iterations=morph.search_iterations,
        search_budget_ms=morph.search_budget_ms,
        samples=morph.plan_samples,
        depth=depth,
        delegate_slow_links=morph.transport == "auto",
    )


def pipeline_cost(family: str, morph: MorphSettings, plan: Plan) -> PipelineCost:
    """This pipeline's simulated step (ms) when its links carry given delays: the plan it would run
    then (Alg. 2 for them when PipeMorph adapts, else ``plan``'s fixed orders) on its transport. The
    orchestrator's placement cost, the PP links' slackness included."""
    policy = adapt_policy(family, morph, plan.model.stages)

    def cost(delays: tuple[float, ...]) -> float:
        model = plan.model.with_delays(delays)
        if policy.enabled and any(delays):
            adapted = adapted_plan(model.with_memory(policy.memory), search=False, depth=policy.depth, iterations=0)
            return simulate(model, adapted.orders, depth=policy.depth).makespan
        return simulate(model, plan.orders, depth=morph.depth).makespan

    return cost


def make_monitor(
    family: str,
    morph: MorphSettings,
    plan: Plan,
    stages: int,
    n_microbatches: int,
    transmit: tuple[float, ...] | None = None,
) -> Monitor:
    """The monitor of a titan_morph schedule (:func:`adapt_policy`): it measures every one. When the
    stage times are unknown, the initial plan is rebuilt from the times measured over the first
    ``profile_steps`` steps (with the initial plan's ``transmit`` times); for another N (a DP
    replica's share changed) the initial plan is made for that N."""
    policy = adapt_policy(family, morph, stages, plan.model.memory)
    rule = morph.detect_rule()
    known = morph.stage_times(stages)
    planner = None
    if known is None and family in ("pipemorph", "pipemorph-v") and morph.plan_delays(plan.model.num_links):

        def planner(measured: CostModel) -> Plan:
            times = tuple(zip(measured.fwd, measured.bwd, measured.wgt))
            return initial_plan(family, morph, stages, measured.microbatches, times, transmit)

    return Monitor(
        num_stages=stages,
        microbatches=n_microbatches,
        initial_plan=plan,
        fallback_times=known or ((1.0, 1.0, 1.0),) * stages,
        rule=rule,
        policy=policy,
        initial_planner=planner,
        profile_steps=morph.profile_steps,
        stages_per_rank=plan.model.stages_per_rank,
        plan_for=lambda n: initial_plan(family, morph, stages, n, transmit=transmit),
    )


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
            group, per_rank = _group_of(req.stage), plan.model.stages_per_rank
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
