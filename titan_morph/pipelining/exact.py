"""Exact reference schedule for small instances (paper §4.3 / §7.4: "the optimum, obtained by solving
an MILP"), here as a CP-SAT model (OR-Tools; a dev/benchmark dependency imported lazily).

It also holds closed-form lower bounds on any schedule's makespan, which need no solver:
:func:`lower_bound_ms` (static delays) and :func:`lower_bound_under` (one step under time-varying
links, reported by the runtime as ``morph/bound_ms``).

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
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .builders import split_fused
from .links import LinkModel, StaticDelays
from .model import CostModel, Op, Order, validate_orders
from .simulate import simulate

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
            "titan_morph.pipelining.exact needs OR-Tools (CP-SAT): pip install ortools "
            "(it is a dev/benchmark dependency: `pip install titan_morph[dev]`)"
        ) from exc


def _stage_bounds(
    stages: int,
    microbatches: int,
    fwd: Sequence[float],
    bwd: Sequence[float],
    wgt: Sequence[float],
    delays: Sequence[float],
    caps: Sequence[int],
) -> list[float]:
    """Valid lower bounds on the makespan, one per stage (see :func:`lower_bound_ms`)."""
    S, N = stages, microbatches
    tf, tb, tw, c = fwd, bwd, wgt, delays
    out = []
    for s in range(S):
        head = sum(tf[j] + c[j] for j in range(s))  # earliest start of any op on s
        rt = sum(tf[j] + tb[j] + 2 * c[j - 1] for j in range(s + 1, S))  # F end on s -> its I ready
        chain = sum(c[j] + tb[j] for j in range(s)) + tw[0]  # after the last I on s
        k = max(1, min(caps[s], N))
        # (a) Before the first I only forwards run (at most k); the rest follows it.
        work = min(
            head + max(tf[s] + rt, f * tf[s]) + (N - f) * tf[s] + N * tb[s] + max(N * tw[s], chain)
            for f in range(1, k + 1)
        )
        # (b) Memory waves: the (j+k)-th F starts >= the j-th F start + F + rt + I (pigeonhole).
        period = tf[s] + rt + tb[s]
        waves = head + ((N - 1) // k + 1) * period + chain
        out.append(max(work, waves))
    return out


def _rank_bounds(
    model: CostModel, fwd: Sequence[float], bwd: Sequence[float], wgt: Sequence[float], hop: Sequence[float]
) -> list[float]:
    """Valid lower bounds with several stages per rank (see :func:`lower_bound_ms`): per rank, the
    earliest start of its first stage plus all of its work; and one microbatch's round trip."""
    n, last = model.microbatches, model.stages - 1
    head = [sum(fwd[j] + hop[j] for j in range(s)) for s in range(model.stages)]
    out = []
    for r in range(model.ranks):
        own = model.rank_stages(r)
        out.append(min(head[q] for q in own) + n * sum(fwd[q] + bwd[q] + wgt[q] for q in own))
    out.append(head[last] + fwd[last] + sum(bwd[s] + hop[s - 1] for s in range(1, last + 1)) + bwd[0] + wgt[0])
    return out


_Times = tuple[Sequence[float], Sequence[float], Sequence[float]]


def _link_bounds(model: CostModel, times: _Times, hop_c: Sequence[float], hop_tau: Sequence[float]) -> list[float]:
    """Valid lower bounds from each wire's load (bandwidth model): a wire sends its K messages one
    at a time, so the last one finishes >= the earliest any of them can be produced + K·tau; then
    its latency and the least work that follows a message of that wire until the iteration ends.
    ``times``: F, B and W per stage."""
    fwd, bwd, wgt = times
    last = model.stages - 1
    hop = [c + t for c, t in zip(hop_c, hop_tau)]  # the least a message of hop s takes
    head = [0.0] * model.stages  # earliest start of F on stage s
    for s in range(1, model.stages):
        head[s] = head[s - 1] + fwd[s - 1] + hop[s - 1]
    back = head[last] + fwd[last]  # earliest end of I on stage s, from the last stage down
    i_end = [0.0] * model.stages
    for s in range(last, -1, -1):
        back += bwd[s]
        i_end[s] = back
        if s > 0:
            back += hop[s - 1]
    all_back = sum(bwd) + sum(hop) + wgt[0]  # the I chain of a microbatch and its W on stage 0
    wires: dict[tuple[int, int], list[tuple[float, float, float]]] = {}  # (earliest, tail, tau)
    route_f, route_b = model.routes()
    for s in range(model.stages):
        rf, rb = route_f[s], route_b[s]
        if rf is not None and hop_tau[s] > 0:
            rest = sum(fwd[s + 1 :]) + sum(hop[s + 1 : last]) + all_back
            wires.setdefault(rf, []).append((head[s] + fwd[s], hop_c[s] + rest, hop_tau[s]))
        if rb is not None and hop_tau[s - 1] > 0:
            rest = sum(bwd[:s]) + sum(hop[: s - 1]) + wgt[0]
            wires.setdefault(rb, []).append((i_end[s], hop_c[s - 1] + rest, hop_tau[s - 1]))
    n = model.microbatches
    return [
        min(e for e, _, _ in msgs) + n * sum(t for _, _, t in msgs) + min(tail for _, tail, _ in msgs)
        for msgs in wires.values()
    ]


