"""Closed-form lower bounds on any schedule's makespan (no solver): :func:`lower_bound_ms` (static
delays) and :func:`lower_bound_under` (one step under time-varying links, reported by the runtime
as ``morph/bound_ms``).

The plan CLI, the partition planner and the runtime report them as what any other plan could still
gain; the exact CP-SAT reference (:mod:`reference.exact`) adds them as constraints to speed up its
proof, on its integer durations (:func:`closed_form_bounds`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from titan_morph.pipelining.core.links import LinkModel, StaticDelays
from titan_morph.pipelining.core.model import CostModel

__all__ = ["closed_form_bounds", "hop_delays", "lower_bound_ms", "lower_bound_under"]


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
    unless ``reference.exact.optimal_makespan(..., use_bound=False)``, which the tests use to check them.
    With several stages per rank the bound is weaker: per rank, the earliest start of its first
    stage plus all of its work, and one microbatch's round trip through every stage and link.
    Bandwidth: every c_j above becomes c_j + tau_j (a message takes at least both), and each wire's
    load is a bound too (:func:`_link_bounds`: a link's transmit time per step bounds the step).
    """
    hop_c = hop_delays(model, model.delays)
    hop_tau = hop_delays(model, model.transmit)
    return max(closed_form_bounds(model, model.fwd, model.bwd, model.wgt, hop_c, hop_tau))


def closed_form_bounds(
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
    return _link_bounds(model, (model.fwd, model.bwd, model.wgt), hop_delays(model, c), hop_delays(model, tau))


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


def hop_delays(model: CostModel, delays: Sequence[float]) -> list[float]:
    """Per hop s (stage s to s+1): the delay of the link it crosses, 0 on a local hop."""
    links = [model.hop_link(s) for s in range(model.stages - 1)]
    return [0 if link is None else delays[link] for link in links]
