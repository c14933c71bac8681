"""The search's knob worker (:mod:`driver`): hill-climbing over the Alg. 3/4 generator's knobs.

The knobs (:class:`score.Knobs`) are per stage x_s (warm-up quota; non-increasing by
Lemma 1, 1 <= x_s <= N), per rank the in-flight limit (its stages' warm-up <= limit_r <=
min(M_r, N)) and the policy bits (:data:`event_loop.WAIT_W` ...; also :data:`event_loop.PAIR_W` with
two stages per rank), and with delay samples which delay vector the generator plans against.
Moves are ±1 steps in a fixed order (:func:`neighbours`); the worker takes the first improving
one (memoised), restarts from the next-best start, then from seeded kicks of the best local optimum.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from titan_morph.pipelining.schedules.event_loop import PAIR_W, REFILL, WAIT_F, WAIT_W, WAIT_W_FOR_F
from titan_morph.pipelining.search.score import RNG_SEED, Knobs, Objective, SearchState

__all__ = [
    "POLICY_BITS",
    "V_POLICY_BITS",
    "UNIFORM_POLICIES",
    "V_UNIFORM_POLICIES",
    "knob_rank",
    "needs",
    "neighbours",
    "kick",
    "knob_worker",
]

POLICY_BITS = (WAIT_W, WAIT_F, WAIT_W_FOR_F, REFILL)
"""Policy bits the moves flip with one stage per rank."""
V_POLICY_BITS = (*POLICY_BITS, PAIR_W)
"""... and with two stages per rank (the V)."""
UNIFORM_POLICIES = (0, WAIT_W | WAIT_W_FOR_F, WAIT_W | WAIT_F | WAIT_W_FOR_F, REFILL)
"""Policies every rank gets at once in the starts (the first is the builder's own, Alg. 3)."""
V_UNIFORM_POLICIES = (REFILL, 0, REFILL | PAIR_W, REFILL | WAIT_W | WAIT_W_FOR_F, WAIT_W | WAIT_F | WAIT_W_FOR_F)


def knob_rank(k: Knobs, ms: float) -> tuple[float, int, int, int, int]:
    """Knob order: makespan, then less memory, smaller warm-up, fewer policy bits, plan index."""
    return (round(ms, 6), sum(k.limit), sum(k.warmup), sum(k.policy), k.plan)


def needs(x: Sequence[int], stages: Sequence[Sequence[int]]) -> list[int]:
    """Per rank: the warm-up it holds (Σ of its stages' x_s), the least its in-flight limit may be."""
    return [sum(x[s] for s in own) for own in stages]


def neighbours(k: Knobs, obj: Objective, plans: int) -> list[Knobs]:
    """±1 moves in a fixed order: hop slackness Δ_s (x_0..x_s together), one x_s, one rank's cap,
    policy bit flips, the planning vector. A rank's limit follows the warm-up it must hold."""
    caps, topo, n = obj.caps, obj.topo, obj.model.microbatches
    bits = POLICY_BITS if obj.model.stages_per_rank == 1 else V_POLICY_BITS
    x, lim, pol = list(k.warmup), list(k.limit), list(k.policy)
    S = len(x)
    need = needs(x, topo.stages)
    out: list[Knobs] = []

    def add(nx: Sequence[int], nl: Sequence[int]) -> None:
        nx_t = tuple(nx)
        if any(not 1 <= v <= n for v in nx_t):
            return
        if any(nx_t[i] < nx_t[i + 1] for i in range(S - 1)):
            return
        new = needs(nx_t, topo.stages)
        if any(a > c for a, c in zip(new, caps)):
            return
        nl_t = tuple(max(a, min(b, c)) for a, b, c in zip(new, nl, caps))
        out.append(Knobs(nx_t, nl_t, k.policy, k.plan))

    def follow(nx: Sequence[int]) -> list[int]:  # limits moved by the change of each rank's warm-up
        return [v + b - a for v, a, b in zip(lim, need, needs(nx, topo.stages))]

    for i in range(S - 1):  # slackness of hop i: x_0..x_i move together
        for d in (1, -1):
            nx = [v + d if j <= i else v for j, v in enumerate(x)]
            add(nx, follow(nx))
    for i in range(S):
        for d in (1, -1):
            nx = x[:]
            nx[i] += d
            nl = lim[:]
            r = topo.rank[i]
            if nl[r] == need[r]:
                nl[r] += d
            add(nx, nl)
    for r in range(len(lim)):
        for d in (1, -1):
            nl = lim[:]
            nl[r] += d
            if need[r] <= nl[r] <= caps[r]:
                out.append(Knobs(k.warmup, tuple(nl), k.policy, k.plan))
    for r in range(len(pol)):
        for bit in bits:
            np_ = pol[:]
            np_[r] ^= bit
            out.append(Knobs(k.warmup, k.limit, tuple(np_), k.plan))
    for d in (1, -1):
        if 0 <= k.plan + d < plans:
            out.append(Knobs(k.warmup, k.limit, k.policy, k.plan + d))
    return out


def kick(k: Knobs, obj: Objective, plans: int, rng: random.Random) -> Knobs:
    """A random jump from ``k``: a few random neighbour moves (for restarts once seeds run out)."""
    for _ in range(2 + rng.randrange(3)):
        nbs = neighbours(k, obj, plans)
        if not nbs:
            break
        k = nbs[rng.randrange(len(nbs))]
    return k


IDLE_KICKS = 64
"""The knob worker stops after this many kicks in a row that land only on known knobs."""


def knob_worker(state: SearchState, fresh: Sequence[Knobs], seeded: Sequence[Knobs]) -> Iterator[None]:
    """Evaluate ``fresh`` starts, then hill-climb the knobs (first improvement, memoised) from every
    start in rank order, then from seeded kicks of the best local optimum. Yields after each new
    evaluation."""
    obj = state.obj
    plans = len(obj.plan_models)
    for k in fresh:
        state.eval_knobs(k, "knobs")
        yield
    queue = sorted([*seeded, *fresh], key=lambda k: knob_rank(k, state.memo[k]))
    rng = random.Random(RNG_SEED)
    best_local: tuple[tuple[float, int, int, int, int], Knobs] | None = None
    idle = 0
    while True:
        if queue:
            cur = queue.pop(0)
        elif best_local is not None and idle < IDLE_KICKS:
            cur = kick(best_local[1], obj, plans, rng)
            if cur in state.memo:
                idle += 1
                continue
            state.eval_knobs(cur, "knobs")
            idle = 0
            yield
        else:
            return
        cur_rank = knob_rank(cur, state.memo[cur])
        improved = True
        while improved:
            improved = False
            for nb in neighbours(cur, obj, plans):
                if nb in state.memo:
                    continue
                r = knob_rank(nb, state.eval_knobs(nb, "knobs"))
                idle = 0
                yield
                if r < cur_rank:
                    cur, cur_rank = nb, r
                    improved = True
                    break
        if best_local is None or cur_rank < best_local[0]:
            best_local = (cur_rank, cur)
