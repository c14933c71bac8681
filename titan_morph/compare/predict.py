"""The simulator's prediction for a variant's run ("simulated" column), from the run's own config.

Only where compute times are known (``[morph] stage_times_ms`` or the ``[morph.synthetic]``
testbed): the plan the variant runs — built exactly as the runtime builds it — executed by
``pipelining.timing.simulate`` under the same ``[morph.inject]`` link model, with the transport's queue
(default/auto: ``link_queue_depth`` messages in flight, §3.2; delegate: non-blocking, §5).
PipeMorph with ``adapt`` is predicted with the plan adaptation converges to: Alg. 2 for the
injected static delays, under the monitor's policy (slow links delegated with ``auto``: no memory
cap unless ``adapt_memory_budget``, non-blocking). Time-varying links are simulated step by step
(each step starting where the previous one ended, so without the host's gaps between steps: an
estimate); an adaptive variant under them has no offline prediction (its runtime's
``morph/predicted_ms`` is used). Link rates (``bandwidth_mbit``...) need the message size: the
synthetic testbed's ``message_kb``, or ``message_bytes`` from the caller (the runtime computes it
from the model); PipeMorph's initial plan then assumes their transmit times as the runtime's does.
"""

from __future__ import annotations

import math
import statistics

from titan_morph.compare.variants import Variant
from titan_morph.config import MorphSettings, Settings
from titan_morph.pipelining.core.links import LinkModel
from titan_morph.pipelining.core.model import Plan

__all__ = ["simulated_ms"]

_TORCH_FAMILIES = {"1F1B": "1f1b", "GPipe": "gpipe"}


def adapted(variant: Variant, morph: MorphSettings, delays: tuple[float, ...] | None) -> bool:
    """Whether the run's plan is the adapted one (PipeMorph re-planning for static delays)."""
    return variant.schedule == "PipeMorph" and bool(morph.adapt) and delays is not None and any(d > 0 for d in delays)


def _plan(
    variant: Variant,
    morph: MorphSettings,
    stages: int,
    n: int,
    delays: tuple[float, ...] | None,
    links: LinkModel | None = None,
) -> tuple[Plan, int | None]:
    """(plan, link-queue depth to simulate it with), as the runtime and its monitor build them
    (``links``: the run's link model, whose rates the initial plan may assume)."""
    from titan_morph.config.links import plan_transmit
    from titan_morph.integration.plans import FAMILIES, adapt_policy, cost_model, initial_plan
    from titan_morph.monitor.replan import adapted_plan, search_iterations
    from titan_morph.pipelining.search.builders import build

    if variant.torch_builtin:
        return build(_TORCH_FAMILIES[variant.schedule], cost_model(morph, stages, n, memory=False)), morph.depth
    family = FAMILIES[variant.schedule]
    if not adapted(variant, morph, delays):
        return initial_plan(family, morph, stages, n, transmit=plan_transmit(morph, links)), morph.depth
    # The monitor's policy: with slow links delegated (auto/delegate) adapted plans drop the memory
    # cap (or use adapt_memory_budget) and are planned for the non-blocking path.
    policy = adapt_policy(family, morph, stages)
    model = cost_model(morph, stages, n, memory=False).with_memory(policy.memory).with_delays(delays or ())
    iterations = search_iterations(model, policy.search_iterations, policy.search_budget_ms)
    return adapted_plan(model, search=policy.search, depth=policy.depth, iterations=iterations), policy.depth


def simulated_ms(
    settings: Settings, variant: Variant, skip: int, message_bytes: int | None = None
) -> tuple[float | None, str]:
    """(median simulated step makespan over steps > ``skip``, note); (None, why) when unavailable.
    ``message_bytes``: one inter-stage message's size where the configuration does not fix it."""
    from titan_morph.config.links import bandwidth_keys, configured_message_bytes, link_model
    from titan_morph.pipelining.core.links import LinkDownError, StaticDelays
    from titan_morph.pipelining.timing.simulate import simulate

    morph = settings.morph
    stages = settings.stages
    if stages < 2:
        return None, "no pipeline"
    if morph.inject.rank_links:
        return None, "slow rank pairs (DP x PP): the pipeline simulator does not model DP collectives"
    if morph.stage_times(stages) is None:
        return None, "compute times unknown (not the synthetic testbed, no stage_times_ms)"
    steps = settings.job.steps
    size = configured_message_bytes(settings) or message_bytes
    if size is None and bandwidth_keys(morph.inject) and morph.inject.mode != "none":
        return None, "link rates without a known message size (set [morph.synthetic] message_kb)"
    try:
        links = link_model(morph.inject, stages - 1, steps=steps, message_bytes=size)
    except ValueError as err:  # a trace with a rate column and no known message size
        return None, str(err)
    inject = morph.inject
    static = inject.mode in ("none", "static")
    delays = None
    if static:
        delays = (0.0,) * (stages - 1) if links is None else inject.delays_ms
    if variant.adapt and variant.schedule == "PipeMorph" and not static:
        return None, "adaptive under time-varying links: see the runtime's morph/predicted_ms"
    if delays is not None and any(math.isinf(d) for d in delays):
        return None, "a link is down"
    plan, depth = _plan(variant, morph, stages, settings.microbatches, delays, links)
    model = plan.model.with_delays((0.0,) * (stages - 1))
    if links is None:
        links = StaticDelays.zeros(stages - 1)
    values: list[float] = []
    down_note = ""
    t0 = 0.0
    # Static links: every step after warm-up is the same; one simulated step stands for them all.
    first = max(skip + 1, inject.start_step)
    measured_steps = range(first, first + 1) if static else range(1, steps + 1)
    try:
        for step in measured_steps:
            span = simulate(model, plan.orders, links=links, depth=depth, step=step, t0=t0).makespan
            t0 += span
            if step > skip:
                values.append(span)
    except LinkDownError as err:
        if static or not values:
            return None, f"link down: {err}"
        down_note = f"; until a link went down at step {step}"
    if not values:
        return None, "no steps after warm-up"
    note = "static links" if static else "time-varying links, step by step (no host gaps between steps)"
    return statistics.median(values), note + down_note
