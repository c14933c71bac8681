"""Search beyond the paper's planner (paper §4.2–§4.3, Alg. 2–4; §7.4 compares with the optimum).

Alg. 2 fixes x_i from Eq. 1 alone; that ignores W, heterogeneous stages and memory, and its
N − 2S clip collapses every Δ_i when N <= 2S. The search has two phases, both scored by makespan.

1. Knob phase. The Alg. 3/4 generator is parametrised per stage by
   ``warmup[i]`` = x_i (warm-up quota; non-increasing by Lemma 1, 1 <= x_i <= min(M_i, N)),
   ``limit[i]`` = in-flight cap after warm-up (x_i <= limit_i <= min(M_i, N)) and
   ``policy[i]``, a bitmask for idle-gap filling with ops whose arrival is already known
   (static delays): ``WAIT_W`` (1) — a ``W`` does not start if an ``I`` on its way arrives before
   the ``W`` would end (wait for the ``I``: it frees memory and unblocks upstream);
   ``WAIT_F`` (2) — the same for an ``F``; ``WAIT_W_FOR_F`` (4) — a ``W`` does not start if an
   admissible ``F`` arrives before it would end. ``policy = 0`` and ``limit = warmup`` are exactly
   Alg. 3 (``generate.generate``, same tie rules; checked by the tests).
   Seeds: Alg. 2, Alg. 1 (under the memory budget), ZB-H1/1F1B (S − i), ZB-H2 (2(S − i) − 1),
   all-ones and the caller's vectors, each clipped to the budget; then the same vectors with
   uniform policies; then first-improvement hill-climbing (memoised, fixed neighbour order) over
   ±1 moves of one link's slackness Δ_i (x_0..x_i together), of one x_i, of one cap, and policy
   bit flips, restarted from the next-best starts while budget remains.
2. Order phase (static non-blocking links only). The best two knob optima are *polished* as
   fixed orders: job-shop style insertions inside critical blocks (back-to-back ops on a critical
   path; only reordering there can shorten it), accepted when (makespan, Σ stage finish times)
   decreases, then iterated local search (seeded random valid swaps / critical moves + descent,
   keep the best). Orders stay within memory (every prefix: #F − #I <= M_i) and F < I < W.

Scoring: under static non-blocking links the generator's own timeline *is* the simulation (each
op starts at max(ready, stage free)), and polishing re-times orders with an equivalent ASAP pass;
under other links or a blocking ``depth`` the knob phase re-times each candidate's orders with
``simulate.makespan`` and the order phase is skipped. The result is never worse than any seed.

Determinism: ``time_budget_ms`` is spent in *estimated* cost, a fixed number of µs per scheduled op
for each kind of evaluation (``KERNEL_US_PER_OP``, ``TIMELINE_US_PER_OP``, ``SIMULATE_US_PER_OP``,
measured on a 2-core dev box), never on the wall clock, and the ILS uses a fixed-seed RNG, so the
plan does not depend on machine load.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .links import LinkModel, StaticDelays
from .model import CostModel, Op, Order, Plan, validate_orders, warmup_count

__all__ = ["Knobs", "SearchResult", "search", "search_detailed", "run_knobs", "polish", "default_budget_ms"]

KERNEL_US_PER_OP = 1.3
"""Estimated cost (µs per op) of one generator run (:func:`run_knobs`)."""
TIMELINE_US_PER_OP = 0.6
"""Estimated cost (µs per op) of one fixed-order re-timing in :func:`polish`."""
SIMULATE_US_PER_OP = 4.0
"""Estimated cost (µs per op) of generator + ``simulate.makespan`` under non-static links/depth."""

_F, _I, _W = 0, 1, 2
WAIT_W = 1
WAIT_F = 2
WAIT_W_FOR_F = 4
POLICY_BITS = (WAIT_W, WAIT_F, WAIT_W_FOR_F)
PERTURB = "mixed"
"""Perturbation of the iterated local search: random valid swaps, critical-block moves, or mixed."""
KNOB_SHARE = 0.5
ACCEPT_EQUAL = True
"""Iterated local search walks on from not-worse local optima (True) or restarts from the best."""
NEIGHBOUR_ORDER = ("link", "x", "lim", "pol")
"""Order in which the knob phase tries its move groups (first improvement)."""
"""Share of the budget for the knob phase under static links (the rest polishes orders)."""
POLISH_STARTS = 2
"""How many distinct knob-phase local optima are polished."""
_UNIFORM_POLICIES = (0, WAIT_W | WAIT_W_FOR_F, WAIT_W | WAIT_F | WAIT_W_FOR_F)


@dataclass(frozen=True, order=True)
class Knobs:
    """One point of the search space (per stage: x_i, in-flight cap, policy bits)."""

    warmup: tuple[int, ...]
    limit: tuple[int, ...]
    policy: tuple[int, ...]

    def key(self) -> tuple[tuple[int, ...], ...]:
        return (self.warmup, self.limit, self.policy)


@dataclass(frozen=True)
class SearchResult:
    """The chosen plan with its makespan and how the search got there."""

    plan: Plan
    makespan: float
    knobs: Knobs
    seeds: dict[str, float] = field(default_factory=dict)
    evaluations: int = 0
    budget: int = 0


def run_knobs(model: CostModel, knobs: Knobs, *, record: bool = True) -> tuple[float, tuple[Order, ...] | None]:
    """Generate one schedule for ``knobs`` under ``model.delays`` (non-blocking links).

    Returns (makespan, orders or None). Same event rules as :func:`generate.generate`: every event
    at one instant is applied before any decision at that instant. ``inf`` makespan = stalled.
    """
    s_count, n = model.stages, model.microbatches
    last = s_count - 1
    x, lim, pol = knobs.warmup, knobs.limit, knobs.policy
    cd = model.delays
    tf, tb, tw = model.fwd, model.bwd, model.wgt
    ready_f: list[list[int]] = [[] for _ in range(s_count)]
    ready_i: list[list[int]] = [[] for _ in range(s_count)]
    ready_w: list[list[int]] = [[] for _ in range(s_count)]
    ready_f[0] = list(range(n))
    # Expected arrival time of I's already started downstream (known ahead: static delays).
    incoming: list[list[float]] = [[] for _ in range(s_count)]
    incoming_f: list[list[float]] = [[] for _ in range(s_count)]
    warm_left = list(x)
    in_flight = [0] * s_count
    busy = [False] * s_count
    done = [0] * s_count
    orders: list[list[tuple[int, int]]] = [[] for _ in range(s_count)]
    events: list[tuple[float, int, int, int, int, int]] = []
    heappush, heappop = heapq.heappush, heapq.heappop
    seq = 0
    dirty = list(range(s_count))
    marked = [True] * s_count
    now = 0.0
    end_time = 0.0
    while True:
        for s in dirty:
            marked[s] = False
            if busy[s]:
                continue
            code = -1
            if warm_left[s] > 0:
                if ready_f[s]:
                    code = _F
                    warm_left[s] -= 1
            elif ready_i[s]:
                code = _I
            else:
                p = pol[s]
                if ready_f[s] and in_flight[s] < lim[s]:
                    code = _F
                    if p & WAIT_F and incoming[s] and incoming[s][0] < now + tf[s]:
                        code = -1
                elif ready_w[s]:
                    code = _W
                    if p & WAIT_W and incoming[s] and incoming[s][0] < now + tw[s]:
                        code = -1
                    elif (
                        p & WAIT_W_FOR_F and incoming_f[s] and incoming_f[s][0] < now + tw[s] and in_flight[s] < lim[s]
                    ):
                        code = -1
            if code < 0:
                continue
            if code == _F:
                m = heappop(ready_f[s])
                in_flight[s] += 1
                end = now + tf[s]
                if s < last:
                    incoming_f[s + 1].append(end + cd[s])
            elif code == _I:
                m = heappop(ready_i[s])
                end = now + tb[s]
                if s > 0:
                    incoming[s - 1].append(end + cd[s - 1])
            else:
                m = heappop(ready_w[s])
                end = now + tw[s]
            if record:
                orders[s].append((code, m))
            busy[s] = True
            seq += 1
            heappush(events, (end, seq, 1, s, code, m))
        dirty.clear()
        if not events:
            break
        now = events[0][0]
        horizon = now + 1e-9 * max(1.0, abs(now))
        while events and events[0][0] <= horizon:
            t, _, is_end, s, code, m = heappop(events)
            if not marked[s]:
                marked[s] = True
                dirty.append(s)
            if not is_end:
                if code == _F:
                    heappush(ready_f[s], m)
                    incoming_f[s].pop(0)
                else:
                    heappush(ready_i[s], m)
                    incoming[s].pop(0)
                continue
            busy[s] = False
            done[s] += 1
            end_time = t
            if code == _F:
                if s < last:
                    seq += 1
                    heappush(events, (t + cd[s], seq, 0, s + 1, _F, m))
                else:
                    heappush(ready_i[s], m)
            elif code == _I:
                in_flight[s] -= 1
                heappush(ready_w[s], m)
                if s > 0:
                    seq += 1
                    heappush(events, (t + cd[s - 1], seq, 0, s - 1, _I, m))
    if any(d != 3 * n for d in done):
        return math.inf, None
    if not record:
        return end_time, None
    kinds = ("F", "I", "W")
    cache = {(c, m): Op(kinds[c], m) for c in range(3) for m in range(n)}
    return end_time, tuple(tuple(cache[o] for o in order) for order in orders)


Code = tuple[int, int]  # (kind code _F/_I/_W, microbatch)


def _timeline(
    model: CostModel, orders: Sequence[Sequence[Code]]
) -> tuple[float, list[list[float]], list[list[float]]] | None:
    """Run fixed orders as early as possible (static delays, non-blocking): (makespan, starts, ends),
    or None on deadlock. Same semantics as ``simulate.makespan``; positions index the orders."""
    s_count, n = model.stages, model.microbatches
    last = s_count - 1
    cd = model.delays
    dur = (model.fwd, model.bwd, model.wgt)
    arr_f: list[list[float]] = [[-1.0] * n for _ in range(s_count)]
    arr_b: list[list[float]] = [[-1.0] * n for _ in range(s_count)]
    arr_f[0] = [0.0] * n
    starts = [[0.0] * len(o) for o in orders]
    ends = [[0.0] * len(o) for o in orders]
    pos = [0] * s_count
    free = [0.0] * s_count
    wait_f = [-1] * s_count
    wait_b = [-1] * s_count
    stack = list(range(last, -1, -1))
    while stack:
        s = stack.pop()
        order = orders[s]
        p = pos[s]
        t = free[s]
        st, en = starts[s], ends[s]
        size = len(order)
        while p < size:
            c, m = order[p]
            if c == _F:
                r = arr_f[s][m]
                if r < 0:
                    wait_f[s] = m
                    break
            elif c == _I:
                r = arr_b[s][m]
                if r < 0:
                    wait_b[s] = m
                    break
            else:
                r = t
            if r > t:
                t = r
            st[p] = t
            t += dur[c][s]
            en[p] = t
            if c == _F:
                if s < last:
                    arr_f[s + 1][m] = t + cd[s]
                    if wait_f[s + 1] == m:
                        wait_f[s + 1] = -1
                        stack.append(s + 1)
                else:
                    arr_b[s][m] = t
            elif c == _I and s > 0:
                arr_b[s - 1][m] = t + cd[s - 1]
                if wait_b[s - 1] == m:
                    wait_b[s - 1] = -1
                    stack.append(s - 1)
            p += 1
        pos[s] = p
        free[s] = t
    if any(pos[s] < len(orders[s]) for s in range(s_count)):
        return None
    return max(free), starts, ends


def _stage_ok(order: Sequence[Code], cap: int) -> bool:
    """F before I before W per microbatch, and at most ``cap`` microbatches in flight."""
    seen_f: set[int] = set()
    seen_i: set[int] = set()
    live = 0
    for c, m in order:
        if c == _F:
            live += 1
            if live > cap:
                return False
            seen_f.add(m)
        elif c == _I:
            if m not in seen_f:
                return False
            live -= 1
            seen_i.add(m)
        elif m not in seen_i:
            return False
    return True


def _critical_blocks(
    model: CostModel, orders: Sequence[Sequence[Code]], starts: list[list[float]], ends: list[list[float]]
) -> list[tuple[int, int, int]]:
    """Blocks (stage, first, last position) of back-to-back ops on one critical path (job-shop
    style): only reordering inside such a block can shorten that path."""
    s_count = model.stages
    last = s_count - 1
    cd = model.delays
    index: list[dict[Code, int]] = [{op: p for p, op in enumerate(o)} for o in orders]
    s, p = max(((s, len(o) - 1) for s, o in enumerate(orders) if o), key=lambda sp: ends[sp[0]][sp[1]])
    blocks: list[tuple[int, int, int]] = []
    block_end = p
    eps = 1e-9
    while True:
        t = starts[s][p]
        c, m = orders[s][p]
        # Dependency-ready time and the op it comes from.
        dep: tuple[int, int] | None = None
        if c == _F and s > 0:
            q = index[s - 1][(_F, m)]
            if abs(ends[s - 1][q] + cd[s - 1] - t) <= eps * max(1.0, t):
                dep = (s - 1, q)
        elif c == _I:
            if s < last:
                q = index[s + 1][(_I, m)]
                if abs(ends[s + 1][q] + cd[s] - t) <= eps * max(1.0, t):
                    dep = (s + 1, q)
            if dep is None:
                q = index[s][(_F, m)]
                if abs(ends[s][q] - t) <= eps * max(1.0, t) and (p == 0 or q != p - 1):
                    dep = (s, q)
        elif c == _W:
            q = index[s][(_I, m)]
            if abs(ends[s][q] - t) <= eps * max(1.0, t) and (p == 0 or q != p - 1):
                dep = (s, q)
        machine = p > 0 and abs(ends[s][p - 1] - t) <= eps * max(1.0, t)
        if machine:
            p -= 1
            continue
        if block_end > p:
            blocks.append((s, p, block_end))
        if dep is None or t <= 0:
            break
        s, p = dep
        block_end = p
    return blocks


def _block_moves(blocks: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(stage, from, to) insertions: the last op of a block to any earlier slot in it, the first
    op to any later slot (the classic N5/insertion neighbourhood)."""
    moves: list[tuple[int, int, int]] = []
    for s, a, b in blocks:
        for q in range(b - 1, a - 1, -1):
            moves.append((s, b, q))
        for q in range(a + 1, b + 1):
            moves.append((s, a, q))
    return moves


