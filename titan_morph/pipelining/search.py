"""Search beyond the paper's planner (paper §4.2–§4.3, Alg. 1–4; §7.4 compares with the optimum).

Alg. 2 fixes x_i from Eq. 1 alone; that ignores W, heterogeneous stages and memory. The search
looks for the schedule with the lowest makespan (or, given delay samples, the lowest mean makespan:
:mod:`robust`) within the memory budget, with two workers that take turns:

* Knob worker: hill-climbing (first improvement, memoised, fixed neighbour order) over the knobs
  of the Alg. 3/4 generator (:func:`generate.run_generator`): per stage x_s (warm-up quota;
  non-increasing by Lemma 1, 1 <= x_s <= N), per rank the in-flight limit (its stages' warm-up
  <= limit_r <= min(M_r, N)) and the policy bits (:data:`generate.WAIT_W` ...; also
  :data:`generate.PAIR_W` with two stages per rank); with delay samples also which delay vector the
  generator plans against. Restarts from the next-best seed,
  then from seeded kicks of the best local optimum.
* Order worker: tabu search on fixed orders, as for job shops. The disjunctive graph has one chain
  per stage (its order) and message arcs weighted by the link delays; an op's head is its start
  and its tail the longest path from its start to the end (:func:`_tails`). Moves are insertions
  inside the critical blocks (runs of back-to-back ops on a critical path: only reordering there
  can shorten it): a block's last op earlier, its first op later, an interior op to the block's
  first or last slot (e.g. a ``W`` deferred past the block, which is how a stage's ``W``s move out
  of a memory-bound steady phase). Each step ranks the valid moves (F < I < W per microbatch,
  in-flight <= M_i) by a head/tail estimate of the new makespan, takes the best move whose op was
  not moved in the last few steps (unless it beats the best), evaluates it exactly and moves
  there, better or not. It restarts from a perturbation of its best after a run without progress,
  and from the global best when the knob worker improves it.

Every candidate is timed by the planner's one timing routine (:func:`simulate.time_codes`), or,
under static non-blocking links with one delay vector, by the generator's own timeline, which is
the same (tested). Both time links with a transmit time (``model.transmit``, or the static links'
own) as the bandwidth model: one message at a time per wire; the order moves' estimates count a
message as latency + transmit without its queueing, and every move is then timed exactly.

Seeds, always evaluated (so the result is never worse than any of them): every baseline builder
whose warm-up fits the memory budget (1F1B, ZB-H1, ZB-H2, GPipe; 1F1B with split backward times as
1F1B; ZB-V and DualPipeV with two stages per rank), the builder's own PipeMorph plan (Alg. 1/2 +
Alg. 3/4), the plain greedy (x = 1 with the limit at the budget) and the caller's warm-up vectors.
The knob worker then starts with Alg. 2, Alg. 1, the baselines' warm-ups clipped to the budget and
x = 1, each with limit = the rank's warm-up and with limit = the budget, and the same vectors with
uniform policies.

Two stages per rank (the V): the same workers on per-rank orders whose ops carry their stage
(:data:`simulate.CHUNK`); order moves never pass an op of the same microbatch on the rank (which
keeps the V's local hop and each stage's F < I < W), and deadlocking candidates score ``inf``.

Anytime, deterministic and monotone: an iteration is one evaluation (one generator run, or one
timing of fixed orders), the sequence of evaluations depends only on the inputs (every random
choice comes from a fixed-seed generator), never on the iteration count or on the clock, and the
result after k iterations is the best of the seeds and the first k evaluations. Hence the same
inputs and ``iterations`` give the same plan on every run and every rank, and more iterations never
give a worse plan. ``time_budget_ms`` only caps the wall time of the iterations (when it cuts the
search, ``SearchResult.capped`` is True and the plan depends on the machine's speed).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .baselines import build_plain, split_fused, warmup_for
from .generate import PAIR_W, REFILL, WAIT_F, WAIT_W, WAIT_W_FOR_F, run_generator
from .links import LinkModel, StaticDelays
from .model import CostModel, Op, Plan, validate_orders, warmup_counts
from .simulate import CHUNK, OP_F, OP_I, OP_W, Code, Timeline, from_codes, static_transmit, time_codes, to_codes
from .slackness import adapted_warmup, fit_warmup, initial_warmup

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
[:data:`MIN_DEFAULT_ITERATIONS`, :data:`MAX_DEFAULT_ITERATIONS`] (S=8, N=32: 312 iterations)."""
MIN_DEFAULT_ITERATIONS = 8
MAX_DEFAULT_ITERATIONS = 1500
POLICY_BITS = (WAIT_W, WAIT_F, WAIT_W_FOR_F, REFILL)
V_POLICY_BITS = (*POLICY_BITS, PAIR_W)
_UNIFORM_POLICIES = (0, WAIT_W | WAIT_W_FOR_F, WAIT_W | WAIT_F | WAIT_W_FOR_F, REFILL)
_V_UNIFORM_POLICIES = (REFILL, 0, REFILL | PAIR_W, REFILL | WAIT_W | WAIT_W_FOR_F, WAIT_W | WAIT_F | WAIT_W_FOR_F)
_EPS = 1e-9
_PATTERN = (0, 1, 1, 1)
"""Turns of the knob worker (0) and the order worker (1) in the driver's cycle."""
_RNG_SEED = 20260113


