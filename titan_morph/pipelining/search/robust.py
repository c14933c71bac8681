"""Plans for random link delays: minimise the expected makespan over sampled delay vectors.

The paper plans for one delay vector (Alg. 2), but stragglers vary from step to step (§7.2,
Fig. 18; Table 3). Given K per-link delay vectors (drawn from a distribution with
:func:`sample_delays`, or taken from a trace or from the monitor's recent per-link measurements),
:func:`robust_plan` returns the schedule with the lowest mean makespan over those K vectors, each
candidate timed under the *same* vectors (common random numbers, so differences between candidates
are not sampling noise).

How: the search (:mod:`driver`) with its score replaced by the sample mean, and with one more knob,
the delay vector the Alg. 3/4 generator plans against: the sample mean plus k standard deviations
per link, k in :data:`QUANTILES` (planning for a little more than the mean delay buys slackness
that absorbs the larger samples). Always evaluated, so the result is never worse on the samples
than any of them: the plan the search finds for the mean vector alone (same iterations), and the
builder's PipeMorph plan (Alg. 1/2 + Alg. 3/4) for each of those fixed vectors.

Pure and deterministic: the same model, samples and iterations give the same plan on every rank.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from titan_morph.pipelining.core.model import CostModel, Op, Plan
from titan_morph.pipelining.schedules.baselines import build_plain, schedule_key
from titan_morph.pipelining.search.driver import MIN_DEFAULT_ITERATIONS, default_iterations, search_detailed
from titan_morph.pipelining.timing.timeline import time_codes, to_codes

__all__ = ["QUANTILES", "RobustResult", "sample_delays", "expected_makespan", "robust_plan", "robust_search"]

QUANTILES = (0.0, 0.5, 1.0, 1.5, 2.0)
"""Planning vectors tried by the generator: per-link sample mean + k · sample std."""


def sample_delays(
    mean: float | Sequence[float],
    std: float | Sequence[float],
    *,
    links: int,
    samples: int,
    seed: int = 0,
) -> tuple[tuple[float, ...], ...]:
    """``samples`` per-link delay vectors, link i ~ N(mean_i, std_i) ms clipped at 0.

    ``mean``/``std``: one value for every link or one per link (ms, finite, >= 0). Deterministic
    for ``seed`` (the same vectors on every rank and every run).
    """
    if not isinstance(links, int) or links < 0:
        raise ValueError(f"links must be an integer >= 0, got {links!r}")
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise ValueError(f"samples must be an integer >= 1 delay vector, got {samples!r}")
    means = _per_link("mean", mean, links)
    stds = _per_link("std", std, links)
    rng = random.Random(f"titan_morph.robust:{seed}")
    return tuple(tuple(max(0.0, rng.gauss(m, s)) for m, s in zip(means, stds)) for _ in range(samples))


def _per_link(name: str, value: float | Sequence[float], links: int) -> tuple[float, ...]:
    from titan_morph.pipelining.core.values import parse_list

    values = parse_list(value, float, name=name, count=links, low=0.0)
    if len(values) != links:
        raise ValueError(f"{name} needs 1 or {links} values (one per link), got {len(values)}")
    return values


def _check_samples(model: CostModel, samples: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    links = model.num_links
    out = []
    for k, vec in enumerate(samples):
        row = tuple(float(v) for v in vec)
        if len(row) != links:
            raise ValueError(f"sample {k} needs {links} delays (one per link), got {len(row)}")
        for v in row:
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(
                    f"sample {k}: delays must be finite and >= 0 ms (no plan crosses a down link), got {v}"
                )
        out.append(row)
    if not out:
        raise ValueError("samples must hold at least one delay vector")
    return tuple(out)


def expected_makespan(model: CostModel, orders: Sequence[Sequence[Op]], samples: Sequence[Sequence[float]]) -> float:
    """Mean makespan of fixed ``orders`` over the delay vectors ``samples`` (non-blocking links)."""
    from titan_morph.pipelining.timing.simulate import makespan

    vectors = _check_samples(model, samples)
    makespan(model, orders)  # checks the orders (each op once, F < I < W, no deadlock)
    codes = to_codes(orders, model)
    return sum(time_codes(model, codes, delays=(v, v)).makespan for v in vectors) / len(vectors)


@dataclass(frozen=True)
class RobustResult:
    """The chosen plan, its expected makespan over the samples, and what it was compared with:
    ``fixed`` maps each fixed-vector plan (``"mean (search)"``, ``"mean+1.0std"`` ...) to its
    expected makespan over the same samples."""

    plan: Plan
    expected_makespan: float
    fixed: dict[str, float] = field(default_factory=dict)
    iterations: int = 0
    capped: bool = False


def planning_vectors(samples: Sequence[Sequence[float]]) -> list[tuple[float, ...]]:
    """Per-link sample mean + k · sample std for k in :data:`QUANTILES` (the first is the mean)."""
    links = len(samples[0])
    cols = [[vec[i] for vec in samples] for i in range(links)]
    means = [statistics.fmean(c) for c in cols]
    stds = [statistics.pstdev(c) if len(c) > 1 else 0.0 for c in cols]
    out: list[tuple[float, ...]] = []
    for k in QUANTILES:
        vec = tuple(round(m + k * s, 9) for m, s in zip(means, stds))
        if vec not in out:
            out.append(vec)
    return out


def robust_search(
    model: CostModel,
    samples: Sequence[Sequence[float]],
    *,
    iterations: int | None = None,
    time_budget_ms: float | None = None,
    seeds: Sequence[Sequence[int]] | None = None,
    schedule: str | None = None,
) -> RobustResult:
    """:func:`robust_plan` with the expected makespan and the fixed-vector plans it beat."""

    builder = _morph_builder(model, schedule)
    vectors = _check_samples(model, samples)
    plan_vectors = planning_vectors(vectors)
    mean_model = model.with_delays(plan_vectors[0])
    budget = default_iterations(model) if iterations is None else iterations
    # Each candidate of the sample search is timed K times: by default it gets ~4/K of the work.
    sample_budget = max(MIN_DEFAULT_ITERATIONS, budget * 4 // len(vectors)) if iterations is None else iterations
    # The plan for the mean alone (the search under one fixed vector), scored on the samples.
    for_mean = search_detailed(mean_model, iterations=budget, time_budget_ms=time_budget_ms, seeds=seeds)
    fixed = {"mean (search)": expected_makespan(model, for_mean.plan.orders, vectors)}
    for k, vec in zip(QUANTILES, plan_vectors):
        plan = build_plain(builder, model.with_delays(vec))
        fixed[f"mean+{k:g}std (Alg. 2)"] = expected_makespan(model, plan.orders, vectors)
    res = search_detailed(
        mean_model,
        iterations=sample_budget,
        time_budget_ms=time_budget_ms,
        seeds=seeds,
        scenarios=vectors,
        plan_vectors=plan_vectors,
        extra_orders=[("mean (search)", for_mean.plan.orders)],
    )
    return RobustResult(
        res.plan, res.makespan, fixed, for_mean.iterations + res.iterations, for_mean.capped or res.capped
    )


def _morph_builder(model: CostModel, schedule: str | None) -> str:
    """PipeMorph's builder for ``model``'s placement (pipemorph, or pipemorph-v in the V): the only
    schedules that plan for delays, hence for samples of them."""
    name = "pipemorph-v" if model.stages_per_rank == 2 else "pipemorph"
    if schedule is not None and schedule_key(schedule) != name:
        raise ValueError(
            f"planning for sampled delays needs PipeMorph's planner: schedule {schedule!r} cannot,"
            f" choose {name!r} (stages_per_rank = {model.stages_per_rank})"
        )
    return name


def robust_plan(model: CostModel, samples: Sequence[Sequence[float]], **options: Any) -> Plan:
    """The plan with the lowest mean makespan over the per-link delay vectors ``samples``.

    Contract (the runtime calls this between steps, on every rank):

    * ``model``: stages, microbatches, compute times and memory budget; its ``delays`` are ignored.
    * ``samples[k][i]``: delay (ms, finite, >= 0) of link i in scenario k, e.g. from
      :func:`sample_delays`, a trace, or the monitor's recent per-link measurements (the k-th
      recent value of every link). Each vector is static for one whole iteration and the transport
      is non-blocking (delegated, §5).
    * ``options`` (:func:`robust_search`): ``iterations`` fixes the work of each of the two
      searches (the plan for the mean vector, then the plan for the samples). Default:
      :func:`driver.default_iterations` for the first and 4/K of it (at least
      :data:`driver.MIN_DEFAULT_ITERATIONS`) for the second, whose candidates are each timed K
      times. ``time_budget_ms`` caps each search (a cut search depends on the
      machine's speed, see :mod:`driver`); ``seeds`` adds warm-up vectors; ``schedule`` (default:
      PipeMorph's builder for the model's placement, pipemorph or pipemorph-v) is checked to be it.
    * Result: the same plan on every rank for the same inputs; its mean makespan over ``samples``
      is <= that of the plan searched for the mean vector and of the PipeMorph builder's plan for
      every vector mean + k·std (k in :data:`QUANTILES`). ``plan.model`` carries the mean delays.
    """
    return robust_search(model, samples, **options).plan