def _move(order: Sequence[Code], i: int, j: int) -> list[Code]:
    out = list(order)
    op = out.pop(i)
    out.insert(j, op)
    return out


def _better(ms: float, sec: float, best_ms: float, best_sec: float) -> bool:
    """Lexicographic (makespan, secondary) comparison with a float tolerance."""
    if ms < best_ms - 1e-9:
        return True
    return ms <= best_ms + 1e-9 and sec < best_sec - 1e-9


def _secondary(ends: list[list[float]]) -> float:
    """Tie-breaker between equal makespans: the sum of the stages' finish times."""
    return sum(e[-1] for e in ends if e)


def _descend(
    model: CostModel, cur: list[list[Code]], caps: Sequence[int], max_evaluations: int
) -> tuple[float, float, list[list[Code]], int] | None:
    """First-improvement descent over critical-block insertions; None if ``cur`` deadlocks."""
    res = _timeline(model, cur)
    if res is None:
        return None
    cur_ms, starts, ends = res
    cur_sec = _secondary(ends)
    used = 1
    while used < max_evaluations:
        improved = False
        for s, i, j in _block_moves(_critical_blocks(model, cur, starts, ends)):
            if used >= max_evaluations:
                break
            cand = _move(cur[s], i, j)
            if not _stage_ok(cand, caps[s]):
                continue
            trial = cur[:]
            trial[s] = cand
            used += 1
            res = _timeline(model, trial)
            if res is None or res[0] > cur_ms + 1e-9:
                continue
            sec = _secondary(res[2])
            # Lexicographic (makespan, sum of stage finish times): plateau moves that free a stage
            # earlier are taken too, and the strict decrease rules out cycles.
            if res[0] < cur_ms - 1e-9 or sec < cur_sec - 1e-9:
                cur = trial
                cur_ms, starts, ends = res
                cur_sec = sec
                improved = True
                break
        if not improved:
            break
    return cur_ms, cur_sec, cur, used


