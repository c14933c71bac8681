"""Search beyond the paper's planner (paper §4.2–§4.3, Alg. 1–4; §7.4 compares with the optimum).

Alg. 2 fixes x_i from Eq. 1 alone; that ignores W, heterogeneous stages and memory. The search
looks for the schedule with the lowest makespan (or, given delay samples, the lowest mean makespan:
:mod:`robust`) within the memory budget, with two workers that take turns:

* Knob worker (:mod:`knobs`): hill-climbing (first improvement, memoised, fixed neighbour
  order) over the knobs of the Alg. 3/4 generator (:func:`event_loop.run_generator`): per stage x_s
  (warm-up quota; non-increasing by Lemma 1, 1 <= x_s <= N), per rank the in-flight limit (its
  stages' warm-up <= limit_r <= min(M_r, N)) and the policy bits (:data:`event_loop.WAIT_W` ...; also
  :data:`event_loop.PAIR_W` with two stages per rank); with delay samples also which delay vector the
  generator plans against. Restarts from the next-best seed, then from seeded kicks of the best
  local optimum.
* Order worker (:mod:`tabu`): tabu search on fixed orders, as for job shops. The disjunctive
  graph has one chain per stage (its order) and message arcs weighted by the link delays; an op's
  head is its start and its tail the longest path from its start to the end
  (:func:`tabu.tail_state`). Moves are insertions inside the critical blocks (runs of
  back-to-back ops on a critical path: only reordering there can shorten it): a block's last op
  earlier, its first op later, an interior op to the block's first or last slot (e.g. a ``W``
  deferred past the block, which is how a stage's ``W``s move out of a memory-bound steady phase).
  Each step ranks the valid moves (F < I < W per microbatch, in-flight <= M_i) by a head/tail
  estimate of the new makespan, takes the best move whose op was not moved in the last few steps
  (unless it beats the best), evaluates it exactly and moves there, better or not. It restarts
  from a perturbation of its best after a run without progress, and from the global best when the
  knob worker improves it.

Every candidate is scored by :mod:`score`: timed by the planner's one timing routine
(:func:`timeline.time_codes`), or, under static non-blocking links with one delay vector, by the
generator's own timeline, which is the same (tested). Both time links with a transmit time
(``model.transmit``, or the static links' own) as the bandwidth model: one message at a time per
wire; the order moves' estimates count a message as latency + transmit without its queueing, and
every move is then timed exactly.

Seeds, always evaluated (so the result is never worse than any of them): every baseline builder
whose warm-up fits the memory budget (1F1B, ZB-H1, ZB-H2, GPipe; 1F1B with split backward times as
1F1B; ZB-V and DualPipeV with two stages per rank), the builder's own PipeMorph plan (Alg. 1/2 +
Alg. 3/4), the plain greedy (x = 1 with the limit at the budget) and the caller's warm-up vectors.
The knob worker then starts with Alg. 2, Alg. 1, the baselines' warm-ups clipped to the budget and
x = 1, each with limit = the rank's warm-up and with limit = the budget, and the same vectors with
uniform policies.

Two stages per rank (the V): the same workers on per-rank orders whose ops carry their stage
(:data:`.core.codes.CHUNK`); order moves never pass an op of the same microbatch on the rank (which
keeps the V's local hop and each stage's F < I < W), and deadlocking candidates score ``inf``.

Anytime, deterministic and monotone: an iteration is one evaluation (one generator run, or one
timing of fixed orders), the sequence of evaluations depends only on the inputs (every random
choice comes from a fixed-seed generator), never on the iteration count or on the clock, and the
result after k iterations is the best of the seeds and the first k evaluations. Hence the same
inputs and ``iterations`` give the same plan on every run and every rank, and more iterations never
give a worse plan. ``time_budget_ms`` only caps the wall time of the iterations (when it cuts the
search, ``SearchResult.capped`` is True and the plan depends on the machine's speed).

This module holds the seeds, the iteration budget and the driver that lets the workers take turns.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from titan_morph.pipelining.core.codes import Code
from titan_morph.pipelining.core.links import LinkModel
from titan_morph.pipelining.core.model import CostModel, Op, Plan, relabel_microbatches, validate_orders, warmup_counts
from titan_morph.pipelining.schedules.baselines import plain_codes, split_codes, warmup_for
from titan_morph.pipelining.schedules.event_loop import REFILL
from titan_morph.pipelining.schedules.slackness import adapted_warmup, fit_warmup, initial_warmup
from titan_morph.pipelining.search.knobs import UNIFORM_POLICIES, V_UNIFORM_POLICIES, knob_worker, needs
from titan_morph.pipelining.search.score import Knobs, Objective, SearchState
from titan_morph.pipelining.search.tabu import tabu_worker
from titan_morph.pipelining.timing.timeline import from_codes, to_codes

__all__ = [
    "Knobs",
    "SearchResult",
    "search",
    "search_detailed",
    "default_iterations",
    "iterations_for_ms",
    "WORK_PER_DEFAULT_SEARCH",
]

WORK_PER_DEFAULT_SEARCH = 200_000
"""Default work in scheduled ops: ``iterations`` = this / (ops per schedule), clipped to
[:data:`MIN_DEFAULT_ITERATIONS`, :data:`MAX_DEFAULT_ITERATIONS`] (S=8, N=32: 260 iterations)."""
MIN_DEFAULT_ITERATIONS = 8
MAX_DEFAULT_ITERATIONS = 1500
_PATTERN = (0, 1, 1, 1)
"""Turns of the knob worker (0) and the order worker (1) in the driver's cycle."""