def lower_bound_ms(model: CostModel) -> float:
    """A closed-form lower bound on any schedule's makespan (no solver needed).

    Per stage s, with head_s = Σ_{j<s}(t^F_j + c_j), RT_s = Σ_{j>s}(t^F_j + t^B_j + 2c_{j−1}) (a
    forward's round trip until its I can start on s), chain_s = Σ_{j<s}(c_j + t^B_j) + t^W_0 and
    k = min(M_s, N):
    (a) the first I on s starts >= head_s + t^F_s + RT_s and only f <= k forwards run before it;
        after it the stage still runs (N − f) F, N I and N W, and the last I is followed by
        max(N·t^W_s, chain_s): min over f of head_s + max(t^F_s + RT_s, f·t^F_s) + (N − f)t^F_s
        + N·t^B_s + max(N·t^W_s, chain_s);
    (b) memory waves: when the (j+k)-th F starts, at least j I's have ended, one of a microbatch
        whose F was j-th or later, so σ_{j+k} >= σ_j + t^F_s + RT_s + t^B_s; hence
        head_s + (⌊(N−1)/k⌋ + 1)(t^F_s + RT_s + t^B_s) + chain_s.
    The exact model adds these as constraints (they help CP-SAT's proof on memory-tight cases)
    unless ``optimal_makespan(..., use_bound=False)``, which the tests use to check them.
    With several stages per rank the bound is weaker: per rank, the earliest start of its first
    stage plus all of its work, and one microbatch's round trip through every stage and link.
    Bandwidth: every c_j above becomes c_j + tau_j (a message takes at least both), and each wire's
    load is a bound too (:func:`_link_bounds`: a link's transmit time per step bounds the step).
    """
    hop_c = _hop_delays(model, model.delays)
    hop_tau = _hop_delays(model, model.transmit)
    return max(_all_bounds(model, model.fwd, model.bwd, model.wgt, hop_c, hop_tau))


def _all_bounds(
    model: CostModel,
    fwd: Sequence[float],
    bwd: Sequence[float],
    wgt: Sequence[float],
    hop_c: Sequence[float],
    hop_tau: Sequence[float],
) -> list[float]:
    """Every closed-form bound of :func:`lower_bound_ms`, on the given (possibly integer) times."""
    hop = [c + t for c, t in zip(hop_c, hop_tau)] if any(t > 0 for t in hop_tau) else list(hop_c)
    if model.stages_per_rank > 1:
        out = _rank_bounds(model, fwd, bwd, wgt, hop)
    else:
        caps = [model.budget(s) for s in range(model.stages)]
        out = _stage_bounds(model.stages, model.microbatches, fwd, bwd, wgt, hop, caps)
    return out + _link_bounds(model, (fwd, bwd, wgt), hop_c, hop_tau)