def _perturb(cur: list[list[Code]], caps: Sequence[int], rng: random.Random, swaps: int) -> list[list[Code]]:
    """``swaps`` random adjacent transpositions that keep each stage order valid."""
    out = [o[:] for o in cur]
    for _ in range(swaps):
        for _attempt in range(20):
            s = rng.randrange(len(out))
            if len(out[s]) < 2:
                continue
            i = rng.randrange(len(out[s]) - 1)
            a, b = out[s][i], out[s][i + 1]
            if a[1] == b[1]:
                continue
            cand = out[s][:]
            cand[i], cand[i + 1] = b, a
            if _stage_ok(cand, caps[s]):
                out[s] = cand
                break
    return out


def _perturb_critical(
    model: CostModel, cur: list[list[Code]], caps: Sequence[int], rng: random.Random, moves: int
) -> list[list[Code]]:
    """``moves`` random valid critical-block insertions (each on the then-current critical path)."""
    out = [o[:] for o in cur]
    for _ in range(moves):
        res = _timeline(model, out)
        if res is None:
            break
        cands = _block_moves(_critical_blocks(model, out, res[1], res[2]))
        rng.shuffle(cands)
        for s, i, j in cands:
            cand = _move(out[s], i, j)
            if _stage_ok(cand, caps[s]):
                out[s] = cand
                break
    return out


