"""Exact reference schedule for small instances (paper §4.3 / §7.4: "the optimum, obtained by solving
an MILP"), here as a CP-SAT model (OR-Tools; a dev/benchmark dependency imported lazily).

The closed-form lower bounds on any schedule's makespan, which need no solver, are in
:mod:`timing.bounds`; this model adds them as constraints (``use_bound``).

The problem is exactly what the simulator executes under static, non-blocking links:

* per stage ``s`` and microbatch ``m`` the ops ``F``, ``I``, ``W`` with the model's durations; a stage
  runs one op at a time, non-preemptively;
* ``F[s,m]`` starts >= end ``F[s-1,m]`` + c_{s-1}; ``I[s,m]`` starts >= end ``F[s,m]`` and, unless
  ``s`` is last, >= end ``I[s+1,m]`` + c_s; ``W[s,m]`` starts >= end ``I[s,m]``;
* memory: at any time at most M_s microbatches on stage ``s`` have ``F`` started and ``I`` not
  finished (a cumulative over the intervals [start F, end I));
* minimise the makespan (end of the last op; the iteration starts at t = 0).

Two stages per rank (the V, ``model.stages_per_rank = 2``): a *rank* runs one op at a time over
both of its stages, a hop waits for the delay of the link between its stages' ranks (none on the
last rank's local hop), and the memory bound M_r covers both stages of rank r.

Links are FIFO, but with a static delay per link and one sending rank per direction, deliveries
already arrive in issue order, so FIFO adds no constraint.

Bandwidth (``model.transmit``, :mod:`links`): a link with a transmit time tau is a no-overlap
resource per direction. Each message crossing it gets an interval of length tau that starts at or
after its producer ends; its consumer starts at or after the interval's end + latency; and the
wire sends in issue order: for every two messages on one wire, one Boolean orders both their
producers (on the one sending rank) and their intervals. Hence an optimum of this model is the best
makespan the simulator gives any orders under the same model (a brute force checks it on tiny
instances). Transmit 0 adds nothing: the delay-only model as before.

Integer time: every duration/delay is multiplied by ``scale`` (the smallest of 1, 2, 4, 5, 10, 20,
100, 1000 that makes them all integers; e.g. instances on a 0.5 ms grid get scale 2). If none does,
the times are scaled by 1000 and rounded *down*: the integer problem is then a relaxation, so its
bound is still a valid lower bound, and the reported makespan is the orders re-timed with the
true float durations (``rounded=True``).

Symmetry breaking (only constraints that cannot remove every optimum):

* microbatches are interchangeable, so relabelling them by their stage-0 forward order is free:
  ``F[0,m]`` ends before ``F[0,m+1]`` starts;
* ``W`` ops of one stage are identical and feed nothing, so swapping two of them whose order
  disagrees with their ``I`` order keeps every constraint: per stage, ``W`` follows ``I`` order.

Stronger rules (same ``F`` order on all stages, same ``I`` order on all stages, i.e. FIFO
pipelines) are available as ``fifo=True``; they are not proven safe, so they are off by default and
``tests/pipelining/test_exact.py`` compares both on tiny instances.

Warm start: by default the shortest baseline that fits the memory (:func:`baseline_hint`), never
the planner's plan, so that a reference for the planner neither starts from nor is capped by the
plan it judges (``ExactResult.hint`` names the start). A result that is not ``optimal`` is the best
schedule found, with the bound proven: a gap against it is a gap to the best known, not the optimum.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from titan_morph.pipelining.core.model import CostModel, Op, Order, validate_orders
from titan_morph.pipelining.schedules.baselines import build_plain, split_fused
from titan_morph.pipelining.timing.bounds import closed_form_bounds, hop_delays, lower_bound_ms
from titan_morph.pipelining.timing.simulate import simulate

_SCALES = (1, 2, 4, 5, 10, 20, 100, 1000)


@dataclass(frozen=True)
class ExactResult:
    """Best schedule CP-SAT found and the proven bound (ms). ``optimal`` = bound met."""

    makespan: float
    lower_bound: float
    optimal: bool
    orders: tuple[Order, ...]
    scale: int = 1
    rounded: bool = False
    wall_s: float = 0.0
    status: str = ""
    hint: str = "none"
    """The warm start: a baseline's name (:func:`baseline_hint`), ``"given"`` or ``"none"``."""

    @property
    def gap(self) -> float:
        """Relative gap between the schedule and the bound (0 when proven optimal)."""
        return 0.0 if self.makespan <= 0 else (self.makespan - self.lower_bound) / self.makespan


