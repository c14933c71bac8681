"""The plan a pipeline starts with and the monitor that re-plans it, from the ``[morph]`` config:
the cost model plans are made from (``[morph] stage_times_ms`` when given; else the
``[morph.synthetic]`` times when the testbed is on; else uniform unit times: the plan's *shape*,
Alg. 1, does not depend on times, and measured times replace them after ``profile_steps`` steps),
the initial plan (Alg. 1 under ``memory_budget``, Alg. 2 for ``plan_delays_ms``, + the search), the
monitor's policy, and the simulated step the DP x PP orchestrator places pipelines by. The same on
every rank: pure functions of the config (no torch)."""

from __future__ import annotations

from titan_morph.config import MorphSettings
from titan_morph.monitor.adapt import AdaptPolicy, Monitor
from titan_morph.monitor.replan import adapted_plan, search_iterations
from titan_morph.monitor.topology import PipelineCost
from titan_morph.pipelining.core.model import CostModel, Plan
from titan_morph.pipelining.schedules.baselines import zbv_memory
from titan_morph.pipelining.search.builders import V_SCHEDULES, build
from titan_morph.pipelining.timing.simulate import simulate

__all__ = [
    "FAMILIES",
    "V_FAMILIES",
    "adapt_policy",
    "cost_model",
    "default_memory",
    "initial_plan",
    "make_monitor",
    "pipeline_cost",
]

# TOML name -> builders.build name
FAMILIES = {"PipeMorph": "pipemorph", "ZBH1": "zb-h1", "ZBH2": "zb-h2", "Morph1F1B": "1f1b-iw"}
V_FAMILIES = {"PipeMorphV": "pipemorph-v"}
"""titan_morph's schedules with two stages per rank (TorchTitan's V-style stage split)."""


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
    samples = morph.plan_delay_samples(model.num_links)  # N(plan_delays_ms, plan_delays_std_ms)
    iterations = search_iterations(model, morph.search_iterations, morph.search_budget_ms, samples)
    depth = morph.depth if samples is None else None  # the expected makespan over samples: non-blocking
    return adapted_plan(model, search=True, depth=depth, iterations=iterations, samples=samples)


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