def polish(
    model: CostModel, orders: Sequence[Sequence[Op]], max_evaluations: int, *, seed: int = 0
) -> tuple[float, tuple[Order, ...], int]:
    """Improve fixed orders under static non-blocking links and the memory budget: descent over
    critical-block insertions, then iterated local search (seeded random valid swaps + descent,
    keep the best) while evaluations remain. Returns (makespan, orders, evaluations used)."""
    code = {"F": _F, "I": _I, "W": _W}
    start = [[(code[op.kind], op.mb) for op in o] for o in orders]
    caps = [model.budget(s) for s in range(model.stages)]
    first = _descend(model, start, caps, max_evaluations)
    if first is None:
        raise ValueError("polish: the given orders deadlock")
    best_ms, best_sec, best, used = first
    cur_ms, cur = best_ms, best
    rng = random.Random(seed)
    while used < max_evaluations:
        base = cur if ACCEPT_EQUAL else best
        if PERTURB == "critical" or (PERTURB == "mixed" and rng.random() < 0.5):
            trial = _perturb_critical(model, base, caps, rng, 1 + rng.randrange(2))
        else:
            trial = _perturb(base, caps, rng, 1 + rng.randrange(3))
        res = _descend(model, trial, caps, max_evaluations - used)
        used += 1 if res is None else res[3]
        if res is None:
            continue
        if res[0] <= cur_ms + 1e-9:  # walk across plateaus (not-worse acceptance)
            cur_ms, cur = res[0], res[2]
        if _better(res[0], res[1], best_ms, best_sec):
            best_ms, best_sec, best = res[0], res[1], res[2]
    kinds = ("F", "I", "W")
    return best_ms, tuple(tuple(Op(kinds[c], m) for c, m in o) for o in best), used