def _require_cp_model() -> None:
    """Fail early, naming the package, when OR-Tools is missing (it is imported lazily: the planner
    itself runs without it)."""
    try:
        from ortools.sat.python import cp_model  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "titan_morph.pipelining.reference.exact needs OR-Tools (CP-SAT): pip install ortools "
            "(it is a dev/benchmark dependency: `pip install titan_morph[dev]`)"
        ) from exc


def _pick_scale(values: Sequence[float]) -> tuple[int, bool]:
    for scale in _SCALES:
        if all(abs(v * scale - round(v * scale)) <= 1e-9 * max(1.0, abs(v * scale)) for v in values):
            return scale, False
    return _SCALES[-1], True


def _hint_times(model: CostModel, orders: Sequence[Sequence[Op]]) -> dict[tuple[int, str, int], tuple[float, float]]:
    """Start/end of every op of ``orders`` run as early as possible (:func:`simulate.simulate`),
    by (stage, kind, microbatch)."""
    result = simulate(model, orders)
    return {
        (t.stage if t.op.stage is None else t.op.stage, t.op.kind, t.op.mb): (t.start, t.end)
        for timings in result.timings
        for t in timings
    }


BASELINE_HINTS = ("1f1b-iw", "zb-h1", "zb-h2")
V_BASELINE_HINTS = ("zb-v", "dualpipe-v")


def baseline_hint(model: CostModel) -> tuple[str, tuple[Order, ...]] | None:
    """The default warm start: the shortest of the baselines (:data:`BASELINE_HINTS`, in the V
    :data:`V_BASELINE_HINTS`) whose orders fit the memory budget, as (name, orders); None when none
    fits (CP-SAT then starts from nothing, the serial schedule's horizon)."""
    best: tuple[float, str, tuple[Order, ...]] | None = None
    for name in V_BASELINE_HINTS if model.stages_per_rank > 1 else BASELINE_HINTS:
        try:
            orders = build_plain(name, model).orders
            validate_orders(model, orders)
        except ValueError:  # its warm-up or peak is over the memory budget
            continue
        span = simulate(model, orders).makespan
        if best is None or span < best[0]:
            best = (span, name, tuple(orders))
    return None if best is None else best[1:]


def optimal_makespan(
    model: CostModel,
    *,
    time_limit_s: float = 30.0,
    workers: int = 2,
    hint: Sequence[Sequence[Op]] | None = None,
    use_default_hint: bool = True,
    fifo: bool | None = None,
    seed: int = 0,
    use_bound: bool = True,
) -> ExactResult:
    """Minimum makespan of one iteration (split backward, static delays, non-blocking links).

    ``hint``: orders to warm-start from (default: :func:`baseline_hint`, never the planner's plan;
    ``use_default_hint=False``: none).
    ``fifo``: ``False`` solves the full model only; ``True`` only the FIFO-restricted one (its
    "optimal" is optimal among FIFO schedules); ``None`` (default) first solves the FIFO model with
    a third of the time (fast, usually the true optimum), then the full model warm-started from it,
    whose bound certifies optimality. Returns the best orders found and the full model's bound
    (``optimal`` is True when they meet). Reproducible for a given ``workers``/``seed`` only when
    no time limit is hit.
    ``use_bound``: add the closed-form bounds (:func:`lower_bound_ms`) as constraints, which speeds up
    CP-SAT's proof; ``False`` solves without them, so that the bounds can be checked against the
    optimum (a bound that were too large would otherwise cut off the optimum and go unnoticed).
    """
    _require_cp_model()
    if time_limit_s <= 0:
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s}")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if any(math.isinf(c) for c in model.delays):
        raise ValueError("exact: a link delay is inf (link down); no finite schedule exists")
    t_start = time.perf_counter()
    start = "none" if hint is None else "given"
    if hint is None and use_default_hint and (found := baseline_hint(model)) is not None:
        start, hint = found
    hint_orders = split_fused(hint) if hint is not None else None
    if fifo is not None:
        res = _solve(model, time_limit_s, workers, hint_orders, fifo, seed, use_bound)
        return replace(res, wall_s=time.perf_counter() - t_start, hint=start)
    try:
        first: ExactResult | None = _solve(model, time_limit_s / 3.0, workers, hint_orders, True, seed, use_bound)
    except NoScheduleFound:  # no start and no FIFO schedule in time: the full model starts from nothing
        first = None
    rest = max(0.1, time_limit_s - (time.perf_counter() - t_start))
    full = _solve(model, rest, workers, first.orders if first else None, False, seed, use_bound)
    best = full if first is None or full.makespan <= first.makespan else first
    bound = min(full.lower_bound, best.makespan)
    return ExactResult(
        makespan=best.makespan,
        lower_bound=bound,
        optimal=best.makespan <= bound + 1e-9,
        orders=best.orders,
        scale=full.scale,
        rounded=full.rounded,
        wall_s=time.perf_counter() - t_start,
        status=f"fifo:{first.status if first else 'none'} full:{full.status}",
        hint=start,
    )