def lower_bound_under(
    model: CostModel, links: LinkModel, *, step: int = 0, t0: float = 0.0, resolution_ms: float = 0.5
) -> float:
    """A lower bound on any schedule's makespan for one iteration starting at ``t0`` under a
    time-varying link model (what the runtime reports as ``morph/bound_ms``), relative to ``t0``.

    A rank cannot start before the first forward reaches one of its stages and then still runs the
    F, I and W of all N microbatches of its stages: max over ranks r of min_{s in r} head_s + N ·
    Σ_{s in r}(t^F_s + t^B_s + t^W_s), the per-rank bound of :func:`lower_bound_ms` (V placement)
    with the static c_j replaced by the delay when the message is sent. head follows the forward
    chain from t0: a hop whose input is ready at e delivers at the earliest min over t >= e of
    t + c(t) (a later send arrives earlier when the delay drops). That minimum is taken on a grid
    over [e, e + c(e)]: e itself exactly, and a grid point whose delay differs from the previous
    one's minus one grid step (the change may have come just after the previous point). The grid is
    ``resolution_ms``, coarser for delays above 512 of them, so that a hop costs at most 512 lookups;
    the bound is exact for static links and holds whenever a delay changes at most once per grid
    step. A link that is down (inf) gives inf. Bandwidth: a message sent at t takes at least
    c(t) + tau(t) (its latency and its own transmit time; queueing behind others only adds).
    """
    if resolution_ms <= 0:
        raise ValueError(f"resolution_ms must be > 0, got {resolution_ms}")
    if links.num_links != model.num_links:
        raise ValueError(f"links model has {links.num_links} links, the cost model {model.num_links}")
    route_f, _ = model.routes()
    heads = [0.0] * model.stages
    for s in range(model.stages - 1):
        ready = heads[s] + model.fwd[s]
        route = route_f[s]
        if route is None:
            heads[s + 1] = ready
            continue
        link, direction = route[0], ("fwd", "bwd")[route[1]]
        heads[s + 1] = _earliest_delivery(links, link, direction, t0 + ready, step, resolution_ms) - t0
    n = model.microbatches
    ranks = max(
        min(heads[s] for s in own) + n * sum(model.fwd[s] + model.bwd[s] + model.wgt[s] for s in own)
        for own in (model.rank_stages(r) for r in range(model.ranks))
    )
    return max([ranks, *_static_link_bounds(model, links)])


def _static_link_bounds(model: CostModel, links: LinkModel) -> list[float]:
    """The wires' load bounds of :func:`lower_bound_ms` when ``links`` is static (time-varying rates
    give none here: a lower rate later cannot be bounded from the step's start); the least of the
    two directions per link keeps them valid for asymmetric links."""
    if not isinstance(links, StaticDelays):
        return []
    (tf, tb), (cf, cb) = links.static_transmit, (links.fwd, links.bwd or links.fwd)
    tau = [min(a, b) for a, b in zip(tf, tb)]
    if not any(t > 0 for t in tau):
        return []
    c = [min(a, b) for a, b in zip(cf, cb)]
    return _link_bounds(model, (model.fwd, model.bwd, model.wgt), _hop_delays(model, c), _hop_delays(model, tau))


def _earliest_delivery(links: LinkModel, link: int, direction: str, ready: float, step: int, grid: float) -> float:
    """min over send times t >= ``ready`` of t + c(t) + tau(t), on a grid (see :func:`lower_bound_under`)."""

    def cost(t: float) -> float:
        return links.delay_ms(link, direction, t, step) + links.transmit_ms(link, direction, t, step)

    delay = cost(ready)
    if math.isinf(delay):
        return math.inf
    best = ready + delay
    t, previous = ready, delay
    grid = max(grid, delay / 512)
    while t < best:  # a send at or after ``best`` cannot arrive before it
        t += grid
        c = cost(t)
        if c != previous:
            best = min(best, t - grid + c)
            previous = c
    return best