def default_budget_ms(model: CostModel) -> float:
    """Time budget when none is given: 40 ms for small pipelines, growing with S·N up to 600 ms
    (S=8, N=32 -> 40 ms; S=32, N=256 -> 600 ms)."""
    ops = 3 * model.stages * model.microbatches
    return float(min(600.0, max(40.0, 0.025 * ops)))


def _caps(model: CostModel) -> tuple[int, ...]:
    return tuple(model.budget(s) for s in range(model.stages))


def _normalise(vec: Sequence[int], caps: Sequence[int]) -> tuple[int, ...]:
    """Clip x into [1, cap_i] and make it non-increasing (lower later stages, Lemma 1)."""
    x = [max(1, min(int(v), c)) for v, c in zip(vec, caps)]
    for s in range(1, len(x)):
        x[s] = min(x[s], x[s - 1])
    return tuple(x)


def _seed_vectors(model: CostModel, extra: Sequence[Sequence[int]] | None) -> list[tuple[str, tuple[int, ...]]]:
    from .slackness import adapted_warmup, initial_warmup

    S, N = model.stages, model.microbatches
    caps = _caps(model)
    raw: list[tuple[str, Sequence[int]]] = []
    try:
        raw.append(("alg2", adapted_warmup(model)))
    except ValueError:
        pass
    raw.append(("alg1", initial_warmup(S, N, list(caps))))
    raw.append(("zb-h1", [S - i for i in range(S)]))
    raw.append(("zb-h2", [2 * (S - i) - 1 for i in range(S)]))
    raw.append(("min", [1] * S))
    for k, vec in enumerate(extra or ()):
        if len(vec) != S:
            raise ValueError(f"seed {k} needs {S} warm-up counts (one per stage), got {len(vec)}")
        raw.append((f"seed{k}", vec))
    out: list[tuple[str, tuple[int, ...]]] = []
    seen: set[tuple[int, ...]] = set()
    for name, vec in raw:
        x = _normalise(vec, caps)
        if x not in seen:
            seen.add(x)
            out.append((name, x))
    return out