class NoScheduleFound(RuntimeError):
    """CP-SAT ran out of time before any schedule, with no warm start to fall back on."""


def _solve(
    model: CostModel,
    time_limit_s: float,
    workers: int,
    hint_orders: tuple[Order, ...] | None,
    fifo: bool,
    seed: int,
    use_bound: bool = True,
) -> ExactResult:
    """One CP-SAT solve of the model described in the module docstring."""
    _require_cp_model()
    from ortools.sat.python import cp_model

    t_start = time.perf_counter()
    times = _integer_times(model, hint_orders)
    m = cp_model.CpModel()
    ops = _Ops(m, model, times)
    _add_precedences(m, model, times, ops)
    _add_memory(m, model, times, ops)
    if use_bound:  # closed-form bounds (lower_bound_ms), on the integer durations
        fwd, bwd, wgt = ([times.dur[(s, k)] for s in range(model.stages)] for k in _KINDS)
        for b_s in closed_form_bounds(model, fwd, bwd, wgt, times.delay, times.tau):
            m.add(ops.makespan >= math.ceil(b_s))
    _add_symmetry_breaking(m, model, ops, fifo)
    m.minimize(ops.makespan)
    if times.hint is not None and not times.rounded:
        for key, st in ops.start.items():
            m.add_hint(st, round(times.hint[key][0] * times.scale))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = int(seed)
    status = solver.solve(m)
    status_name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status != cp_model.UNKNOWN:
            # A serial schedule always exists within the horizon (the hint's makespan when there is
            # one), so "infeasible" means a constraint cuts off feasible schedules: never hide it.
            raise RuntimeError(f"exact: CP-SAT rejects every schedule (status {status_name}): the model is wrong")
        if hint_orders is None:
            raise NoScheduleFound(f"exact: CP-SAT found no schedule within {time_limit_s} s (status {status_name})")
        # Out of time before any solution (a loaded machine): the warm start is still a feasible
        # schedule; report it as such, with the closed-form bound (0 when the bounds are not to be
        # trusted), never as optimal.
        hint_end = max(end for _start, end in times.hint.values()) if times.hint else math.inf
        closed = lower_bound_ms(model) if use_bound else 0.0
        return ExactResult(
            makespan=hint_end,
            lower_bound=min(closed, hint_end),
            optimal=False,
            orders=hint_orders,
            scale=times.scale,
            rounded=times.rounded,
            wall_s=time.perf_counter() - t_start,
            status=f"{status_name}:hint",
        )
    orders_t = _solved_orders(model, solver.value, ops)
    bound = solver.best_objective_bound / times.scale
    if times.rounded:
        makespan = simulate(model, orders_t).makespan
    else:
        makespan = solver.objective_value / times.scale
    optimal = status == cp_model.OPTIMAL and not times.rounded or makespan <= bound + 1e-9
    return ExactResult(
        makespan=makespan,
        lower_bound=min(bound, makespan),
        optimal=bool(optimal),
        orders=orders_t,
        scale=times.scale,
        rounded=times.rounded,
        wall_s=time.perf_counter() - t_start,
        status=status_name,
    )