def default_iterations(model: CostModel) -> int:
    """Iterations of a search with no explicit count: a fixed amount of work per schedule size."""
    ops = 3 * model.stages * model.microbatches
    return max(MIN_DEFAULT_ITERATIONS, min(MAX_DEFAULT_ITERATIONS, WORK_PER_DEFAULT_SEARCH // ops))


US_PER_OP_ITERATION = 0.85
"""Measured CPU cost of one iteration per scheduled op (µs; 2-core dev box, Python 3.11)."""


def iterations_for_ms(model: CostModel, budget_ms: float) -> int:
    """A deterministic iteration count that takes about ``budget_ms`` of CPU on the reference box
    (:data:`US_PER_OP_ITERATION`): for callers that think in time but need the same plan on every
    rank (pass it as ``iterations``, with no or a generous ``time_budget_ms``)."""
    if not budget_ms > 0:
        raise ValueError(f"budget_ms must be > 0 ms, got {budget_ms}")
    ops = 3 * model.stages * model.microbatches
    return max(1, int(budget_ms * 1000.0 / (US_PER_OP_ITERATION * ops)))


@dataclass(frozen=True, order=True)
class Knobs:
    """One point of the generator's space: per stage x_s, per rank the in-flight cap and the policy
    bits, and the index of the delay vector the generator plans against (0 = the model's delays)."""

    warmup: tuple[int, ...]
    limit: tuple[int, ...]
    policy: tuple[int, ...]
    plan: int = 0


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


# ---------------------------------------------------------------------------------------------
# What a candidate is scored by
# ---------------------------------------------------------------------------------------------


class _Objective:
    """Scores candidates: the makespan under one link model, or the mean over delay scenarios.
    Every generator run and every timing counts as one evaluation (``evaluations``)."""

    def __init__(
        self,
        model: CostModel,
        links: LinkModel | None,
        depth: int | None,
        scenarios: Sequence[Sequence[float]] | None,
        plan_vectors: Sequence[Sequence[float]],
    ) -> None:
        self.model = model
        self.links = links
        self.depth = depth
        self.caps = tuple(model.budget(r) for r in range(model.ranks))
        self.topo = _Topology(model)
        self.bits = POLICY_BITS if model.stages_per_rank == 1 else V_POLICY_BITS
        self.plan_models = [model.with_delays(v) for v in plan_vectors]
        self.static: list[tuple[tuple[float, ...], tuple[float, ...]]] | None
        self.transmit = static_transmit(model, links)  # per-message transmit times of static runs
        if scenarios is not None:
            self.static = [(tuple(v), tuple(v)) for v in scenarios]
        elif depth is None and (links is None or isinstance(links, StaticDelays)):
            cf = model.delays if links is None else links.fwd
            cb = model.delays if links is None else links.fwd if links.bwd is None else links.bwd
            self.static = [(tuple(cf), tuple(cb))]
        else:
            self.static = None
        # One static vector equal to the planning delays: the generator's timeline is the score.
        self.own_timeline = (
            self.static is not None
            and len(self.static) == 1
            and self.static[0] == (model.delays, model.delays)
            and self.transmit == (model.transmit, model.transmit)
            and len(self.plan_models) == 1
            and self.plan_models[0].delays == model.delays
        )
        self.evaluations = 0

    def knobs(self, k: Knobs, record: bool = False) -> tuple[tuple[float, float], list[list[Code]] | None]:
        """Generate the schedule of ``k``: ((score, secondary), orders). With the generator's own
        timeline the secondary is unknown (``inf``) and orders come only with ``record``."""
        self.evaluations += 1
        if self.own_timeline:
            ms, codes = run_generator(self.model, k.warmup, k.limit, k.policy, record=record)
            return (ms, math.inf), codes
        _, codes = run_generator(self.plan_models[k.plan], k.warmup, k.limit, k.policy)
        if codes is None:
            return (math.inf, math.inf), None
        return self._score(codes), codes

    def orders(self, codes: Sequence[Sequence[Code]]) -> tuple[float, float]:
        """(score, Σ stage finish times) of fixed orders; ``inf`` on deadlock."""
        self.evaluations += 1
        return self._score(codes)

    def _score(self, codes: Sequence[Sequence[Code]]) -> tuple[float, float]:
        if self.static is None:
            tl = time_codes(self.model, codes, links=self.links, depth=self.depth)
            return tl.makespan, _finish_sum(tl)
        total = second = 0.0
        for delays in self.static:
            tl = time_codes(self.model, codes, delays=delays, transmit=self.transmit)
            if tl.stuck is not None:
                return math.inf, math.inf
            total += tl.makespan
            second += _finish_sum(tl)
        k = len(self.static)
        return total / k, second / k

    def scored_timeline(self, codes: Sequence[Sequence[Code]], which: int) -> tuple[tuple[float, float], Timeline]:
        """(score, secondary) and the detailed timeline under scenario ``which`` (cycled): one
        evaluation."""
        self.evaluations += 1
        if self.static is None:
            tl = time_codes(self.model, codes, links=self.links, depth=self.depth, detail=True)
            return (tl.makespan, _finish_sum(tl)), tl
        pick = which % len(self.static)
        total = second = 0.0
        chosen: Timeline | None = None
        for k, delays in enumerate(self.static):
            tl = time_codes(self.model, codes, delays=delays, transmit=self.transmit, detail=k == pick)
            if tl.stuck is not None:
                return (math.inf, math.inf), tl
            if k == pick:
                chosen = tl
            total += tl.makespan
            second += _finish_sum(tl)
        assert chosen is not None
        n = len(self.static)
        return (total / n, second / n), chosen

    def tail_delays(self, which: int) -> tuple[Sequence[float], Sequence[float]]:
        """Static per-link delays (fwd, bwd) the move estimates assume (scenario ``which``), each
        plus the link's transmit time (a message's cost when it does not queue)."""
        static = self.static
        cf, cb = (self.model.delays, self.model.delays) if static is None else static[which % len(static)]
        tf, tb = self.transmit
        return [c + t for c, t in zip(cf, tf)], [c + t for c, t in zip(cb, tb)]


def _finish_sum(tl: Timeline) -> float:
    return sum(e[-1] for e in tl.end if e) if tl.stuck is None else math.inf


# ---------------------------------------------------------------------------------------------
# Order moves (fixed orders)
# ---------------------------------------------------------------------------------------------


def _stage_ok(order: Sequence[Code], cap: int) -> bool:
    """F before I before W per stage and microbatch, and at most ``cap`` microbatches in flight."""
    seen_f: set[tuple[int, int]] = set()
    seen_i: set[tuple[int, int]] = set()
    live = 0
    for c, m in order:
        kind, key = c % CHUNK, (c // CHUNK, m)
        if kind == OP_F:
            live += 1
            if live > cap:
                return False
            seen_f.add(key)
        elif kind == OP_I:
            if key not in seen_f:
                return False
            live -= 1
            seen_i.add(key)
        elif key not in seen_i:
            return False
    return True


class _Topology:
    """Where stages run, for the order moves: per stage its rank and its code offset (CHUNK·chunk),
    per hop the static delay of its message (0 on the V's local hop)."""

    def __init__(self, model: CostModel) -> None:
        self.last = model.stages - 1
        self.rank = [model.rank_of(s) for s in range(model.stages)]
        self.stages = [model.rank_stages(r) for r in range(model.ranks)]
        self.offset = [0] * model.stages
        for own in self.stages:
            for k, stage in enumerate(own):
                self.offset[stage] = CHUNK * k
        self.route_f, self.route_b = model.routes()

    def stage(self, r: int, code: int) -> int:
        return self.stages[r][code // CHUNK]

    def hop_delays(self, delays: tuple[Sequence[float], Sequence[float]]) -> tuple[list[float], list[float]]:
        """Per stage: the delay of its F's message and of its I's message under (fwd, bwd) link delays."""
        cf, cb = delays
        df = [0.0 if rt is None else (cb if rt[1] else cf)[rt[0]] for rt in self.route_f]
        db = [0.0 if rt is None else (cb if rt[1] else cf)[rt[0]] for rt in self.route_b]
        return df, db


def _critical_blocks(codes: Sequence[Sequence[Code]], tl: Timeline, topo: _Topology) -> list[tuple[int, int, int]]:
    """Blocks (rank, first, last position) of back-to-back ops on one critical path (job-shop
    style): only reordering inside such a block can shorten that path. An op that did not start
    right after its rank's previous op (and its send) started when its input arrived, so the
    path continues at the op that produced the input."""
    assert tl.blocked is not None
    last = topo.last
    index: list[dict[Code, int]] = [{op: p for p, op in enumerate(o)} for o in codes]
    r, p = max(((r, len(o) - 1) for r, o in enumerate(codes) if o), key=lambda rp: tl.end[rp[0]][rp[1]])
    blocks: list[tuple[int, int, int]] = []
    block_end = p
    while True:
        t = tl.start[r][p]
        if p > 0 and abs(tl.end[r][p - 1] + tl.blocked[r][p - 1] - t) <= _EPS * max(1.0, t):
            p -= 1
            continue
        if block_end > p:
            blocks.append((r, p, block_end))
        c, m = codes[r][p]
        kind, s = c % CHUNK, topo.stage(r, c)
        if t <= _EPS or kind == OP_W:
            break
        if kind == OP_F:
            if s == 0:
                break
            r = topo.rank[s - 1]
            p = index[r][(OP_F + topo.offset[s - 1], m)]
        elif s < last:
            r = topo.rank[s + 1]
            p = index[r][(OP_I + topo.offset[s + 1], m)]
        else:
            p = index[r][(OP_F + topo.offset[s], m)]
        block_end = p
    return blocks


def _move(order: Sequence[Code], i: int, j: int) -> list[Code]:
    out = list(order)
    op = out.pop(i)
    out.insert(j, op)
    return out


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Lexicographic (score, secondary) comparison with a float tolerance (``inf`` = unknown)."""
    tol = _EPS * max(1.0, abs(b[0])) if math.isfinite(b[0]) else 0.0
    if a[0] < b[0] - tol:
        return True
    if a[0] > b[0] + tol or not math.isfinite(a[1]):
        return False
    return not math.isfinite(b[1]) or a[1] < b[1] - _EPS * max(1.0, abs(b[1]))


# ---------------------------------------------------------------------------------------------
# Search state and the two workers
# ---------------------------------------------------------------------------------------------


class _State:
    """Best schedule so far (shared by the workers) and the knob memo."""

    def __init__(self, objective: _Objective) -> None:
        self.obj = objective
        self.best: tuple[float, float] = (math.inf, math.inf)
        self.best_codes: list[list[Code]] | None = None
        self.best_knobs: Knobs | None = None
        self.best_by = ""
        self.outside = 0  # bumped when the best comes from anything but the order worker
        self.memo: dict[Knobs, float] = {}

    def offer(self, score: tuple[float, float], codes: list[list[Code]] | None, knobs: Knobs | None, by: str) -> None:
        """Take ``score`` as the new best if it is better (orders regenerated from knobs if needed)."""
        if not _better(score, self.best):
            return
        if codes is None:
            assert knobs is not None
            _, codes = self.obj.knobs(knobs, record=True)
            self.obj.evaluations -= 1  # regenerating a schedule already scored is not a new evaluation
            assert codes is not None
            score = (score[0], self.obj._score(codes)[1])
        self.best, self.best_codes, self.best_knobs, self.best_by = score, codes, knobs, by
        if by != "orders":
            self.outside += 1

    def eval_knobs(self, k: Knobs, by: str) -> float:
        """Score of knobs ``k`` (memoised), offered as a new best."""
        if k in self.memo:
            return self.memo[k]
        score, codes = self.obj.knobs(k)
        self.memo[k] = score[0]
        if math.isfinite(score[0]):
            self.offer(score, codes, k, by)
        return score[0]


def _rank(k: Knobs, ms: float) -> tuple[float, int, int, int, int]:
    """Knob order: makespan, then less memory, smaller warm-up, fewer policy bits, plan index."""
    return (round(ms, 6), sum(k.limit), sum(k.warmup), sum(k.policy), k.plan)


def _needs(x: Sequence[int], stages: Sequence[Sequence[int]]) -> list[int]:
    """Per rank: the warm-up it holds (Σ of its stages' x_s), the least its in-flight limit may be."""
    return [sum(x[s] for s in own) for own in stages]


def _neighbours(k: Knobs, obj: _Objective, plans: int) -> list[Knobs]:
    """±1 moves in a fixed order: hop slackness Δ_s (x_0..x_s together), one x_s, one rank's cap,
    policy bit flips, the planning vector. A rank's limit follows the warm-up it must hold."""
    caps, topo, n = obj.caps, obj.topo, obj.model.microbatches
    x, lim, pol = list(k.warmup), list(k.limit), list(k.policy)
    S = len(x)
    need = _needs(x, topo.stages)
    out: list[Knobs] = []

    def add(nx: Sequence[int], nl: Sequence[int]) -> None:
        nx_t = tuple(nx)
        if any(not 1 <= v <= n for v in nx_t):
            return
        if any(nx_t[i] < nx_t[i + 1] for i in range(S - 1)):
            return
        new = _needs(nx_t, topo.stages)
        if any(a > c for a, c in zip(new, caps)):
            return
        nl_t = tuple(max(a, min(b, c)) for a, b, c in zip(new, nl, caps))
        out.append(Knobs(nx_t, nl_t, k.policy, k.plan))

    def follow(nx: Sequence[int]) -> list[int]:  # limits moved by the change of each rank's warm-up
        return [v + b - a for v, a, b in zip(lim, need, _needs(nx, topo.stages))]

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
        for bit in obj.bits:
            np_ = pol[:]
            np_[r] ^= bit
            out.append(Knobs(k.warmup, k.limit, tuple(np_), k.plan))
    for d in (1, -1):
        if 0 <= k.plan + d < plans:
            out.append(Knobs(k.warmup, k.limit, k.policy, k.plan + d))
    return out


def _kick(k: Knobs, obj: _Objective, plans: int, rng: random.Random) -> Knobs:
    """A random jump from ``k``: a few random neighbour moves (for restarts once seeds run out)."""
    for _ in range(2 + rng.randrange(3)):
        nbs = _neighbours(k, obj, plans)
        if not nbs:
            break
        k = nbs[rng.randrange(len(nbs))]
    return k


_IDLE_KICKS = 64
"""The knob worker stops after this many kicks in a row that land only on known knobs."""


def _knob_worker(state: _State, fresh: Sequence[Knobs], seeded: Sequence[Knobs]) -> Iterator[None]:
    """Evaluate ``fresh`` starts, then hill-climb the knobs (first improvement, memoised) from every
    start in rank order, then from seeded kicks of the best local optimum. Yields after each new
    evaluation."""
    obj = state.obj
    plans = len(obj.plan_models)
    for k in fresh:
        state.eval_knobs(k, "knobs")
        yield
    queue = sorted([*seeded, *fresh], key=lambda k: _rank(k, state.memo[k]))
    rng = random.Random(_RNG_SEED)
    best_local: tuple[tuple[float, int, int, int, int], Knobs] | None = None
    idle = 0
    while True:
        if queue:
            cur = queue.pop(0)
        elif best_local is not None and idle < _IDLE_KICKS:
            cur = _kick(best_local[1], obj, plans, rng)
            if cur in state.memo:
                idle += 1
                continue
            state.eval_knobs(cur, "knobs")
            idle = 0
            yield
        else:
            return
        cur_rank = _rank(cur, state.memo[cur])
        improved = True
        while improved:
            improved = False
            for nb in _neighbours(cur, obj, plans):
                if nb in state.memo:
                    continue
                r = _rank(nb, state.eval_knobs(nb, "knobs"))
                idle = 0
                yield
                if r < cur_rank:
                    cur, cur_rank = nb, r
                    improved = True
                    break
        if best_local is None or cur_rank < best_local[0]:
            best_local = (cur_rank, cur)


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


# ---------------------------------------------------------------------------------------------
# Tabu search on fixed orders (critical-block insertions ranked by a head/tail estimate)
# ---------------------------------------------------------------------------------------------


def _durations_of(model: CostModel, codes: Sequence[Sequence[Code]]) -> list[list[float]]:
    out = []
    for r, order in enumerate(codes):
        table: list[float] = []
        for q in model.rank_stages(r):
            table += [model.fwd[q], model.bwd[q], model.wgt[q], model.bwd[q] + model.wgt[q]]
        out.append([table[c] for c, _ in order])
    return out


def _tails(
    codes: Sequence[Sequence[Code]],
    dur: Sequence[Sequence[float]],
    delays: tuple[Sequence[float], Sequence[float]],
    microbatches: int,
    topo: _Topology,
) -> tuple[list[list[float]], list[list[float]]]:
    """Per op: q = the longest path from its start to the end of the schedule (its duration
    included), and qj = the part of it through its message successor (delay + successor's q; 0
    for W and at the ends of the pipeline). Static non-blocking delays. The mirror image of
    :func:`simulate.time_codes`: each rank's order is walked backwards, waiting where a message
    successor's q is not known yet."""
    df, db = topo.hop_delays(delays)
    S = len(topo.rank)
    last = S - 1
    q = [[0.0] * len(o) for o in codes]
    qj = [[0.0] * len(o) for o in codes]
    q_f = [[-1.0] * microbatches for _ in range(S)]
    q_i = [[-1.0] * microbatches for _ in range(S)]
    wait_f = [-1] * S
    wait_i = [-1] * S
    pos = [len(o) - 1 for o in codes]
    stack = list(range(len(codes)))
    while stack:
        rank = stack.pop()
        order, d, qs, qjs, own = codes[rank], dur[rank], q[rank], qj[rank], topo.stages[rank]
        p = pos[rank]
        nxt = qs[p + 1] if p + 1 < len(order) else 0.0
        while p >= 0:
            c, m = order[p]
            kind, s = c % CHUNK, own[c // CHUNK]
            if kind == OP_F:
                if s < last:
                    r = q_f[s + 1][m]
                    if r < 0:
                        wait_f[s] = m
                        break
                    j = df[s] + r
                else:
                    j = 0.0
            elif kind == OP_I and s > 0:
                r = q_i[s - 1][m]
                if r < 0:
                    wait_i[s] = m
                    break
                j = db[s] + r
            else:
                j = 0.0
            nxt = d[p] + (j if j > nxt else nxt)
            qs[p] = nxt
            qjs[p] = j
            if kind == OP_F:
                q_f[s][m] = nxt
                if s > 0 and wait_f[s - 1] == m:
                    wait_f[s - 1] = -1
                    stack.append(topo.rank[s - 1])
            elif kind == OP_I:
                q_i[s][m] = nxt
                if s < last and wait_i[s + 1] == m:
                    wait_i[s + 1] = -1
                    stack.append(topo.rank[s + 1])
            p -= 1
        pos[rank] = p
    return q, qj


def _insertion_ok(order: Sequence[Code], i: int, j: int, live: Sequence[int], cap: int) -> bool:
    """Can the op at ``i`` move to ``j``: it passes no op of its own microbatch (F < I < W; in the
    V also the rank's other stage), and the in-flight count (``live[p]`` after position p) stays
    within ``cap``."""
    c, m = order[i]
    c %= CHUNK
    lo, hi = (j, i - 1) if j < i else (i + 1, j)
    for k in range(lo, hi + 1):
        if order[k][1] == m:
            return False
    if c == OP_F and j < i:  # one more in flight from j on, until the old position
        base = live[j - 1] if j > 0 else 0
        return max(base, max(live[j:i])) + 1 <= cap
    if c == OP_I and j > i:  # one more in flight between the old and the new position
        return max(live[i + 1 : j + 1]) + 1 <= cap
    return True


def _estimate(
    s: int,
    i: int,
    j: int,
    tl: Timeline,
    dur: Sequence[Sequence[float]],
    q: Sequence[Sequence[float]],
    qj: Sequence[Sequence[float]],
) -> float:
    """Makespan estimate after moving the op at ``i`` to ``j`` on stage ``s``: the longest path
    through the reordered range, from the new heads (release = input arrival, or the previous op)
    and new tails (message successor, or the next op) of its ops."""
    lo, hi = (j, i) if j < i else (i, j)
    idx = list(range(lo, hi + 1))
    idx.remove(i)
    idx.insert(j - lo, i)
    if tl.ready is None:
        raise ValueError("_estimate needs a timeline timed with detail (its ready times)")
    rel, d, qjs = tl.ready[s], dur[s], qj[s]
    t = tl.end[s][lo - 1] if lo > 0 else 0.0
    heads = []
    for k in idx:
        r = rel[k]
        if r > t:
            t = r
        heads.append(t)
        t += d[k]
    n = len(q[s])
    tail = q[s][hi + 1] if hi + 1 < n else 0.0
    best = 0.0
    for pos in range(len(idx) - 1, -1, -1):
        k = idx[pos]
        a = qjs[k]
        tail = d[k] + (a if a > tail else tail)
        v = heads[pos] + tail
        if v > best:
            best = v
    return best


def _block_insertions(a: int, b: int) -> list[tuple[int, int]]:
    """(from, to) moves of a critical block [a, b] (the N7-style neighbourhood): its last op to
    the nearer earlier slots, its first op to the nearer later slots, and every interior op to
    the block's first or last slot (all within ``_TABU_REACH`` positions)."""
    moves = [(b, j) for j in range(b - 1, max(a, b - _TABU_REACH) - 1, -1)]
    moves += [(a, j) for j in range(a + 1, min(b, a + _TABU_REACH) + 1)]
    for k in range(a + 1, min(b, a + _TABU_REACH + 1)):
        moves.append((k, a))
    for k in range(max(a + 1, b - _TABU_REACH), b):
        moves.append((k, b))
    return moves


_TABU_TENURE = 8
_TABU_STALL = 150
_TABU_REACH = 12


def _tabu_worker(state: _State) -> Iterator[None]:
    """Tabu search on fixed orders from the best schedule so far. Each step ranks the insertions
    inside the critical blocks by :func:`_estimate`, takes the best one whose op was not moved in
    the last few steps (or any move whose estimate beats the best), and evaluates it exactly.
    After a run of steps without a new best it restarts from the best with a seeded perturbation;
    it restarts from the global best whenever the knob worker improves it. Yields per evaluation."""
    obj = state.obj
    model = obj.model
    rng = random.Random(_RNG_SEED + 2)
    turn = 0
    while state.best_codes is not None:
        outside = state.outside
        cur = [o[:] for o in state.best_codes]
        score, tl = obj.scored_timeline(cur, turn)
        yield
        own_best = score
        own_codes = cur
        stall = 0
        step = 0
        tabu: dict[tuple[int, Code], int] = {}
        while state.outside == outside:
            step += 1
            if tl.stuck is not None or stall >= _TABU_STALL:
                cur = _perturb(own_codes, obj.caps, rng, 2 + rng.randrange(4))
                turn += 1
                score, tl = obj.scored_timeline(cur, turn)
                state.offer(score, cur, None, "orders")
                stall = 0
                tabu.clear()
                yield
                continue
            dur = _durations_of(model, cur)
            q, qj = _tails(cur, dur, obj.tail_delays(turn), model.microbatches, obj.topo)
            cands = []
            lives: dict[int, list[int]] = {}
            for s, a, b in _critical_blocks(cur, tl, obj.topo):
                order = cur[s]
                if s not in lives:
                    acc, row = 0, []
                    for c, _ in order:
                        acc += 1 if c % CHUNK == OP_F else -1 if c % CHUNK == OP_I else 0
                        row.append(acc)
                    lives[s] = row
                for i, j in _block_insertions(a, b):
                    if _insertion_ok(order, i, j, lives[s], obj.caps[s]):
                        cands.append((_estimate(s, i, j, tl, dur, q, qj), s, i, j))
            cands.sort()
            chosen = None
            for est, s, i, j in cands:
                if tabu.get((s, cur[s][i]), -1) < step or est < own_best[0] - _EPS * max(1.0, own_best[0]):
                    chosen = (s, i, j)
                    break
            if chosen is None:
                stall = _TABU_STALL
                continue
            s, i, j = chosen
            op = cur[s][i]
            trial = cur[:]
            trial[s] = _move(cur[s], i, j)
            res, ttl = obj.scored_timeline(trial, turn)
            tabu[(s, op)] = step + _TABU_TENURE + rng.randrange(4)
            yield
            if not math.isfinite(res[0]):
                continue
            state.offer(res, trial, None, "orders")
            cur, score, tl = trial, res, ttl
            if _better(res, own_best):
                own_best, own_codes = res, trial
                stall = 0
            else:
                stall += 1


# ---------------------------------------------------------------------------------------------
# Seeds and the driver
# ---------------------------------------------------------------------------------------------


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
    objective: _Objective, extra: Sequence[Sequence[int]] | None
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
            knobs = Knobs(x, caps if full else tuple(_needs(x, objective.topo.stages)), base, plan)
            if knobs not in seen:
                seen.add(knobs)
                group.append((name, knobs))
    return out


def _base_policy(model: CostModel) -> int:
    """The policy of the builder's own plan: the paper's Alg. 3, with refill in the V (:mod:`baselines`)."""
    return 0 if model.stages_per_rank == 1 else REFILL


def _baseline_seeds(objective: _Objective) -> list[tuple[str, list[list[Code]]]]:
    """The baseline builders' plans (under the planning delays) whose warm-up fits the budget."""
    out = []
    model = objective.plan_models[0]
    names = ("1f1b", "zb-h1", "zb-h2", "gpipe") if model.stages_per_rank == 1 else ("zb-v", "dualpipe-v")
    for name in names:
        try:
            plan = build_plain(name, model)
        except ValueError:  # the warm-up needs more than the memory budget
            continue
        out.append((name, to_codes(split_fused(plan.orders), model)))
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
    objective = _Objective(model, links, depth, scenarios, vectors)
    state = _State(objective)

    seed_scores: dict[str, float] = {}
    extra: list[tuple[str, list[list[Code]]]] = []
    for name, orders in extra_orders or ():
        validate_orders(model, orders)
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
    uniform = _UNIFORM_POLICIES if model.stages_per_rank == 1 else _V_UNIFORM_POLICIES
    fresh += [Knobs(k.warmup, k.limit, (pol,) * model.ranks, k.plan) for pol in uniform[1:] for k in base]
    workers = [_knob_worker(state, fresh, [k for _, k in must]), _tabu_worker(state)]
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
    orders = from_codes(state.best_codes, model)
    validate_orders(model, orders)
    plan_model = model if scenarios is None else model.with_delays(vectors[0])
    name = "pipemorph" if model.stages_per_rank == 1 else "pipemorph-v"
    plan = Plan(schedule=name, warmup=warmup_counts(model, orders), orders=orders, model=plan_model)
    return SearchResult(plan, state.best[0], state.best_knobs, seed_scores, used, capped, state.best_by)


def search(model: CostModel, **options: Any) -> Plan:
    """Best plan (lowest makespan under ``links``/``depth``, timed by :func:`simulate.time_codes`)
    within ``model.memory``: :func:`search_detailed`'s plan, same options.

    ``iterations`` (default :func:`default_iterations`) fixes the work: the plan depends only on
    the inputs and this count, and more iterations never give a worse plan. ``time_budget_ms``
    caps the wall time (module docstring). ``seeds`` adds warm-up vectors to the built-in seeds.
    """
    return search_detailed(model, **options).plan