def _hop_delays(model: CostModel, delays: Sequence[float]) -> list[float]:
    """Per hop s (stage s to s+1): the delay of the link it crosses, 0 on a local hop."""
    links = [model.hop_link(s) for s in range(model.stages - 1)]
    return [0 if link is None else delays[link] for link in links]


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
    from .baselines import build_plain

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
    S, N = model.stages, model.microbatches
    kinds = ("F", "I", "W")
    scale, rounded = _pick_scale([*model.fwd, *model.bwd, *model.wgt, *model.delays, *model.transmit])

    def q(v: float) -> int:
        return math.floor(v * scale + 1e-9) if rounded else round(v * scale)

    dur = {(s, k): q(model.duration(s, k)) for s in range(S) for k in kinds}
    delay = [q(c) for c in _hop_delays(model, model.delays)]  # per hop
    tau = [q(t) for t in _hop_delays(model, model.transmit)]  # per hop; 0 = delay-only
    hint_times = _hint_times(model, hint_orders) if hint_orders is not None else None

    # Horizon: a fully serial schedule (one microbatch at a time) is always feasible.
    serial = N * (sum(dur[(s, k)] for s in range(S) for k in kinds) + 2 * sum(delay) + 2 * sum(tau))
    horizon = serial
    if hint_times is not None and not rounded:
        horizon = min(horizon, round(max(e for _, e in hint_times.values()) * scale))

    m = cp_model.CpModel()
    start: dict[tuple[int, str, int], cp_model.IntVar] = {}
    end: dict[tuple[int, str, int], cp_model.LinearExprT] = {}
    intervals: dict[int, list[cp_model.IntervalVar]] = {r: [] for r in range(model.ranks)}
    for s in range(S):
        for k in kinds:
            for b in range(N):
                st = m.new_int_var(0, horizon, f"s_{k}{b}@{s}")
                iv = m.new_fixed_size_interval_var(st, dur[(s, k)], f"{k}{b}@{s}")
                start[(s, k, b)] = st
                end[(s, k, b)] = st + dur[(s, k)]
                intervals[model.rank_of(s)].append(iv)
    mk = m.new_int_var(0, horizon, "makespan")
    for r in range(model.ranks):
        m.add_no_overlap(intervals[r])
    # Messages on links with a transmit time: per wire, (producer op, transmission start).
    route_f, route_b = model.routes()
    wires: dict[tuple[int, int], list[tuple[tuple[int, str, int], cp_model.IntVar]]] = {}

    def sent(route: tuple[int, int] | None, producer: tuple[int, str, int], size: int) -> cp_model.LinearExprT:
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
            m.add(mk >= end[(s, "W", b)])
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
    for r in range(model.ranks):
        cap = model.budget(r)
        own = model.rank_stages(r)
        if cap < N * len(own):
            live = []
            for s in own:
                for b in range(N):
                    size = m.new_int_var(dur[(s, "F")] + dur[(s, "I")], horizon, f"live{b}@{s}")
                    live.append(m.new_interval_var(start[(s, "F", b)], size, end[(s, "I", b)], f"mem{b}@{s}"))
            m.add_cumulative(live, [1] * len(live), cap)
    if use_bound:  # closed-form bounds (lower_bound_ms), on the integer durations
        fwd, bwd, wgt = ([dur[(s, k)] for s in range(S)] for k in kinds)
        for b_s in _all_bounds(model, fwd, bwd, wgt, delay, tau):
            m.add(mk >= math.ceil(b_s))
    # Symmetry breaking (see module docstring).
    for b in range(N - 1):
        m.add(start[(0, "F", b + 1)] >= end[(0, "F", b)])
    shared: dict[tuple[int, int], cp_model.IntVar] = {}
    for s in range(S):
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
    m.minimize(mk)

    if hint_times is not None and not rounded:
        for s in range(S):
            for k in kinds:
                for b in range(N):
                    m.add_hint(start[(s, k, b)], round(hint_times[(s, k, b)][0] * scale))

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
        hint_end = max(end for _start, end in hint_times.values()) if hint_times else math.inf
        closed = lower_bound_ms(model) if use_bound else 0.0
        return ExactResult(
            makespan=hint_end,
            lower_bound=min(closed, hint_end),
            optimal=False,
            orders=hint_orders,
            scale=scale,
            rounded=rounded,
            wall_s=time.perf_counter() - t_start,
            status=f"{status_name}:hint",
        )
    orders = []
    named = model.stages_per_rank > 1
    for r in range(model.ranks):
        ops = sorted(
            (solver.value(start[(s, k, b)]), kinds.index(k), s, b, Op(k, b, s if named else None))
            for s in model.rank_stages(r)
            for k in kinds
            for b in range(N)
        )
        orders.append(tuple(op for *_, op in ops))
    orders_t = tuple(orders)
    bound = solver.best_objective_bound / scale
    if rounded:
        makespan = simulate(model, orders_t).makespan
    else:
        makespan = solver.objective_value / scale
    optimal = status == cp_model.OPTIMAL and not rounded or makespan <= bound + 1e-9
    return ExactResult(
        makespan=makespan,
        lower_bound=min(bound, makespan),
        optimal=bool(optimal),
        orders=orders_t,
        scale=scale,
        rounded=rounded,
        wall_s=time.perf_counter() - t_start,
        status=status_name,
    )