def _neighbours(k: Knobs, caps: Sequence[int]) -> list[Knobs]:
    """±1 moves in a fixed order (``NEIGHBOUR_ORDER``): policy bits, caps, link slackness, x_i."""
    x, lim, pol = list(k.warmup), list(k.limit), list(k.policy)
    S = len(x)
    groups: dict[str, list[Knobs]] = {"link": [], "x": [], "lim": [], "pol": []}

    def add(group: str, nx: Sequence[int], nl: Sequence[int], np_: Sequence[int]) -> None:
        nx_t = tuple(nx)
        if any(not 1 <= v <= c for v, c in zip(nx_t, caps)):
            return
        if any(nx_t[i] < nx_t[i + 1] for i in range(S - 1)):
            return
        nl_t = tuple(max(a, min(b, c)) for a, b, c in zip(nx_t, nl, caps))
        groups[group].append(Knobs(nx_t, nl_t, tuple(np_)))

    for i in range(S - 1):  # slackness of link i: x_0..x_i move together
        for d in (1, -1):
            add(
                "link",
                [v + d if j <= i else v for j, v in enumerate(x)],
                [v + d if j <= i else v for j, v in enumerate(lim)],
                pol,
            )
    for i in range(S):
        for d in (1, -1):
            nx = x[:]
            nx[i] += d
            nl = lim[:]
            if nl[i] == x[i]:
                nl[i] += d
            add("x", nx, nl, pol)
    for i in range(S):
        for d in (1, -1):
            nl = lim[:]
            nl[i] += d
            if x[i] <= nl[i] <= caps[i]:
                groups["lim"].append(Knobs(k.warmup, tuple(nl), k.policy))
    for i in range(S):
        for bit in POLICY_BITS:
            np_ = pol[:]
            np_[i] ^= bit
            groups["pol"].append(Knobs(k.warmup, k.limit, tuple(np_)))
    return [nb for g in NEIGHBOUR_ORDER for nb in groups[g]]


def _is_static(model: CostModel, links: LinkModel | None, depth: int | None) -> bool:
    if depth is not None:
        return False
    if links is None:
        return True
    return isinstance(links, StaticDelays) and links.fwd == model.delays and links.bwd == model.delays


