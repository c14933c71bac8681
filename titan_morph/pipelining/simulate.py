"""Executor-simulator: run FIXED per-stage orders under actual link delays (paper §3, Fig. 5).

A plan is made for the delays it was planned with; at run time the delays are whatever the
network does. This module answers "what happens to *these* orders under *those* delays": each
op's start/end, the makespan, per-stage bubble rate and a critical-path explanation. It is the
engine behind the paper's Fig. 5 numbers (ZB-H2 orders planned for no delay: 390 ms; executed
with c_0 = 10 ms: 400 ms; c_0 = 20 ms: 440 ms) and behind the search's tight loop
(:func:`makespan`).

Execution semantics (shared with the emulator via :mod:`links`):

* A stage runs its order sequentially; an op starts when the stage is free and its inputs are
  there: ``F[s,m]`` needs ``F[s-1,m]`` delivered on link s−1; ``I``/``B[s,m]`` needs the gradient
  of microbatch m delivered by stage s+1 (its ``I`` or ``B``) on link s; ``W`` needs its own ``I``.
* Sends are issued right after the producing op ends (``F`` → ``fwd`` on link s; ``I``/``B`` →
  ``bwd`` on link s−1) through one :class:`links.LinkQueue` per (link, direction). ``depth=None``
  is the non-blocking delegated transport (§5); ``depth=d`` is the NCCL-like FIFO of §3.2: the
  sending stage is blocked until its message is accepted (head-of-line blocking).
* An order that cannot complete raises :class:`DeadlockError` naming the stuck ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from titan_morph.pipelining.links import LinkModel, LinkQueue, StaticDelays
from titan_morph.pipelining.model import CostModel, Op, Order, validate_orders

__all__ = ["DeadlockError", "OpTiming", "CriticalStep", "SimResult", "simulate", "makespan"]

_EPS = 1e-9


class DeadlockError(RuntimeError):
    """The orders cannot complete; ``stuck`` maps each unfinished stage to the op it waits at."""

    def __init__(self, message: str, stuck: dict[int, Op]) -> None:
        super().__init__(message)
        self.stuck = stuck


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
        for s, ms in enumerate(self.blocked_ms):
            if ms > 0:
                lines.append(f"  stage {s}: blocked {ms:.1f} ms in sends (head-of-line blocking)")
        lines.append("  path (end first): " + " <- ".join(f"{st.op}@{st.stage}" for st in path[:16]))
        if len(path) > 16:
            lines[-1] += " <- ..."
        return "\n".join(lines)


def _check_orders(model: CostModel, orders: Sequence[Sequence[Op]]) -> tuple[Order, ...]:
    orders_t = tuple(tuple(o) for o in orders)
    validate_orders(model.with_memory(None), orders_t)  # structure only: the plan's memory is its own business
    return orders_t


def _deadlock(orders: Sequence[Sequence[Op]], pos: Sequence[int]) -> DeadlockError:
    """Build the error naming, per stuck stage, the op it waits at and whom it waits for."""
    s_count = len(orders)
    stuck = {s: orders[s][pos[s]] for s in range(s_count) if pos[s] < len(orders[s])}

    def needs(s: int, op: Op) -> tuple[int, str] | None:
        if op.kind == "F" and s > 0:
            return s - 1, f"F{op.mb}"
        if op.kind in ("I", "B") and s < s_count - 1:
            kinds = {o.kind for o in orders[s + 1]}
            return s + 1, f"{'B' if 'B' in kinds else 'I'}{op.mb}"
        return None

    parts = []
    for s, op in stuck.items():
        need = needs(s, op)
        if need is None:
            parts.append(f"stage {s} is stuck at {op} (position {pos[s] + 1} of {len(orders[s])})")
            continue
        src, what = need
        if src in stuck:
            blocker = stuck[src]
            bneed = needs(src, blocker)
            tail = f", waiting for {bneed[1]} from stage {bneed[0]}" if bneed else ""
            status = f"which is stuck behind {blocker} (position {pos[src] + 1} of {len(orders[src])}{tail})"
        else:
            status = f"whose order never produces {what}"
        parts.append(f"stage {s} waits for {op} (needs {what} from stage {src}, {status})")
    return DeadlockError("pipeline orders deadlock: " + "; ".join(parts), stuck)


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
    """Execute fixed ``orders`` under ``links`` (default ``StaticDelays(model.delays)``).

    ``depth``: None = non-blocking transport; d >= 1 = blocking FIFO with d messages in flight per
    (link, direction). Delays are looked up at ``t0 + t`` and ``step``. ``durations(stage, op)``
    overrides the model's compute times (e.g. measured ones).
    """
    orders_t = _check_orders(model, orders)
    s_count, n = model.stages, model.microbatches
    link_model = links if links is not None else StaticDelays(model.delays)
    if link_model.num_links != s_count - 1:
        raise ValueError(f"links model has {link_model.num_links} links, the cost model {s_count - 1}")
    qf = [LinkQueue(link_model, link, "fwd", depth) for link in range(s_count - 1)]
    qb = [LinkQueue(link_model, link, "bwd", depth) for link in range(s_count - 1)]
    dur = durations or (lambda s, op: model.duration(s, op.kind))

    # Arrival of an input: (delivery time, producer stage, producer op index) per stage/microbatch.
    arr_f: list[list[tuple[float, int, int] | None]] = [[None] * n for _ in range(s_count)]
    arr_b: list[list[tuple[float, int, int] | None]] = [[None] * n for _ in range(s_count)]
    end_f = [[0.0] * n for _ in range(s_count)]  # own F end (ready time of the last stage's I/B)
    end_i = [[0.0] * n for _ in range(s_count)]  # own I end (ready time of W)
    timings: list[list[OpTiming]] = [[] for _ in range(s_count)]
    causes: list[list[tuple[str, float, int | None, int | None]]] = [[] for _ in range(s_count)]
    pos = [0] * s_count
    free = [0.0] * s_count  # when the stage can start its next op (after any send blocking)
    blocked_total = [0.0] * s_count
    stack = list(range(s_count - 1, -1, -1))
    waiting: list[tuple[str, int] | None] = [None] * s_count
    while stack:
        s = stack.pop()
        order = orders_t[s]
        while pos[s] < len(order):
            op = order[pos[s]]
            kind, m = op.kind, op.mb
            src: tuple[float, int, int] | None
            if kind == "F":
                if s == 0:
                    src = (0.0, -1, -1)
                else:
                    src = arr_f[s][m]
            elif kind == "W":
                src = (end_i[s][m], -1, -1)
            elif s == s_count - 1:
                src = (end_f[s][m], -1, -1)
            else:
                src = arr_b[s][m]
            if src is None:
                waiting[s] = (kind, m)
                break
            waiting[s] = None
            ready, from_stage, from_idx = src
            start = max(free[s], ready)
            took = float(dur(s, op))
            if not (took >= 0 and math.isfinite(took)):
                raise ValueError(f"durations({s}, {op}) must be a finite time >= 0 ms, got {took}")
            end = start + took
            if kind == "F":
                end_f[s][m] = end
            elif kind == "I":
                end_i[s][m] = end
            # Why did it start then? (for the critical path)
            if from_stage >= 0 and ready > free[s] + _EPS:
                prod_end = timings[from_stage][from_idx].end
                causes[s].append(("link", ready - prod_end, from_stage, from_idx))
            elif pos[s] == 0:
                causes[s].append(("start", 0.0, None, None))
            elif timings[s][-1].blocked > _EPS:
                causes[s].append(("blocked", timings[s][-1].blocked, None, None))
            else:
                causes[s].append(("stage", 0.0, None, None))
            blocked = 0.0
            after = end
            target: int | None = None
            if kind == "F" and s < s_count - 1:
                sent = qf[s].send(t0 + end, step)
                target = s + 1
                arr_f[s + 1][m] = (sent.delivered - t0, s, pos[s])
            elif kind in ("I", "B") and s > 0:
                sent = qb[s - 1].send(t0 + end, step)
                target = s - 1
                arr_b[s - 1][m] = (sent.delivered - t0, s, pos[s])
            if target is not None:
                after = sent.accepted - t0
                blocked = after - end
                blocked_total[s] += blocked
                want = waiting[target]
                if want is not None and want[1] == m and (want[0] == "F") == (kind == "F"):
                    waiting[target] = None
                    stack.append(target)
            timings[s].append(OpTiming(s, op, start, end, ready, blocked))
            free[s] = after
            pos[s] += 1
    if any(pos[s] < len(orders_t[s]) for s in range(s_count)):
        raise _deadlock(orders_t, pos)

    span = max((t[-1].end for t in timings if t), default=0.0)
    busy = [sum(t.end - t.start for t in ts) for ts in timings]
    bubble = tuple((1.0 - b / span) if span > 0 else 0.0 for b in busy)

    # Critical path: from the op that ends last, follow the constraint that set each start.
    path: list[CriticalStep] = []
    if span > 0 or any(timings):
        s = max(range(s_count), key=lambda k: (timings[k][-1].end if timings[k] else -math.inf, k))
        k = len(timings[s]) - 1
        while k >= 0:
            tm = timings[s][k]
            via, wait, fs, fi = causes[s][k]
            path.append(CriticalStep(s, tm.op, tm.start, tm.end, via, wait, fs))
            if via == "link":
                s, k = fs, fi  # type: ignore[assignment]
            elif via == "start":
                break
            else:
                k -= 1
    return SimResult(
        model=model,
        orders=orders_t,
        timings=tuple(tuple(t) for t in timings),
        makespan=span,
        bubble_rate=bubble,
        blocked_ms=tuple(blocked_total),
        critical_path=tuple(path),
    )


_CODE = {"F": 0, "I": 1, "B": 1, "W": 2}


def makespan(
    model: CostModel,
    orders: Sequence[Sequence[Op]],
    *,
    links: LinkModel | None = None,
    depth: int | None = None,
    step: int = 0,
    t0: float = 0.0,
    durations: Callable[[int, Op], float] | None = None,
) -> float:
    """Makespan only (ms): the search's inner loop.

    Static delays with a non-blocking transport take a tight arithmetic path (no objects per op);
    anything else (time-varying links, blocking depth, custom durations) falls back to
    :func:`simulate`. For speed the fast path checks only op counts, not the full order structure
    (:func:`simulate` does, via ``model.validate_orders``); deadlocks raise :class:`DeadlockError`.
    """
    if depth is not None or durations is not None or (links is not None and not isinstance(links, StaticDelays)):
        return simulate(model, orders, links=links, depth=depth, step=step, t0=t0, durations=durations).makespan
    s_count, n = model.stages, model.microbatches
    if len(orders) != s_count:
        raise ValueError(f"expected {s_count} stage orders, got {len(orders)}")
    if links is not None:
        if links.num_links != s_count - 1:
            raise ValueError(f"links model has {links.num_links} links, the cost model {s_count - 1}")
        cf, cb = links.fwd, links.bwd
    else:
        cf = cb = model.delays
    for c in cf + cb:  # type: ignore[operator]
        if math.isinf(c):
            return simulate(model, orders, links=links).makespan  # raises LinkDownError with context
    code = _CODE
    fwd, bwd, wgt = model.fwd, model.bwd, model.wgt
    last = s_count - 1
    arr_f: list[list[float | None]] = [[None] * n for _ in range(s_count)]
    arr_b: list[list[float | None]] = [[None] * n for _ in range(s_count)]
    arr_f[0] = [0.0] * n
    arr_b[last] = [0.0] * n
    compiled = []
    for s, order in enumerate(orders):
        ops = [(code[op.kind], op.mb, op.kind == "B") for op in order]
        if len(ops) not in (2 * n, 3 * n):
            raise ValueError(f"stage {s}: order has {len(ops)} ops, expected {2 * n} (F,B) or {3 * n} (F,I,W)")
        compiled.append(ops)
    pos = [0] * s_count
    free = [0.0] * s_count
    wait_f = [-1] * s_count
    wait_b = [-1] * s_count
    stack = list(range(last, -1, -1))
    while stack:
        s = stack.pop()
        ops = compiled[s]
        p = pos[s]
        t = free[s]
        af = arr_f[s]
        ab = arr_b[s]
        tf, tb, tw = fwd[s], bwd[s], wgt[s]
        size = len(ops)
        while p < size:
            c, m, fused = ops[p]
            if c == 0:
                r = af[m]
                if r is None:
                    wait_f[s] = m
                    break
                if r > t:
                    t = r
                t += tf
                if s < last:
                    arr_f[s + 1][m] = t + cf[s]
                    if wait_f[s + 1] == m:
                        wait_f[s + 1] = -1
                        stack.append(s + 1)
            elif c == 1:
                r = ab[m]
                if r is None:
                    wait_b[s] = m
                    break
                if r > t:
                    t = r
                t += tb + wgt[s] if fused else tb
                if s > 0:
                    arr_b[s - 1][m] = t + cb[s - 1]
                    if wait_b[s - 1] == m:
                        wait_b[s - 1] = -1
                        stack.append(s - 1)
            else:
                t += tw
            p += 1
        pos[s] = p
        free[s] = t
    if any(pos[s] < len(compiled[s]) for s in range(s_count)):
        raise _deadlock([tuple(o) for o in orders], pos)
    return max(free)
