"""FIXED per-stage orders run under link delays (paper §3, Fig. 5), with per-op records.

A plan is made for the delays it was planned with; at run time the delays are whatever the
network does. This module answers "what happens to *these* orders under *those* delays": each
op's start/end, the makespan, per-stage bubble rate and a critical-path explanation. It is the
engine behind the paper's Fig. 5 numbers (ZB-H2 orders planned for no delay: 390 ms; executed
with c_0 = 10 ms: 400 ms; c_0 = 20 ms: 440 ms). :func:`timeline.time_codes` is the routine itself;
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from titan_morph.pipelining.core.links import LinkModel
from titan_morph.pipelining.core.model import CostModel, Op, Order, validate_orders
from titan_morph.pipelining.timing.deadlock import DeadlockError, deadlock_error
from titan_morph.pipelining.timing.timeline import Timeline, time_codes, to_codes

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