def search_detailed(
    model: CostModel,
    *,
    links: LinkModel | None = None,
    depth: int | None = None,
    time_budget_ms: float | None = None,
    seeds: Sequence[Sequence[int]] | None = None,
    max_evaluations: int | None = None,
) -> SearchResult:
    """:func:`search` with the makespan, the knobs and the per-seed makespans."""
    if time_budget_ms is not None and not time_budget_ms > 0:
        raise ValueError(f"time_budget_ms must be > 0 ms (or None for the size-based default), got {time_budget_ms}")
    if any(math.isinf(c) for c in model.delays):
        raise ValueError("search: a link delay is inf (link down); replan around the link first")
    S, N = model.stages, model.microbatches
    caps = _caps(model)
    ops = 3 * S * N
    budget_ms = default_budget_ms(model) if time_budget_ms is None else float(time_budget_ms)
    static = _is_static(model, links, depth)
    eval_us = ops * (KERNEL_US_PER_OP if static else SIMULATE_US_PER_OP)
    if max_evaluations is not None:  # explicit count (tests): knob evaluations + polish evaluations
        budget = int(max_evaluations)
        knob_budget = budget // 2 if static else budget
        polish_budget = budget - knob_budget
    else:
        budget_us = budget_ms * 1000.0
        knob_share = KNOB_SHARE if static else 1.0
        knob_budget = max(1, int(budget_us * knob_share / eval_us))
        polish_budget = int(budget_us * (1.0 - knob_share) / (ops * TIMELINE_US_PER_OP))
        budget = knob_budget + polish_budget

    score: Callable[[Knobs], float]
    if static:

        def score(k: Knobs) -> float:
            return run_knobs(model, k, record=False)[0]
    else:
        from .simulate import DeadlockError, makespan

        def score(k: Knobs) -> float:
            _, orders = run_knobs(model, k)
            if orders is None:
                return math.inf
            try:
                return makespan(model, orders, links=links, depth=depth)
            except DeadlockError:
                return math.inf

    memo: dict[tuple[tuple[int, ...], ...], float] = {}

    def rank(k: Knobs, ms: float) -> tuple[float, int, int, int]:
        return (round(ms, 6), sum(k.limit), sum(k.warmup), sum(k.policy))

    def evaluate(k: Knobs) -> float:
        key = k.key()
        if key not in memo:
            memo[key] = score(k)
        return memo[key]

    seed_list = _seed_vectors(model, seeds)
    zero = (0,) * S
    seed_ms: dict[str, float] = {}
    ranked: list[tuple[tuple[float, int, int, int], int, Knobs]] = []
    for name, x in seed_list:  # always evaluated: the result is never worse than a seed
        k = Knobs(x, x, zero)
        ms = evaluate(k)
        seed_ms[name] = ms
        ranked.append((rank(k, ms), len(ranked), k))
    ranked.sort()
    # The other uniform policies on the seeds, best seeds first, while the knob budget lasts.
    by_rank = [k.warmup for _, _, k in ranked]
    for pol_bits in _UNIFORM_POLICIES[1:]:
        for x in by_rank:
            if len(memo) >= knob_budget:
                break
            k = Knobs(x, x, (pol_bits,) * S)
            ranked.append((rank(k, evaluate(k)), len(ranked), k))
    ranked.sort()
    best_rank, _, best = ranked[0]
    # Hill-climb (first improvement, memoised, deterministic order) from the best start, then from
    # the next-best starts while evaluations remain.
    optima: list[tuple[tuple[float, int, int, int], int, Knobs]] = [(ranked[0][0], 0, ranked[0][2])]
    for start_rank, _, start in ranked:
        if len(memo) >= knob_budget:
            break
        cur, cur_rank = start, start_rank
        improved = True
        while improved and len(memo) < knob_budget:
            improved = False
            for nb in _neighbours(cur, caps):
                if len(memo) >= knob_budget:
                    break
                if nb.key() in memo:
                    continue
                r = rank(nb, evaluate(nb))
                if r < cur_rank:
                    cur, cur_rank = nb, r
                    improved = True
                    break
        optima.append((cur_rank, len(optima), cur))
        if cur_rank < best_rank:
            best, best_rank = cur, cur_rank
    _, orders = run_knobs(model, best)
    assert orders is not None
    final_ms = memo[best.key()]
    used = len(memo)
    # Polishing gets its own share plus what the knob phase left (converted to re-timing cost),
    # split over the best few distinct local optima of the knob phase.
    polish_budget += int(max(0, knob_budget - used) * eval_us / (ops * TIMELINE_US_PER_OP))
    if static and polish_budget > 0:
        starts_k: list[Knobs] = []
        for _, _, k in sorted(optima):
            if k not in starts_k:
                starts_k.append(k)
            if len(starts_k) == POLISH_STARTS:
                break
        share = polish_budget // len(starts_k)
        for k in starts_k:
            _, k_orders = run_knobs(model, k)
            assert k_orders is not None
            pol_ms, pol_orders, pol_used = polish(model, k_orders, share)
            used += pol_used
            if pol_ms < final_ms - 1e-9:
                final_ms, orders = pol_ms, pol_orders
    validate_orders(model, orders)
    warmup = tuple(warmup_count(o) for o in orders)
    plan = Plan(schedule="pipemorph", warmup=warmup, orders=orders, model=model)
    return SearchResult(plan, final_ms, best, seed_ms, used, budget)


def search(
    model: CostModel,
    *,
    links: LinkModel | None = None,
    depth: int | None = None,
    time_budget_ms: float | None = None,
    seeds: Sequence[Sequence[int]] | None = None,
) -> Plan:
    """Best plan (lowest simulated makespan under ``links``/``depth``) within ``model.memory``.

    ``time_budget_ms`` (default: :func:`default_budget_ms`) is turned into a deterministic number
    of candidate evaluations; ``seeds`` adds warm-up vectors to Alg. 1/Alg. 2/ZB-H1/ZB-H2.
    """
    return search_detailed(model, links=links, depth=depth, time_budget_ms=time_budget_ms, seeds=seeds).plan
