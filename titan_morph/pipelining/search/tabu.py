"""The search's order worker (:mod:`driver`): tabu search on fixed orders, as for job shops.

The disjunctive graph has one chain per rank (its order) and message arcs weighted by the link
delays; an op's head is its start and its tail the longest path from its start to the end
(:func:`tail_state`). Moves are insertions inside the critical blocks (runs of back-to-back ops on a
critical path, :func:`critical_blocks`: only reordering there can shorten it), ranked by a
head/tail estimate of the new makespan (:func:`estimate`) and then timed exactly. Valid moves keep
F < I < W per stage and microbatch and the in-flight count within the rank's budget
(:func:`insertion_ok`); in the V they never pass an op of the same microbatch on the rank.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from typing import TypeVar

from titan_morph.pipelining.core.codes import CHUNK, OP_F, OP_I, OP_W, Code
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.search.score import EPS, RNG_SEED, SearchState, Topology, better
from titan_morph.pipelining.timing.timeline import Timeline

__all__ = [
    "stage_ok",
    "critical_blocks",
    "positions",
    "move",
    "perturb",
    "durations_of",
    "tail_state",
    "TailState",
    "insertion_ok",
    "estimate",
    "block_insertions",
    "tabu_worker",
]

_T = TypeVar("_T")


def stage_ok(order: Sequence[Code], cap: int) -> bool:
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


def critical_blocks(
    codes: Sequence[Sequence[Code]], tl: Timeline, topo: Topology, index: Sequence[dict[Code, int]] | None = None
) -> list[tuple[int, int, int]]:
    """Blocks (rank, first, last position) of back-to-back ops on one critical path (job-shop
    style): only reordering inside such a block can shorten that path. An op that did not start
    right after its rank's previous op (and its send) started when its input arrived, so the
    path continues at the op that produced the input. ``index``: per rank, each op's position
    (:func:`positions`; built here when not given)."""
    assert tl.blocked is not None
    last = topo.last
    if index is None:
        index = positions(codes)
    r, p = max(((r, len(o) - 1) for r, o in enumerate(codes) if o), key=lambda rp: tl.end[rp[0]][rp[1]])
    blocks: list[tuple[int, int, int]] = []
    block_end = p
    while True:
        t = tl.start[r][p]
        if p > 0 and abs(tl.end[r][p - 1] + tl.blocked[r][p - 1] - t) <= EPS * max(1.0, t):
            p -= 1
            continue
        if block_end > p:
            blocks.append((r, p, block_end))
        c, m = codes[r][p]
        kind, s = c % CHUNK, topo.stage(r, c)
        if t <= EPS or kind == OP_W:
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


def positions(codes: Sequence[Sequence[Code]]) -> list[dict[Code, int]]:
    """Per rank, the position of each op in its order."""
    return [{op: p for p, op in enumerate(o)} for o in codes]


def move(order: Sequence[_T], i: int, j: int) -> list[_T]:
    """``order`` with its op at ``i`` moved to position ``j``."""
    out = list(order)
    op = out.pop(i)
    out.insert(j, op)
    return out


def perturb(cur: list[list[Code]], caps: Sequence[int], rng: random.Random, swaps: int) -> list[list[Code]]:
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
            if stage_ok(cand, caps[s]):
                out[s] = cand
                break
    return out


def durations_of(model: CostModel, codes: Sequence[Sequence[Code]]) -> list[list[float]]:
    out = []
    for r, order in enumerate(codes):
        table: list[float] = []
        for q in model.rank_stages(r):
            table += [model.fwd[q], model.bwd[q], model.wgt[q], model.bwd[q] + model.wgt[q]]
        out.append([table[c] for c, _ in order])
    return out


TailState = tuple[list[list[float]], list[list[float]], list[list[float]], list[list[float]]]
"""What :func:`tail_state` returns: per rank and position q and qj, and per stage and microbatch
the q of its F and of its I (the message successors' tails)."""


def tail_state(
    codes: Sequence[Sequence[Code]],
    dur: Sequence[Sequence[float]],
    delays: tuple[Sequence[float], Sequence[float]],
    microbatches: int,
    topo: Topology,
    resume: tuple[TailState, int, int, int] | None = None,
) -> TailState:
    """Per op: q = the longest path from its start to the end of the schedule (its duration
    included), and qj = the part of it through its message successor (delay + successor's q; 0
    for W and at the ends of the pipeline); and per stage and microbatch the q of its F and its I.
    Static non-blocking delays. The mirror image of :func:`timeline.time_codes`: each rank's order
    is walked backwards, waiting where a message successor's q is not known yet.

    ``resume = (state, rank, lo, hi)``: ``state`` of the same orders and delays except ``rank``'s
    ops at lo..hi (reordered among themselves).
    An op whose tail, less its own duration, is shorter than the op at hi + 1's cannot reach a
    moved op, so its q stays; only the others are walked again (the same result as a full walk)."""
    df, db = topo.hop_delays(delays)
    S = len(topo.rank)
    last = S - 1
    pos = [len(o) - 1 for o in codes]
    if resume is not None:
        (q, qj, q_f, q_i), moved, lo, hi = resume
        cut = q[moved][hi + 1] if hi + 1 < len(q[moved]) else 0.0
        walk = [_walk_from(q_r, qj_r, cut) for q_r, qj_r in zip(q, qj)]
        walk[moved] = max(walk[moved], hi)
        if 3 * sum(walk) > 2 * sum(pos):  # less than a third kept: a full walk is cheaper
            resume = None
    if resume is None:
        q = [[0.0] * len(o) for o in codes]
        qj = [[0.0] * len(o) for o in codes]
        q_f = [[-1.0] * microbatches for _ in range(S)]
        q_i = [[-1.0] * microbatches for _ in range(S)]
    else:
        q, qj = [row[:] for row in q], [row[:] for row in qj]
        q_f, q_i = [row[:] for row in q_f], [row[:] for row in q_i]
        pos = walk
        for own, order, p in zip(topo.stages, codes, pos):  # forget the message tails of the ops walked again
            for c, m in order[: p + 1]:
                kind = c % CHUNK
                if kind == OP_F:
                    q_f[own[c // CHUNK]][m] = -1.0
                elif kind == OP_I:
                    q_i[own[c // CHUNK]][m] = -1.0
    wait_f = [-1] * S
    wait_i = [-1] * S
    rank_of = topo.rank
    stack = list(range(len(codes)))
    while stack:
        rank = stack.pop()
        order, d, qs, qjs, own = codes[rank], dur[rank], q[rank], qj[rank], topo.stages[rank]
        p = pos[rank]
        nxt = qs[p + 1] if p + 1 < len(order) else 0.0
        while p >= 0:
            c, m = order[p]
            kind = c & 3  # c % CHUNK: OP_F = 0, OP_I = 1
            s = own[c >> 2]
            if kind == 0:
                if s < last:
                    r = q_f[s + 1][m]
                    if r < 0:
                        wait_f[s] = m
                        break
                    j = df[s] + r
                else:
                    j = 0.0
            elif kind == 1 and s > 0:
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
            if kind == 0:
                q_f[s][m] = nxt
                if s > 0 and wait_f[s - 1] == m:
                    wait_f[s - 1] = -1
                    stack.append(rank_of[s - 1])
            elif kind == 1:
                q_i[s][m] = nxt
                if s < last and wait_i[s + 1] == m:
                    wait_i[s + 1] = -1
                    stack.append(rank_of[s + 1])
            p -= 1
        pos[rank] = p
    return q, qj, q_f, q_i


def _walk_from(q: Sequence[float], qj: Sequence[float], cut: float) -> int:
    """The last position whose op's tail less its duration, max(q[p + 1], qj[p]) (non-increasing
    along the order), is at least ``cut``: the ops after it keep their tails (-1: all of them)."""
    lo, hi = 0, len(q) - 1  # binary search for the last p with max(q[p + 1], qj[p]) >= cut
    found = -1
    while lo <= hi:
        mid = (lo + hi) // 2
        after = q[mid + 1] if mid + 1 < len(q) else 0.0
        if (qj[mid] if qj[mid] > after else after) >= cut:
            found, lo = mid, mid + 1
        else:
            hi = mid - 1
    return found


def insertion_ok(order: Sequence[Code], i: int, j: int, live: Sequence[int], cap: int) -> bool:
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


def estimate(
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
        raise ValueError("estimate needs a timeline timed with detail (its ready times)")
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


def block_insertions(a: int, b: int) -> list[tuple[int, int]]:
    """(from, to) moves of a critical block [a, b] (the N7-style neighbourhood): its last op to
    the nearer earlier slots, its first op to the nearer later slots, and every interior op to
    the block's first or last slot (all within ``TABU_REACH`` positions)."""
    moves = [(b, j) for j in range(b - 1, max(a, b - TABU_REACH) - 1, -1)]
    moves += [(a, j) for j in range(a + 1, min(b, a + TABU_REACH) + 1)]
    for k in range(a + 1, min(b, a + TABU_REACH + 1)):
        moves.append((k, a))
    for k in range(max(a + 1, b - TABU_REACH), b):
        moves.append((k, b))
    return moves


TABU_TENURE = 8
TABU_STALL = 150
TABU_REACH = 12


def _in_flight(order: Sequence[Code], live: int) -> list[int]:
    """Microbatches in flight after each op of ``order``, from ``live`` before it."""
    row = []
    for c, _m in order:
        kind = c & 3  # c % CHUNK
        live += 1 if kind == OP_F else -1 if kind == OP_I else 0
        row.append(live)
    return row


def tabu_worker(state: SearchState) -> Iterator[None]:
    """Tabu search on fixed orders from the best schedule so far. Each step ranks the insertions
    inside the critical blocks by :func:`estimate`, takes the best one whose op was not moved in
    the last few steps (or any move whose estimate beats the best), and evaluates it exactly.
    After a run of steps without a new best it restarts from the best with a seeded perturbation;
    it restarts from the global best whenever the knob worker improves it. Yields per evaluation."""
    obj = state.obj
    model = obj.model
    rng = random.Random(RNG_SEED + 2)
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
        dur: list[list[float]] | None = None  # of cur
        index: list[dict[Code, int]] | None = None  # of cur
        lives: dict[int, list[int]] = {}  # of cur, per rank met in a block: microbatches in flight after each op
        known: TailState | None = None  # tails of cur, or of cur before the move `moved`
        moved: tuple[int, int, int] | None = None
        while state.outside == outside:
            step += 1
            if tl.stuck is not None or stall >= TABU_STALL:
                cur = perturb(own_codes, obj.caps, rng, 2 + rng.randrange(4))
                turn += 1
                score, tl = obj.scored_timeline(cur, turn)
                state.offer(score, cur, None, "orders")
                stall = 0
                tabu.clear()
                dur, index, known, moved = None, None, None, None
                lives = {}
                yield
                continue
            if dur is None or index is None:
                dur, index = durations_of(model, cur), positions(cur)
            if known is None or moved is not None:
                since = None if known is None or moved is None else (known, *moved)
                known = tail_state(cur, dur, obj.tail_delays(turn), model.microbatches, obj.topo, since)
                moved = None
            q, qj = known[0], known[1]
            cands = []
            for s, a, b in critical_blocks(cur, tl, obj.topo, index):
                order = cur[s]
                if s not in lives:
                    lives[s] = _in_flight(order, 0)
                for i, j in block_insertions(a, b):
                    if insertion_ok(order, i, j, lives[s], obj.caps[s]):
                        cands.append((estimate(s, i, j, tl, dur, q, qj), s, i, j))
            cands.sort()
            chosen = None
            for est, s, i, j in cands:
                if tabu.get((s, cur[s][i]), -1) < step or est < own_best[0] - EPS * max(1.0, own_best[0]):
                    chosen = (s, i, j)
                    break
            if chosen is None:
                stall = TABU_STALL
                continue
            s, i, j = chosen
            op = cur[s][i]
            trial = cur[:]
            trial[s] = move(cur[s], i, j)
            res, ttl = obj.scored_timeline(trial, turn, resume=(tl, s, min(i, j)))
            tabu[(s, op)] = step + TABU_TENURE + rng.randrange(4)
            yield
            if not math.isfinite(res[0]):
                continue
            state.offer(res, trial, None, "orders")
            cur, score, tl = trial, res, ttl
            dur = dur[:]
            dur[s] = move(dur[s], i, j)
            moved = (s, min(i, j), max(i, j))
            where = index[s]
            for p in range(moved[1], moved[2] + 1):
                where[cur[s][p]] = p
            if s in lives:  # the count after the moved range is the same
                lo, hi = moved[1], moved[2]
                lives[s][lo : hi + 1] = _in_flight(cur[s][lo : hi + 1], lives[s][lo - 1] if lo else 0)
            if better(res, own_best):
                own_best, own_codes = res, trial
                stall = 0
            else:
                stall += 1
