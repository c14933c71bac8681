"""The planner's ONE timing routine: run FIXED per-stage orders under link delays (paper §3, Fig. 5).

A plan is made for the delays it was planned with; at run time the delays are whatever the
network does. This module answers "what happens to *these* orders under *those* delays": each
op's start/end, the makespan, per-stage bubble rate and a critical-path explanation. It is the
engine behind the paper's Fig. 5 numbers (ZB-H2 orders planned for no delay: 390 ms; executed
with c_0 = 10 ms: 400 ms; c_0 = 20 ms: 440 ms). :func:`time_codes` is the routine itself;
:func:`simulate` (records, critical path) and :func:`makespan` wrap it, and the search, robust
planning and the exact reference time orders with it too. Static, finite, non-blocking delays
take an arithmetic branch of the same loop (tested against the link-queue branch).

Execution semantics (shared with the emulator via :mod:`links`):

* A stage runs its order sequentially; an op starts when the stage is free and its inputs are
  there: ``F[s,m]`` needs ``F[s-1,m]`` delivered on link s−1; ``I``/``B[s,m]`` needs the gradient
  of microbatch m delivered by stage s+1 (its ``I`` or ``B``) on link s; ``W`` needs its own ``I``.
* Sends are issued right after the producing op ends (``F`` → ``fwd`` on link s; ``I``/``B`` →
  ``bwd`` on link s−1) through one :class:`links.LinkQueue` per (link, direction). ``depth=None``
  is the non-blocking delegated transport (§5); ``depth=d`` is the NCCL-like FIFO of §3.2: the
  sending stage is blocked until its message is accepted (head-of-line blocking).
* Bandwidth (:mod:`links`): a link with a transmit time tau per message sends one message at a
  time per direction, in issue order; arrival = max(send, end of the previous transmission) + tau
  + latency. tau = 0 is the delay-only model and times bit for bit as before.
* An order that cannot complete raises :class:`DeadlockError` naming the stuck ops.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from titan_morph.pipelining.deadlock import DeadlockError, deadlock_error
from titan_morph.pipelining.layout import Layout, layout, wires
from titan_morph.pipelining.links import LinkModel, LinkQueue, StaticDelays
from titan_morph.pipelining.model import CostModel, Op, Order, validate_orders

__all__ = ["DeadlockError", "OpTiming", "CriticalStep", "SimResult", "simulate", "makespan"]

_EPS = 1e-9


@dataclass(frozen=True)
class OpTiming:
    """One executed op. ``ready``: when its inputs were available; ``blocked``: time the stage
    then spent blocked in the send issued after this op (before its next op could start)."""

    stage: int
    op: Op
    start: float
    end: float
    ready: float
    blocked: float


@dataclass(frozen=True)
class CriticalStep:
    """One op on the critical path and why it started when it did.

    ``via``: ``"start"`` (first op, t0), ``"stage"`` (right after the previous op on its stage),
    ``"blocked"`` (after the previous op's send was accepted), ``"link"`` (waited for a message from
    ``from_stage``; ``wait_ms`` = start − producer's end, i.e. link delay plus queueing).
    """

    stage: int
    op: Op
    start: float
    end: float
    via: str
    wait_ms: float = 0.0
    from_stage: int | None = None


@dataclass(frozen=True)
class SimResult:
    """Timings of a simulated iteration (times in ms, local: the iteration starts at 0)."""

    model: CostModel
    orders: tuple[Order, ...]
    timings: tuple[tuple[OpTiming, ...], ...]
    makespan: float
    bubble_rate: tuple[float, ...]
    blocked_ms: tuple[float, ...]
    critical_path: tuple[CriticalStep, ...]

    @property
    def mean_bubble_rate(self) -> float:
        return sum(self.bubble_rate) / len(self.bubble_rate)

    def explain(self) -> str:
        """Human-readable critical-path summary: where the makespan goes (compute, links, blocking)."""
        path = self.critical_path
        compute = sum(step.end - step.start for step in path)
        link_wait: dict[tuple[int, int], list[float]] = {}
        blocked = 0.0
        for step in path:
            if step.via == "link" and step.from_stage is not None:
                link = min(step.stage, step.from_stage)
                link_wait.setdefault((link, step.from_stage), []).append(step.wait_ms)
            elif step.via == "blocked":
                blocked += step.wait_ms
        lines = [
            f"makespan {self.makespan:.1f} ms; mean bubble rate {self.mean_bubble_rate:.1%};"
            f" critical path of {len(path)} ops: compute {compute:.1f} ms,"
            f" link waits {sum(sum(v) for v in link_wait.values()):.1f} ms, send blocking {blocked:.1f} ms"
        ]
        for (link, src), waits in sorted(link_wait.items()):
            direction = "fwd" if src == link else "bwd"
            lines.append(
                f"  link {link} ({direction}, {link}<->{link + 1}): {len(waits)} waits, {sum(waits):.1f} ms"
                f" (max {max(waits):.1f} ms)"
            )
        word = "stage" if self.model.stages_per_rank == 1 else "rank"
        for s, ms in enumerate(self.blocked_ms):
            if ms > 0:
                lines.append(f"  {word} {s}: blocked {ms:.1f} ms in sends (head-of-line blocking)")
        lines.append("  path (end first): " + " <- ".join(f"{st.op}@{st.stage}" for st in path[:16]))
        if len(path) > 16:
            lines[-1] += " <- ..."
        return "\n".join(lines)


def _check_orders(model: CostModel, orders: Sequence[Sequence[Op]]) -> tuple[Order, ...]:
    orders_t = tuple(tuple(o) for o in orders)
    validate_orders(model.with_memory(None), orders_t, runnable=False)  # structure only: timing any orders
    return orders_t


# ---------------------------------------------------------------------------------------------
# The timing routine: one pass over fixed orders, shared by simulate(), makespan(), the search's
# order moves (search_tabu.py), robust planning (robust.py) and the exact reference (exact.py).
# ---------------------------------------------------------------------------------------------

OP_F, OP_I, OP_W, OP_B = 0, 1, 2, 3
"""Op kinds of :func:`time_codes` (``OP_B`` = fused I + W)."""
CODES = {"F": OP_F, "I": OP_I, "W": OP_W, "B": OP_B}
KIND_OF = ("F", "I", "W", "B")
CHUNK = 4
"""A code is ``kind + CHUNK * chunk``: chunk k is the rank's k-th stage (:meth:`CostModel.rank_stages`)."""
Code = tuple[int, int]
"""One op as ``(code, microbatch)``: the compact form the search manipulates. With one stage per
rank the code is the kind (0..3); in the V, chunk 1 (the rank's stage on the way back) adds 4."""


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
    its input is there (module docstring). The ONE timing routine of the planner.

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
    s_count, n, r_count = model.stages, model.microbatches, model.ranks
    last = s_count - 1
    if delays is None:
        delays = _static_delays(model, links, depth)
    if delays is not None and transmit is None:
        transmit = static_transmit(model, links)
    lay = layout(model)
    route_f, route_b = lay.route_f, lay.route_b
    qf: list[LinkQueue | None] | None = None
    qb: list[LinkQueue | None] | None = None
    df: list[float] = []
    db: list[float] = []
    if delays is None:
        link_model = links if links is not None else StaticDelays(model.delays, transmit=model.transmit)
        if link_model.num_links != model.num_links:
            raise ValueError(f"links model has {link_model.num_links} links, the cost model {model.num_links}")
        queues = [
            (LinkQueue(link_model, link, "fwd", depth), LinkQueue(link_model, link, "bwd", depth))
            for link in range(model.num_links)
        ]
        qf = [None if rt is None else queues[rt[0]][rt[1]] for rt in route_f]
        qb = [None if rt is None else queues[rt[0]][rt[1]] for rt in route_b]
    else:
        cf, cb = delays
        df = [0.0 if rt is None else (cb if rt[1] else cf)[rt[0]] for rt in route_f]
        db = [0.0 if rt is None else (cb if rt[1] else cf)[rt[0]] for rt in route_b]
    # The bandwidth model on the arithmetic branch: per stage, its message's transmit time and wire.
    tx = wires(lay, transmit) if qf is None and transmit is not None else None
    txf, txb, wf, wb = tx if tx is not None else ([], [], [], [])
    wire = [-math.inf] * (2 * model.num_links)
    rank_of, stages_of = lay.rank_of, lay.stages_of
    durs = []  # per rank, per code (kind + CHUNK * chunk)
    for own in stages_of:
        row: list[float] = []
        for s in own:
            row += [model.fwd[s], model.bwd[s], model.wgt[s], model.bwd[s] + model.wgt[s]]
        durs.append(row)
    starts = [[0.0] * len(o) for o in codes]
    ends = [[0.0] * len(o) for o in codes]
    ready_at = [[0.0] * len(o) for o in codes] if detail else []
    blocked_at = [[0.0] * len(o) for o in codes] if detail else []
    pos = [0] * r_count
    free = [0.0] * r_count
    plain = qf is None and tx is None and took is None  # an op's times depend only on its predecessors'
    prev = resume[0] if resume is not None and plain else None
    state = None
    if prev is not None and prev.carry is not None and (prev.ready is not None) == detail and resume is not None:
        state = _resumed(codes, prev, prev.carry, resume[1], resume[2], lay, starts, ends, pos)
    if state is not None:
        arr_f, arr_b, own_f, own_i = state
        for r in range(r_count):
            p = pos[r]
            if p:
                free[r] = ends[r][p - 1]
                if prev is not None and prev.ready is not None and prev.blocked is not None:
                    ready_at[r][:p] = prev.ready[r][:p]
                    blocked_at[r][:p] = prev.blocked[r][:p]
    else:
        arr_f = [[-1.0] * n for _ in range(s_count)]  # delivery of F's input per stage and microbatch
        arr_b = [[-1.0] * n for _ in range(s_count)]  # delivery of I/B's gradient per stage and microbatch
        arr_f[0] = [0.0] * n
        arr_b[last] = [0.0] * n  # the last stage's I/B needs only its own F, earlier in its rank's order
        own_f = [[0.0] * n for _ in range(s_count)] if detail else []  # per stage and microbatch: F's end
        own_i = [[0.0] * n for _ in range(s_count)] if detail else []  # ... and I's end (detail's ready)
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
                    if qf is None:
                        if tx is not None and txf[s] > 0:
                            w = wire[wf[s]]
                            w = (t if t > w else w) + txf[s]
                            wire[wf[s]] = w
                            arr_f[s + 1][m] = w + df[s]
                        else:
                            arr_f[s + 1][m] = t + df[s]
                    else:
                        q = qf[s]
                        if q is None:
                            arr_f[s + 1][m] = t
                        else:
                            sent = q.send(t0 + t, step)
                            arr_f[s + 1][m] = sent.delivered - t0
                            after = sent.accepted - t0
                    if wait_f[s + 1] == m:
                        wait_f[s + 1] = -1
                        stack.append(rank_of[s + 1])
            elif k != 2 and s > 0:
                if qb is None:
                    if tx is not None and txb[s] > 0:
                        w = wire[wb[s]]
                        w = (t if t > w else w) + txb[s]
                        wire[wb[s]] = w
                        arr_b[s - 1][m] = w + db[s]
                    else:
                        arr_b[s - 1][m] = t + db[s]
                else:
                    q = qb[s]
                    if q is None:
                        arr_b[s - 1][m] = t
                    else:
                        sent = q.send(t0 + t, step)
                        arr_b[s - 1][m] = sent.delivered - t0
                        after = sent.accepted - t0
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
    ready_t, blocked_t = (ready_at, blocked_at) if detail else (None, None)
    if any(pos[r] < len(codes[r]) for r in range(r_count)):
        return Timeline(math.inf, starts, ends, ready_t, blocked_t, tuple(pos))
    span = max((e[-1] for e in ends if e), default=0.0)
    carry = (arr_f, arr_b, own_f, own_i) if plain else None
    return Timeline(span, starts, ends, ready_t, blocked_t, carry=carry)


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


def _durations(model: CostModel, orders: Sequence[Order], durations: Callable[[int, Op], float]) -> list[list[float]]:
    took = []
    for s, order in enumerate(orders):
        row = []
        for op in order:
            value = float(durations(s, op))
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"durations({s}, {op}) must be a finite time >= 0 ms, got {value}")
            row.append(value)
        took.append(row)
    return took