_KINDS = ("F", "I", "W")
_Key = tuple[int, str, int]  # (stage, kind, microbatch)


@dataclass(frozen=True)
class _IntegerTimes:
    """The instance on CP-SAT's integer clock (module docstring: ``scale``, ``rounded``): per
    (stage, kind) durations, per hop delays and transmit times, the warm start's op times (float
    ms) and the horizon."""

    scale: int
    rounded: bool
    dur: dict[tuple[int, str], int]
    delay: list[int]
    tau: list[int]
    hint: dict[_Key, tuple[float, float]] | None
    horizon: int


def _integer_times(model: CostModel, hint_orders: tuple[Order, ...] | None) -> _IntegerTimes:
    scale, rounded = _pick_scale([*model.fwd, *model.bwd, *model.wgt, *model.delays, *model.transmit])

    def q(v: float) -> int:
        return math.floor(v * scale + 1e-9) if rounded else round(v * scale)

    S, N = model.stages, model.microbatches
    dur = {(s, k): q(model.duration(s, k)) for s in range(S) for k in _KINDS}
    delay = [q(c) for c in hop_delays(model, model.delays)]  # per hop
    tau = [q(t) for t in hop_delays(model, model.transmit)]  # per hop; 0 = delay-only
    hint_times = _hint_times(model, hint_orders) if hint_orders is not None else None
    # Horizon: a fully serial schedule (one microbatch at a time) is always feasible.
    horizon = N * (sum(dur[(s, k)] for s in range(S) for k in _KINDS) + 2 * sum(delay) + 2 * sum(tau))
    if hint_times is not None and not rounded:
        horizon = min(horizon, round(max(e for _, e in hint_times.values()) * scale))
    return _IntegerTimes(scale, rounded, dur, delay, tau, hint_times, horizon)


class _Ops:
    """Every op's start variable and end expression, one fixed-size interval per op with no
    overlap per rank (a rank runs one op at a time over its stages), and the makespan variable."""

    def __init__(self, m: Any, model: CostModel, times: _IntegerTimes) -> None:
        horizon = times.horizon
        self.start: dict[_Key, Any] = {}
        self.end: dict[_Key, Any] = {}
        intervals: dict[int, list[Any]] = {r: [] for r in range(model.ranks)}
        for s in range(model.stages):
            for k in _KINDS:
                for b in range(model.microbatches):
                    st = m.new_int_var(0, horizon, f"s_{k}{b}@{s}")
                    iv = m.new_fixed_size_interval_var(st, times.dur[(s, k)], f"{k}{b}@{s}")
                    self.start[(s, k, b)] = st
                    self.end[(s, k, b)] = st + times.dur[(s, k)]
                    intervals[model.rank_of(s)].append(iv)
        self.makespan = m.new_int_var(0, horizon, "makespan")
        for r in range(model.ranks):
            m.add_no_overlap(intervals[r])