def default_iterations(model: CostModel) -> int:
    """Iterations of a search with no explicit count: a fixed amount of work per schedule size."""
    ops = 3 * model.stages * model.microbatches
    return max(MIN_DEFAULT_ITERATIONS, min(MAX_DEFAULT_ITERATIONS, WORK_PER_DEFAULT_SEARCH // ops))


US_PER_OP_ITERATION = 0.85
"""Measured CPU cost of one iteration per scheduled op (µs; 2-core dev box, Python 3.11)."""


def iterations_for_ms(model: CostModel, budget_ms: float, scenarios: int = 1) -> int:
    """A deterministic iteration count that takes about ``budget_ms`` of CPU on the reference box
    (:data:`US_PER_OP_ITERATION`): for callers that think in time but need the same plan on every
    rank (pass it as ``iterations``, with no or a generous ``time_budget_ms``). An iteration of the
    robust search times its candidate under each of ``scenarios`` delay vectors: measured on 2-8
    stages and 8-32 microbatches, K vectors cost about K^0.75 times one (2.2-4.1x for 4, 3.7-8.8x
    for 16), and divide the count so."""
    if not budget_ms > 0:
        raise ValueError(f"budget_ms must be > 0 ms, got {budget_ms}")
    if scenarios < 1:
        raise ValueError(f"scenarios must be >= 1, got {scenarios}")
    ops = 3 * model.stages * model.microbatches * scenarios**0.75
    return max(1, int(budget_ms * 1000.0 / (US_PER_OP_ITERATION * ops)))


@dataclass(frozen=True)
class SearchResult:
    """The chosen plan, its score (makespan, or mean makespan over the scenarios) and the search's
    bookkeeping: per-seed scores, iterations run, whether the time cap cut them."""

    plan: Plan
    makespan: float
    knobs: Knobs | None  # the generator knobs of the best schedule; None when order moves made it
    seeds: dict[str, float] = field(default_factory=dict)
    iterations: int = 0
    capped: bool = False
    found_by: str = ""


def _normalise(model: CostModel, vec: Sequence[int], caps: Sequence[int]) -> tuple[int, ...]:
    """Clip x into [1, cap_i] and make it non-increasing (lower later stages, Lemma 1); in the V,
    fit every rank's warm-up into its cap (:func:`slackness.fit_warmup`)."""
    if model.stages_per_rank > 1:
        return fit_warmup(model, vec, caps)
    x = [max(1, min(int(v), c)) for v, c in zip(vec, caps)]
    for s in range(1, len(x)):
        x[s] = min(x[s], x[s - 1])
    return tuple(x)


def _knob_seeds(
    objective: Objective, extra: Sequence[Sequence[int]] | None
) -> tuple[list[tuple[str, Knobs]], list[tuple[str, Knobs]]]:
    """(always evaluated, evaluated first by the knob worker) generator seeds, by name."""

    model = objective.model
    S, N = model.stages, model.microbatches
    caps = objective.caps
    v = model.stages_per_rank > 1
    own = "pipemorph-v" if v else "pipemorph"
    must: list[tuple[str, Sequence[int], bool, int]] = []
    for plan, plan_model in enumerate(objective.plan_models):
        must.append((own + ("" if plan == 0 else f"@plan{plan}"), warmup_for(own, plan_model), False, plan))
    must.append(("greedy x=1 limit=M", [1] * S, True, 0))
    for k, vec in enumerate(extra or ()):
        if len(vec) != S:
            raise ValueError(f"seed {k} needs {S} warm-up counts (one per stage), got {len(vec)}")
        must.append((f"seed{k}", vec, False, 0))
    rest: list[tuple[str, Sequence[int], bool, int]] = []
    for plan, plan_model in enumerate(objective.plan_models):
        try:
            rest.append(("alg2" + ("" if plan == 0 else f"@plan{plan}"), adapted_warmup(plan_model), False, plan))
        except ValueError:
            pass
    rest.append(("alg1", initial_warmup(S, N, list(caps), stages_per_rank=model.stages_per_rank), False, 0))
    if v:
        rest.append(("zb-v x", [max(1, S - 1 - i) for i in range(S)], False, 0))
        rest.append(("dualpipe-v x", [S - i for i in range(S)], False, 0))
    else:
        rest.append(("zb-h1 x", [S - i for i in range(S)], False, 0))
        rest.append(("zb-h2 x", [2 * (S - i) - 1 for i in range(S)], False, 0))
    rest.append(("x=1", [1] * S, False, 0))
    rest += [(name + " limit=M", vec, True, plan) for name, vec, full, plan in rest + must if not full]
    seen: set[Knobs] = set()
    base = (_base_policy(model),) * model.ranks
    out: tuple[list[tuple[str, Knobs]], list[tuple[str, Knobs]]] = ([], [])
    for group, raw in zip(out, (must, rest)):
        for name, vec, full, plan in raw:
            x = _normalise(model, vec, caps)
            knobs = Knobs(x, caps if full else tuple(needs(x, objective.topo.stages)), base, plan)
            if knobs not in seen:
                seen.add(knobs)
                group.append((name, knobs))
    return out


def _base_policy(model: CostModel) -> int:
    """The policy of the builder's own plan: the paper's Alg. 3, with refill in the V (:mod:`baselines`)."""
    return 0 if model.stages_per_rank == 1 else REFILL


def _baseline_seeds(objective: Objective) -> list[tuple[str, list[list[Code]]]]:
    """The baseline builders' plans (under the planning delays) whose warm-up fits the budget."""
    out = []
    model = objective.plan_models[0]
    names = ("1f1b", "zb-h1", "zb-h2", "gpipe") if model.stages_per_rank == 1 else ("zb-v", "dualpipe-v")
    for name in names:
        try:
            _, codes, fused = plain_codes(name, model)
        except ValueError:  # the warm-up needs more than the memory budget
            continue
        out.append((name, split_codes(codes) if fused else codes))
    return out


def search_detailed(
    model: CostModel,
    *,
    links: LinkModel | None = None,
    depth: int | None = None,
    iterations: int | None = None,
    time_budget_ms: float | None = None,
    seeds: Sequence[Sequence[int]] | None = None,
    scenarios: Sequence[Sequence[float]] | None = None,
    plan_vectors: Sequence[Sequence[float]] | None = None,
    extra_orders: Sequence[tuple[str, Sequence[Sequence[Op]]]] | None = None,
) -> SearchResult:
    """:func:`search` with the score, the knobs, the per-seed scores and the iterations run.

    ``scenarios``: static per-link delay vectors; the score is then the mean makespan over them
    (non-blocking links; :mod:`robust`). ``plan_vectors``: the delay vectors the generator may plan
    against (default: ``model.delays`` only). ``extra_orders``: named fixed orders (split backward,
    within the memory budget) evaluated as seeds.
    """
    if iterations is not None and (isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0):
        raise ValueError(f"iterations must be an integer >= 0 (or None for the size-based default), got {iterations!r}")
    if time_budget_ms is not None and not time_budget_ms > 0:
        raise ValueError(f"time_budget_ms must be > 0 ms (or None for no cap), got {time_budget_ms}")
    if any(math.isinf(c) for c in model.delays):
        raise ValueError("search: a link delay is inf (link down); replan around the link first")
    if scenarios is not None and (links is not None or depth is not None):
        raise ValueError("search: scenarios are static non-blocking delay vectors; they exclude links= and depth=")
    t_start = time.perf_counter()
    budget = default_iterations(model) if iterations is None else iterations
    vectors = [model.delays] if plan_vectors is None else [tuple(float(c) for c in v) for v in plan_vectors]
    objective = Objective(model, links, depth, scenarios, vectors)
    state = SearchState(objective)

    seed_scores: dict[str, float] = {}
    extra: list[tuple[str, list[list[Code]]]] = []
    for name, orders in extra_orders or ():
        validate_orders(model, orders, runnable=False)
        extra.append((name, to_codes(orders, model)))
    for name, codes in _baseline_seeds(objective) + extra:
        score = objective.orders(codes)
        seed_scores[name] = score[0]
        state.offer(score, codes, None, name)
    must, rest = _knob_seeds(objective, seeds)
    for name, k in must:
        seed_scores[name] = state.eval_knobs(k, name)
    # The knob worker starts with the other seeds, then the uniform policies on all of them.
    base = [k for _, k in must] + [k for _, k in rest]
    fresh = [k for _, k in rest]
    uniform = UNIFORM_POLICIES if model.stages_per_rank == 1 else V_UNIFORM_POLICIES
    fresh += [Knobs(k.warmup, k.limit, (pol,) * model.ranks, k.plan) for pol in uniform[1:] for k in base]
    workers = [knob_worker(state, fresh, [k for _, k in must]), tabu_worker(state)]
    used = 0
    capped = False
    deadline = None if time_budget_ms is None else t_start + time_budget_ms / 1000.0
    turn = 0
    while used < budget and workers:
        if deadline is not None and time.perf_counter() > deadline:
            capped = True
            break
        worker = workers[_PATTERN[turn % len(_PATTERN)] % len(workers)]
        before = objective.evaluations
        try:
            next(worker)
        except StopIteration:
            workers.remove(worker)
            continue
        used += objective.evaluations - before
        turn += 1

    assert state.best_codes is not None
    # the tabu moves may reorder the last stage's forwards: rename the microbatches (same timing)
    orders = relabel_microbatches(model, from_codes(state.best_codes, model))
    validate_orders(model, orders)
    plan_model = model if scenarios is None else model.with_delays(vectors[0])
    name = "pipemorph" if model.stages_per_rank == 1 else "pipemorph-v"
    plan = Plan(schedule=name, warmup=warmup_counts(model, orders), orders=orders, model=plan_model)
    return SearchResult(plan, state.best[0], state.best_knobs, seed_scores, used, capped, state.best_by)


def search(model: CostModel, **options: Any) -> Plan:
    """Best plan (lowest makespan under ``links``/``depth``, timed by :func:`timeline.time_codes`)
    within ``model.memory``: :func:`search_detailed`'s plan, same options.

    ``iterations`` (default :func:`default_iterations`) fixes the work: the plan depends only on
    the inputs and this count, and more iterations never give a worse plan. ``time_budget_ms``
    caps the wall time (module docstring). ``seeds`` adds warm-up vectors to the built-in seeds.
    """
    return search_detailed(model, **options).plan