_OPTIONS = ("links", "depth", "step", "t0", "durations")


def _timeline(
    model: CostModel, orders: Sequence[Sequence[Op]], options: dict[str, Any], detail: bool
) -> tuple[tuple[Order, ...], Timeline]:
    """Check ``orders`` and time them with :func:`simulate`'s ``options``; deadlocks raise."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}: choose from {', '.join(_OPTIONS)}")
    links: LinkModel | None = options.get("links")
    durations: Callable[[int, Op], float] | None = options.get("durations")
    orders_t = _check_orders(model, orders)
    if links is not None and links.num_links != model.num_links:
        raise ValueError(f"links model has {links.num_links} links, the cost model {model.num_links}")
    took = _durations(model, orders_t, durations) if durations is not None else None
    tl = time_codes(
        model,
        to_codes(orders_t, model),
        links=links,
        depth=options.get("depth"),
        step=options.get("step", 0),
        t0=options.get("t0", 0.0),
        took=took,
        detail=detail,
    )
    if tl.stuck is not None:
        raise deadlock_error(model, orders_t, tl.stuck)
    return orders_t, tl


def simulate(
    model: CostModel,
    orders: Sequence[Sequence[Op]],
    *,
    links: LinkModel | None = None,
    depth: int | None = None,
    step: int = 0,
    t0: float = 0.0,
    durations: Callable[[int, Op], float] | None = None,
) -> SimResult:
    """Execute fixed ``orders`` under ``links`` (default: ``model.delays`` as latency and
    ``model.transmit`` as per-message transmit time, the bandwidth model of :mod:`links`).

    ``depth``: None = non-blocking transport; d >= 1 = blocking FIFO with d messages in flight per
    (link, direction). Delays are looked up at ``t0 + t`` and ``step``. ``durations(rank, op)``
    overrides the model's compute times (e.g. measured ones; in the V the op names its stage).
    Timing by :func:`time_codes`; this adds per-op records, bubble rates and the critical path.
    Records are per rank: ``OpTiming.stage`` is the rank (= the stage with one stage per rank).
    """
    options = {"links": links, "depth": depth, "step": step, "t0": t0, "durations": durations}
    orders_t, tl = _timeline(model, orders, options, detail=True)
    assert tl.ready is not None and tl.blocked is not None
    timings = tuple(
        tuple(
            OpTiming(s, op, tl.start[s][p], tl.end[s][p], tl.ready[s][p], tl.blocked[s][p])
            for p, op in enumerate(order)
        )
        for s, order in enumerate(orders_t)
    )
    span = tl.makespan
    busy = [sum(t.end - t.start for t in ts) for ts in timings]
    bubble = tuple((1.0 - b / span) if span > 0 else 0.0 for b in busy)
    return SimResult(
        model=model,
        orders=orders_t,
        timings=timings,
        makespan=span,
        bubble_rate=bubble,
        blocked_ms=tuple(sum(row) for row in tl.blocked),
        critical_path=_critical_path(model, orders_t, timings),
    )


def _critical_path(
    model: CostModel, orders: tuple[Order, ...], timings: tuple[tuple[OpTiming, ...], ...]
) -> tuple[CriticalStep, ...]:
    """From the op that ends last, follow the constraint that set each start (rank, link, block)."""
    if not any(timings):
        return ()
    last = model.stages - 1
    index = [{op: p for p, op in enumerate(order)} for order in orders]

    def producer(r: int, op: Op) -> tuple[int, int] | None:
        s = op.stage if op.stage is not None else r
        named = op.stage is not None
        if op.kind == "F" and s > 0:
            src = model.rank_of(s - 1)
            return src, index[src][Op("F", op.mb, s - 1 if named else None)]
        if op.kind in ("I", "B") and s < last:
            src = model.rank_of(s + 1)
            up, stage = index[src], s + 1 if named else None
            got = up.get(Op("I", op.mb, stage))
            return src, got if got is not None else up[Op("B", op.mb, stage)]
        return None

    path: list[CriticalStep] = []
    s = max(range(len(timings)), key=lambda k: (timings[k][-1].end if timings[k] else -math.inf, k))
    k = len(timings[s]) - 1
    while k >= 0:
        tm = timings[s][k]
        free = timings[s][k - 1].end + timings[s][k - 1].blocked if k > 0 else 0.0
        src = producer(s, tm.op)
        if src is not None and tm.ready > free + _EPS:
            prod = timings[src[0]][src[1]]
            path.append(CriticalStep(s, tm.op, tm.start, tm.end, "link", tm.ready - prod.end, src[0]))
            s, k = src
        elif k == 0:
            path.append(CriticalStep(s, tm.op, tm.start, tm.end, "start"))
            break
        elif timings[s][k - 1].blocked > _EPS:
            path.append(CriticalStep(s, tm.op, tm.start, tm.end, "blocked", timings[s][k - 1].blocked))
            k -= 1
        else:
            path.append(CriticalStep(s, tm.op, tm.start, tm.end, "stage"))
            k -= 1
    return tuple(path)


def makespan(model: CostModel, orders: Sequence[Sequence[Op]], **options: Any) -> float:
    """Makespan only (ms): :func:`simulate` with the same options (``links``, ``depth``, ``step``,
    ``t0``, ``durations``), the same checks and the same timing, without the per-op records."""
    return _timeline(model, orders, options, detail=False)[1].makespan