def _add_precedences(m: Any, model: CostModel, times: _IntegerTimes, ops: _Ops) -> None:
    """F after the previous stage's F and its hop, I after its own F and the next stage's I and its
    hop, W after its I, the makespan after every W; on links with a transmit time, each message's
    transmission interval, one at a time per wire in issue order (module docstring)."""
    start, end, delay, tau, horizon = ops.start, ops.end, times.delay, times.tau, times.horizon
    S, N = model.stages, model.microbatches
    route_f, route_b = model.routes()
    wires: dict[tuple[int, int], list[tuple[_Key, Any]]] = {}  # per wire, (producer op, transmission start)

    def sent(route: tuple[int, int] | None, producer: _Key, size: int) -> Any:
        """When the producer's message has left the wire (latency not included): its end, or on a
        link with a transmit time the end of its transmission interval, which starts after it."""
        if route is None or size <= 0:
            return end[producer]
        x = m.new_int_var(0, horizon, f"tx{producer}")
        m.add(x >= end[producer])
        wires.setdefault(route, []).append((producer, x))
        return x + size

    for s in range(S):
        for b in range(N):
            if s > 0:
                m.add(start[(s, "F", b)] >= sent(route_f[s - 1], (s - 1, "F", b), tau[s - 1]) + delay[s - 1])
            m.add(start[(s, "I", b)] >= end[(s, "F", b)])
            if s < S - 1:
                m.add(start[(s, "I", b)] >= sent(route_b[s + 1], (s + 1, "I", b), tau[s]) + delay[s])
            m.add(start[(s, "W", b)] >= end[(s, "I", b)])
            m.add(ops.makespan >= end[(s, "W", b)])
    for key, msgs in wires.items():  # one message at a time per wire, in issue order
        width = tau[model.link_hops(key[0])[0]]
        m.add_no_overlap([m.new_fixed_size_interval_var(x, width, f"wire{key}") for _, x in msgs])
        for i, (p, xp) in enumerate(msgs):
            for q_key, xq in msgs[i + 1 :]:
                first = m.new_bool_var(f"{p}<{q_key}@wire{key}")
                m.add(start[q_key] >= end[p]).only_enforce_if(first)
                m.add(xq >= xp + width).only_enforce_if(first)
                m.add(start[p] >= end[q_key]).only_enforce_if(~first)
                m.add(xp >= xq + width).only_enforce_if(~first)


def _add_memory(m: Any, model: CostModel, times: _IntegerTimes, ops: _Ops) -> None:
    """At most M_r microbatches of rank r between their F's start and their I's end (a cumulative)."""
    N = model.microbatches
    for r in range(model.ranks):
        cap = model.budget(r)
        own = model.rank_stages(r)
        if cap < N * len(own):
            live = []
            for s in own:
                for b in range(N):
                    size = m.new_int_var(times.dur[(s, "F")] + times.dur[(s, "I")], times.horizon, f"live{b}@{s}")
                    live.append(m.new_interval_var(ops.start[(s, "F", b)], size, ops.end[(s, "I", b)], f"mem{b}@{s}"))
            m.add_cumulative(live, [1] * len(live), cap)


def _add_symmetry_breaking(m: Any, model: CostModel, ops: _Ops, fifo: bool) -> None:
    """Stage 0's forwards in microbatch order; per stage, W in I order (and with ``fifo``, the same
    F order on every stage and one I order shared by all): see the module docstring."""
    start, end, N = ops.start, ops.end, model.microbatches
    for b in range(N - 1):
        m.add(start[(0, "F", b + 1)] >= end[(0, "F", b)])
    shared: dict[tuple[int, int], Any] = {}
    for s in range(model.stages):
        if fifo and s > 0:
            for b in range(N - 1):
                m.add(start[(s, "F", b + 1)] >= end[(s, "F", b)])
        for a in range(N):
            for b in range(a + 1, N):
                if fifo and (a, b) in shared:
                    before = shared[(a, b)]
                else:
                    before = m.new_bool_var(f"I{a}<I{b}@{s}")
                    shared[(a, b)] = before
                m.add(start[(s, "I", b)] >= end[(s, "I", a)]).only_enforce_if(before)
                m.add(start[(s, "I", a)] >= end[(s, "I", b)]).only_enforce_if(~before)
                m.add(start[(s, "W", b)] >= end[(s, "W", a)]).only_enforce_if(before)
                m.add(start[(s, "W", a)] >= end[(s, "W", b)]).only_enforce_if(~before)


def _solved_orders(model: CostModel, value: Callable[[Any], int], ops: _Ops) -> tuple[Order, ...]:
    """Per rank, its ops sorted by their solved start (ties: kind, stage, microbatch)."""
    named = model.stages_per_rank > 1
    orders = []
    for r in range(model.ranks):
        ranked = sorted(
            (value(ops.start[(s, k, b)]), _KINDS.index(k), s, b, Op(k, b, s if named else None))
            for s in model.rank_stages(r)
            for k in _KINDS
            for b in range(model.microbatches)
        )
        orders.append(tuple(op for *_, op in ranked))
    return tuple(orders)
