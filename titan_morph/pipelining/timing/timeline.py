"""The planner's ONE timing routine (:func:`time_codes`): run fixed per-rank orders, in the compact
``(code, microbatch)`` form the search manipulates, as early as possible under link delays.

:mod:`simulate` wraps it with checks, per-op records and the critical path; the search's order
moves (:mod:`search.tabu`), robust planning and the exact reference call it directly. The
execution semantics are :mod:`simulate`'s; messages are timed by :func:`core.layout.arrival`, the
rule the generator uses too.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

from titan_morph.pipelining.core.codes import CHUNK, CODES, KIND_OF, Code
from titan_morph.pipelining.core.layout import Layout, Sends, arrival, layout, queued_sends, static_sends
from titan_morph.pipelining.core.links import LinkModel, StaticDelays
from titan_morph.pipelining.core.model import CostModel, Op, Order

__all__ = ["Timeline", "from_codes", "static_transmit", "time_codes", "to_codes"]


def to_codes(orders: Sequence[Sequence[Op]], model: CostModel | None = None) -> list[list[Code]]:
    """Per-rank orders of :class:`Op` as lists of ``(code, microbatch)`` (``model`` places the
    stages of ops that name one; None: one stage per rank)."""
    codes = CODES
    if model is None or model.stages_per_rank == 1:
        return [[(codes[op.kind], op.mb) for op in order] for order in orders]
    ranks = model.ranks

    def chunk(op: Op) -> int:
        if op.stage is None:
            raise ValueError(f"op {op} must name its stage: the model has {model.stages_per_rank} stages per rank")
        return CHUNK * (op.stage // ranks)

    return [[(codes[op.kind] + chunk(op), op.mb) for op in order] for order in orders]


def from_codes(codes: Sequence[Sequence[Code]], model: CostModel | None = None) -> tuple[Order, ...]:
    """Inverse of :func:`to_codes`."""
    kinds = KIND_OF
    if model is None or model.stages_per_rank == 1:
        return tuple(tuple(Op(kinds[c], m) for c, m in order) for order in codes)
    out = []
    for r, order in enumerate(codes):
        own = model.rank_stages(r)
        out.append(tuple(Op(kinds[c % CHUNK], m, own[c // CHUNK]) for c, m in order))
    return tuple(out)


@dataclass(frozen=True)
class Timeline:
    """Raw result of :func:`time_codes`, indexed ``[rank][position in the order]`` (ms, local time).

    ``makespan`` is ``inf`` and ``stuck`` lists each rank's next position when the orders deadlock.
    ``ready`` (when the op's inputs were there) and ``blocked`` (send blocking after the op) are
    filled only with ``detail=True``.
    """

    makespan: float
    start: list[list[float]]
    end: list[list[float]]
    ready: list[list[float]] | None = None
    blocked: list[list[float]] | None = None
    stuck: tuple[int, ...] | None = None
    carry: _Carry | None = field(default=None, repr=False, compare=False)
    """The run's per-stage, per-microbatch inputs' arrivals (and own F/I ends), kept by runs that
    another can resume from (:func:`time_codes`'s ``resume``)."""


_Carry = tuple[list[list[float]], list[list[float]], list[list[float]], list[list[float]]]


def static_transmit(model: CostModel, links: LinkModel | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(fwd, bwd) per-link transmit times of a static run: the links' own when they are static,
    else the model's (both directions alike)."""
    if isinstance(links, StaticDelays):
        return links.static_transmit
    return model.transmit, model.transmit


def _static_delays(
    model: CostModel, links: LinkModel | None, depth: int | None
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """(fwd, bwd) per-link delays when the run is static, finite and non-blocking, else None."""
    if depth is not None:
        return None
    if links is None:
        cf = cb = model.delays
    elif isinstance(links, StaticDelays):
        cf, cb = links.fwd, links.fwd if links.bwd is None else links.bwd
    else:
        return None
    if any(math.isinf(c) for c in cf) or any(math.isinf(c) for c in cb):
        return None  # the queue path raises LinkDownError with the link and the time
    return cf, cb


def time_codes(
    model: CostModel,
    codes: Sequence[Sequence[Code]],
    *,
    links: LinkModel | None = None,
    delays: tuple[Sequence[float], Sequence[float]] | None = None,
    transmit: tuple[Sequence[float], Sequence[float]] | None = None,
    depth: int | None = None,
    step: int = 0,
    t0: float = 0.0,
    took: Sequence[Sequence[float]] | None = None,
    detail: bool = False,
    resume: tuple[Timeline, int, int] | None = None,
) -> Timeline:
    """Run fixed per-rank orders as early as possible: each op starts when its rank is free and
    its input is there (:mod:`simulate`'s semantics). The ONE timing routine of the planner.

    ``codes`` are trusted (each op once, F before I before W per stage: :func:`simulate` checks).
    Delays: ``delays = (fwd, bwd)`` static per-link values (fastest), else ``links`` (default
    ``StaticDelays(model.delays, transmit=model.transmit)``) looked up at ``t0 + t`` and ``step``.
    ``transmit = (fwd, bwd)``: per-link transmit times with static ``delays`` (default: the static
    links' own, else ``model.transmit``). Static finite delays without ``depth`` take an arithmetic
    branch (delivery = end + c; with a transmit time tau, max(end, wire free) + tau + c, the wire
    then busy until max(end, wire free) + tau: the bandwidth model); anything else sends through
    one :class:`links.LinkQueue` per (link, direction), shared by every hop that crosses the link
    in that direction (per-link FIFO; the V's local hop takes no link). ``took[r][p]`` overrides
    the duration of the op at position p of rank r. Deadlocks give ``makespan = inf`` and ``stuck``.

    ``resume = (timeline, rank, position)``: ``timeline`` timed the same orders under the same
    delays except ``rank``'s from ``position`` on (a local move, as the search makes). Every op that
    started before that rank's op at ``position`` could start cannot depend on a moved op, so it
    keeps its times and only the rest is timed again: the same result as a full run, for less.
    Used on the arithmetic branch without transmit times (where an op's times depend only on its
    predecessors') when ``timeline`` came from it with the same ``detail``; ignored otherwise.
    """
    s_count, r_count = model.stages, model.ranks
    last = s_count - 1
    lay = layout(model)
    sends = _sends(model, lay, links, delays, transmit, depth)
    durs = _durations_by_code(model, lay)
    plain = not sends.queued and not sends.on_wires and took is None  # an op's times depend only on its predecessors'
    state = _start(model, codes, lay, detail, resume if plain else None)
    starts, ends, ready_at, blocked_at, pos, free, (arr_f, arr_b, own_f, own_i) = state
    # The pass: ranks run their orders until an input is missing; a delivery wakes the rank that
    # waits for it (its microbatch in wait_f / wait_b). Hot loop: the arrival rule is inline for
    # direct messages, :func:`arrival` for the others.
    df, db, direct_f, direct_b, qf, qb, txf, txb, wf, wb, wire = sends.tables()
    rank_of, stages_of = lay.rank_of, lay.stages_of
    wait_f = [-1] * s_count  # the microbatch whose F input stage s's rank waits for
    wait_b = [-1] * s_count
    stack = list(range(r_count - 1, -1, -1))
    while stack:
        r = stack.pop()
        order = codes[r]
        p = pos[r]
        t = free[r]
        st, en, dur, mine = starts[r], ends[r], durs[r], stages_of[r]
        tk = took[r] if took is not None else None
        size = len(order)
        while p < size:
            c, m = order[p]
            k = c & 3
            s = mine[c >> 2]
            if k == 0:
                ready = arr_f[s][m]
                if ready < 0:
                    wait_f[s] = m
                    break
            elif k == 2:
                ready = t
            else:
                ready = arr_b[s][m]
                if ready < 0:
                    wait_b[s] = m
                    break
            if ready > t:
                t = ready
            st[p] = t
            t += dur[c] if tk is None else tk[p]
            en[p] = t
            after = t
            if k == 0:
                if s < last:
                    if direct_f[s]:
                        arr_f[s + 1][m] = t + df[s]
                    else:
                        arr_f[s + 1][m], after = arrival(t, qf[s], wire, wf[s], txf[s], df[s], t0, step)
                    if wait_f[s + 1] == m:
                        wait_f[s + 1] = -1
                        stack.append(rank_of[s + 1])
            elif k != 2 and s > 0:
                if direct_b[s]:
                    arr_b[s - 1][m] = t + db[s]
                else:
                    arr_b[s - 1][m], after = arrival(t, qb[s], wire, wb[s], txb[s], db[s], t0, step)
                if wait_b[s - 1] == m:
                    wait_b[s - 1] = -1
                    stack.append(rank_of[s - 1])
            if detail:
                if k == 0:
                    own_f[s][m] = t
                elif k == 1:
                    own_i[s][m] = t
                ready_at[r][p] = own_i[s][m] if k == 2 else own_f[s][m] if k != 0 and s == last else ready
                blocked_at[r][p] = after - t
            t = after
            p += 1
        pos[r] = p
        free[r] = t
    # The result: a rank short of its order's end is stuck (a deadlock).
    ready_t, blocked_t = (ready_at, blocked_at) if detail else (None, None)
    if any(pos[r] < len(codes[r]) for r in range(r_count)):
        return Timeline(math.inf, starts, ends, ready_t, blocked_t, tuple(pos))
    span = max((e[-1] for e in ends if e), default=0.0)
    carry = (arr_f, arr_b, own_f, own_i) if plain else None
    return Timeline(span, starts, ends, ready_t, blocked_t, carry=carry)


def _sends(
    model: CostModel,
    lay: Layout,
    links: LinkModel | None,
    delays: tuple[Sequence[float], Sequence[float]] | None,
    transmit: tuple[Sequence[float], Sequence[float]] | None,
    depth: int | None,
) -> Sends:
    """How :func:`time_codes` times messages: the arithmetic branch for static, finite,
    non-blocking delays (with the wires of the bandwidth model), else one link queue per (link,
    direction) of ``links`` (default ``StaticDelays(model.delays, transmit=model.transmit)``)."""
    if delays is None:
        delays = _static_delays(model, links, depth)
    if delays is None:
        link_model = links if links is not None else StaticDelays(model.delays, transmit=model.transmit)
        if link_model.num_links != model.num_links:
            raise ValueError(f"links model has {link_model.num_links} links, the cost model {model.num_links}")
        return queued_sends(lay, link_model, depth)
    return static_sends(
        lay, model.num_links, delays, transmit if transmit is not None else static_transmit(model, links)
    )


def _durations_by_code(model: CostModel, lay: Layout) -> list[list[float]]:
    """Per rank, the duration of each code (kind + CHUNK * chunk; a fused B is I + W)."""
    durs = []
    for own in lay.stages_of:
        row: list[float] = []
        for s in own:
            row += [model.fwd[s], model.bwd[s], model.wgt[s], model.bwd[s] + model.wgt[s]]
        durs.append(row)
    return durs


_Start = tuple[
    list[list[float]], list[list[float]], list[list[float]], list[list[float]], list[int], list[float], _Carry
]


def _start(
    model: CostModel,
    codes: Sequence[Sequence[Code]],
    lay: Layout,
    detail: bool,
    resume: tuple[Timeline, int, int] | None,
) -> _Start:
    """The pass's state before its first op: (starts, ends, ready, blocked, each rank's next
    position, when each rank is free, the inputs' arrivals). Fresh, or the ops ``resume``'s
    timeline keeps (:func:`_resumed`), when it can be resumed from."""
    s_count, n, r_count = model.stages, model.microbatches, model.ranks
    starts = [[0.0] * len(o) for o in codes]
    ends = [[0.0] * len(o) for o in codes]
    ready_at = [[0.0] * len(o) for o in codes] if detail else []
    blocked_at = [[0.0] * len(o) for o in codes] if detail else []
    pos = [0] * r_count
    free = [0.0] * r_count
    prev = resume[0] if resume is not None else None
    if prev is not None and resume is not None and prev.carry is not None and (prev.ready is not None) == detail:
        carry = _resumed(codes, prev, prev.carry, resume[1], resume[2], lay, starts, ends, pos)
        if carry is not None:
            for r in range(r_count):
                p = pos[r]
                if p:
                    free[r] = ends[r][p - 1]
                    if prev.ready is not None and prev.blocked is not None:
                        ready_at[r][:p] = prev.ready[r][:p]
                        blocked_at[r][:p] = prev.blocked[r][:p]
            return starts, ends, ready_at, blocked_at, pos, free, carry
    arr_f = [[-1.0] * n for _ in range(s_count)]  # delivery of F's input per stage and microbatch
    arr_b = [[-1.0] * n for _ in range(s_count)]  # delivery of I/B's gradient per stage and microbatch
    arr_f[0] = [0.0] * n
    arr_b[s_count - 1] = [0.0] * n  # the last stage's I/B needs only its own F, earlier in its rank's order
    own_f = [[0.0] * n for _ in range(s_count)] if detail else []  # per stage and microbatch: F's end
    own_i = [[0.0] * n for _ in range(s_count)] if detail else []  # ... and I's end (detail's ready)
    return starts, ends, ready_at, blocked_at, pos, free, (arr_f, arr_b, own_f, own_i)


def _resumed(
    codes: Sequence[Sequence[Code]],
    prev: Timeline,
    carry: _Carry,
    rank: int,
    position: int,
    lay: Layout,
    starts: list[list[float]],
    ends: list[list[float]],
    pos: list[int],
) -> _Carry | None:
    """The state of :func:`time_codes` after the ops ``prev`` keeps (those that started before
    ``rank`` was free for its op at ``position``, a prefix of every rank's order): their times
    copied into ``starts``/``ends``, ``pos`` at each rank's first op to time again, and the inputs'
    arrivals of the kept ops only (those of the ops timed again are cleared). None when less than
    a third of the ops would be kept (a full run is then cheaper)."""
    cut = prev.end[rank][position - 1] if position > 0 else 0.0
    keep = [bisect_left(before, cut) for before in prev.start]  # starts are non-decreasing along an order
    keep[rank] = min(keep[rank], position)
    if 3 * sum(keep) < sum(len(o) for o in codes):
        return None
    arr_f = [row[:] for row in carry[0]]
    arr_b = [row[:] for row in carry[1]]
    last = len(lay.rank_of) - 1
    for r, order in enumerate(codes):
        p = pos[r] = keep[r]
        starts[r][:p] = prev.start[r][:p]
        ends[r][:p] = prev.end[r][:p]
        mine = lay.stages_of[r]
        for c, m in order[p:]:
            s = mine[c >> 2]
            if c & 3 == 0:
                if s < last:
                    arr_f[s + 1][m] = -1.0
            elif c & 3 != 2 and s > 0:
                arr_b[s - 1][m] = -1.0
    return arr_f, arr_b, [row[:] for row in carry[2]], [row[:] for row in carry[3]]
