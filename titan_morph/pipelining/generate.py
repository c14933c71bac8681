"""Full-pipeline schedule generation (paper §4.3, Appendix Alg. 3 and Alg. 4): the ONE generator.

Given warm-up forward counts x_i (from Alg. 1 / Alg. 2, :mod:`slackness`), the generator simulates
the pipeline and, whenever a stage is idle, picks its next operation with the two-phase policy of
Alg. 3: first x_i forwards (idle if none is available), then priority ``I > F > W`` (the paper's
``B > F > W``), never starting a forward that would put more than ``limit[i]`` microbatches in
flight (default ``limit = warmup``, which keeps every stage within its warm-up memory). The
builders (:mod:`builders`) and the search (:mod:`search`) both run this event loop
(:func:`run_generator`); the search varies its knobs: x_i, the limit and the policy bits below.

Deviations from the paper's pseudo-code (and why):

* Event-driven and exact: instead of scanning every δ-step (Alg. 4, O(NS²⌈t_o/δ⌉)), a heap of
  events (op ends, message arrivals) advances time directly; this equals the δ → 0 limit. All
  events at the same instant are applied before any decision at that instant, so ties (e.g. an
  ``I`` and an ``F`` arriving together) are resolved by priority, not by event order — this is
  what reproduces the paper's Fig. 4 (390 ms). ``delta`` restores the paper's quantisation: ops
  then start only on multiples of δ (for the §7.4 / Fig. 20 comparison).
* Alg. 4 line 17 appends ``W`` to stage i−1 when ``B`` ends on stage i: a typo — ``W[s,m]``
  depends on ``I[s,m]`` of the *same* stage, so ``W`` becomes ready on stage i when its ``I`` ends.
* Alg. 4 line 14/16 marks the successor ready at ``t + c`` with t the decision time; we use the
  producing op's *end* + c (the op must finish before its output can be sent).
* Policy bits (per stage, not in the paper; 0 = Alg. 3 exactly). Arrivals of messages already on
  their way are known when their producer starts (durations and link delays are known), so an
  idle stage can choose to wait for them instead of starting a long op:
  :data:`WAIT_W` — a ``W`` does not start if a gradient arrives before the ``W`` would end (the
  ``I`` frees memory and unblocks the upstream stage); :data:`WAIT_F` — the same for an ``F``;
  :data:`WAIT_W_FOR_F` — a ``W`` does not start if an admissible ``F`` input arrives before it
  would end; :data:`REFILL` — in the steady phase a stage below its in-flight limit runs an
  available ``F`` *before* an ``I``. With the paper's ``I > F > W`` the burst of ``I``s that
  follows the warm-up drains the lead the warm-up built, so orders planned without delay keep an
  *effective* slackness of ~2 whatever x_i is (their Fig. 8 knee sits at c ≈ t for every Δ).
  Refilling keeps each stage x_i forwards ahead, so fixed orders absorb c <= (Δ_i − 1)t exactly
  as Theorem 1 predicts (tests/pipelining/test_paper_figures.py). Fig. 4/5 are unchanged.
* Per-stage ready queues (heaps by microbatch) make every decision O(log N); one pass is
  O(S·N·log N).

The generator assumes a non-blocking (delegated, §5) transport, as the paper's Alg. 4 does; the
timing routine (:mod:`simulate`) evaluates the resulting orders under blocking links too.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from titan_morph.pipelining.links import LinkDownError, LinkModel, LinkQueue
from titan_morph.pipelining.model import CostModel, Op, Order

__all__ = [
    "generate",
    "run_generator",
    "check_warmup",
    "check_limit",
    "check_policy",
    "WAIT_W",
    "WAIT_F",
    "WAIT_W_FOR_F",
    "REFILL",
    "ALL_POLICY_BITS",
]

_F, _I, _W = 0, 1, 2  # op codes (as in simulate.time_codes); _I also stands for a fused B
_ARRIVE_F, _ARRIVE_I = 3, 4  # event codes: an input arrives from a neighbour

WAIT_W = 1
"""Policy bit: a ``W`` does not start if an ``I``'s gradient arrives before the ``W`` would end."""
WAIT_F = 2
"""Policy bit: an ``F`` does not start (after warm-up) if a gradient arrives before it would end."""
WAIT_W_FOR_F = 4
"""Policy bit: a ``W`` does not start if an admissible ``F`` input arrives before it would end."""
REFILL = 8
"""Policy bit: in the steady phase an available ``F`` below the in-flight limit goes before an ``I``."""
ALL_POLICY_BITS = WAIT_W | WAIT_F | WAIT_W_FOR_F | REFILL


def check_warmup(model: CostModel, warmup: Sequence[int]) -> tuple[int, ...]:
    """Validate x_i: one per stage, 1 <= x_i <= N, Lemma 1 (non-increasing), x_i <= M_i.

    Raises ``ValueError`` naming the stage and the allowed range.
    """
    s_count, n = model.stages, model.microbatches
    try:
        x = tuple(int(v) for v in warmup)
    except (TypeError, ValueError):
        raise ValueError(f"warmup must be a sequence of {s_count} integers, got {warmup!r}") from None
    if len(x) != s_count:
        raise ValueError(f"warmup needs {s_count} values (one x_i per stage), got {len(x)}: {x}")
    for s, v in enumerate(x):
        if not 1 <= v <= n:
            raise ValueError(f"warmup x_{s} = {v} out of range: each stage needs 1 <= x_i <= N = {n} forwards")
    for s in range(s_count - 1):
        if x[s] < x[s + 1]:
            raise ValueError(
                f"warmup {list(x)} violates Lemma 1 (x_i must be non-increasing over stages):"
                f" x_{s} = {x[s]} < x_{s + 1} = {x[s + 1]}"
            )
    if model.memory is not None:
        for s, v in enumerate(x):
            if v > model.memory[s]:
                raise ValueError(
                    f"stage {s}: warm-up of x_{s} = {v} forwards needs {v} microbatches in flight,"
                    f" more than the memory budget M_{s} = {model.memory[s]}"
                )
    return x


def check_limit(model: CostModel, warmup: Sequence[int], limit: Sequence[int] | None) -> tuple[int, ...]:
    """Validate the in-flight cap per stage: x_i <= limit_i <= M_i (N when unbounded)."""
    if limit is None:
        return tuple(warmup)
    lim = tuple(int(v) for v in limit)
    if len(lim) != model.stages:
        raise ValueError(f"limit needs {model.stages} values (one per stage), got {len(lim)}")
    for s, (v, x) in enumerate(zip(lim, warmup)):
        if not x <= v <= model.budget(s):
            raise ValueError(
                f"limit_{s} = {v} out of range: the in-flight cap must satisfy x_{s} = {x} <= limit_{s}"
                f" <= {model.budget(s)} (memory budget / N)"
            )
    return lim


def generate(
    model: CostModel,
    warmup: Sequence[int],
    *,
    limit: Sequence[int] | None = None,
    policy: int | Sequence[int] = 0,
    refill: bool = False,
    **options: Any,
) -> tuple[Order, ...]:
    """Per-stage operation orders by Alg. 3/4 (event-driven; δ-quantised when ``delta`` is set).

    ``warmup`` = x_i, ``limit`` = in-flight cap per stage (default x_i). ``policy``: bits
    :data:`WAIT_W`, :data:`WAIT_F`, :data:`WAIT_W_FOR_F`, :data:`REFILL` (module docstring), one
    value for every stage or one per stage; ``refill=True`` adds :data:`REFILL` everywhere.
    ``options`` are :func:`run_generator`'s: ``split_backward=False`` emits fused ``B`` ops
    (1F1B-style) instead of ``I``/``W``; ``delta`` quantises decision times; delays come from
    ``model.delays`` unless ``links`` is given (looked up at ``t0 + t`` and ``step``).
    """
    x = check_warmup(model, warmup)
    lim = check_limit(model, x, limit)
    pol = check_policy(model, policy)
    if refill:
        pol = tuple(p | REFILL for p in pol)
    delta, links = options.get("delta"), options.get("links")
    if delta is not None and not (delta > 0 and math.isfinite(delta)):
        raise ValueError(f"delta must be a finite time step > 0 ms (or None for exact), got {delta}")
    if links is not None and links.num_links != model.stages - 1:
        raise ValueError(f"links model has {links.num_links} links, the cost model {model.stages - 1}")
    if links is None:
        for link, c in enumerate(model.delays):
            if math.isinf(c):
                raise LinkDownError(link, "fwd", " (cannot plan across a link that is down)")
    span, codes = run_generator(model, x, lim, pol, **options)
    if codes is None:  # cannot happen for valid x and limits; kept as a clear internal check
        raise RuntimeError(f"schedule generation stalled with warmup={list(x)} limit={list(lim)} policy={list(pol)}")
    kinds = ("F", "I" if options.get("split_backward", True) else "B", "W")
    cache = [[Op(kind, m) for m in range(model.microbatches)] for kind in kinds]
    return tuple(tuple(cache[c][m] for c, m in order) for order in codes)


def check_policy(model: CostModel, policy: int | Sequence[int]) -> tuple[int, ...]:
    """Validate the policy bits: one int for every stage or one per stage, each in 0..15."""
    pol = (int(policy),) * model.stages if isinstance(policy, int) else tuple(int(p) for p in policy)
    if len(pol) != model.stages:
        raise ValueError(f"policy needs 1 or {model.stages} values (one per stage), got {len(pol)}")
    for s, p in enumerate(pol):
        if not 0 <= p <= ALL_POLICY_BITS:
            raise ValueError(f"policy_{s} = {p} out of range: a combination of the bits 1, 2, 4, 8 (0..15)")
    return pol


def run_generator(
    model: CostModel,
    warmup: Sequence[int],
    limit: Sequence[int],
    policy: Sequence[int],
    *,
    split_backward: bool = True,
    delta: float | None = None,
    links: LinkModel | None = None,
    t0: float = 0.0,
    step: int = 0,
    record: bool = True,
) -> tuple[float, list[list[tuple[int, int]]] | None]:
    """The event loop behind :func:`generate` and the search: (makespan, orders as codes).

    Inputs are trusted (validated by :func:`generate`, or built within range by the search).
    Orders are lists of ``(code, microbatch)`` with code 0 = F, 1 = I (B when fused), 2 = W; they
    are None when ``record`` is False or when generation stalls (makespan ``inf``). The makespan
    is the generator's own timeline: under non-blocking links it equals :func:`simulate.simulate`
    of the orders (tested), so the search scores knobs without re-timing.
    """
    s_count, n = model.stages, model.microbatches
    last = s_count - 1
    if links is None:
        cd: Sequence[float] = model.delays
        qf = qb = None
    else:
        cd = ()
        qf = [LinkQueue(links, link, "fwd") for link in range(last)]
        qb = [LinkQueue(links, link, "bwd") for link in range(last)]
    tf, tw = model.fwd, model.wgt
    ti = model.bwd if split_backward else tuple(b + w for b, w in zip(model.bwd, model.wgt))
    ready_f: list[list[int]] = [[] for _ in range(s_count)]
    ready_i: list[list[int]] = [[] for _ in range(s_count)]
    ready_w: list[list[int]] = [[] for _ in range(s_count)]
    ready_f[0] = list(range(n))  # a sorted list is a valid heap
    # Arrival times of inputs already on their way (known when the producer starts), FIFO per stage.
    coming_i: list[deque[float]] = [deque() for _ in range(s_count)]
    coming_f: list[deque[float]] = [deque() for _ in range(s_count)]
    track = any(p & (WAIT_W | WAIT_F | WAIT_W_FOR_F) for p in policy)  # are arrival times needed?
    warm_left = list(warmup)
    in_flight = [0] * s_count
    busy = [False] * s_count
    done = [0] * s_count
    orders: list[list[tuple[int, int]]] = [[] for _ in range(s_count)]
    events: list[tuple[float, int, int, int, int]] = []  # (time, seq, stage, code or _ARRIVE_*, mb)
    heappush, heappop = heapq.heappush, heapq.heappop
    seq = 0
    dirty = list(range(s_count))
    marked = [True] * s_count
    now = 0.0
    end_time = 0.0
    while True:
        # Decisions for idle stages whose state changed (Alg. 3, with the policy bits).
        for s in dirty:
            marked[s] = False
            if busy[s]:
                continue
            code = -1
            p = policy[s]
            rf = ready_f[s]
            if warm_left[s] > 0:
                if rf:
                    code = _F
                    warm_left[s] -= 1
            elif p & REFILL and rf and in_flight[s] < limit[s]:
                code = _F
            elif ready_i[s]:
                code = _I
            elif rf and in_flight[s] < limit[s]:
                code = _F
                if p & WAIT_F and coming_i[s] and coming_i[s][0] < now + tf[s]:
                    code = -1
            elif ready_w[s]:
                code = _W
                if p & WAIT_W and coming_i[s] and coming_i[s][0] < now + tw[s]:
                    code = -1
                elif p & WAIT_W_FOR_F and coming_f[s] and coming_f[s][0] < now + tw[s] and in_flight[s] < limit[s]:
                    code = -1
            if code < 0:
                continue
            if code == _F:
                m = heappop(rf)
                in_flight[s] += 1
                end = now + tf[s]
                if s < last:
                    arrive = end + cd[s] if qf is None else qf[s].send(t0 + end, step).delivered - t0
                    if track:
                        coming_f[s + 1].append(arrive)
                    seq += 1
                    heappush(events, (arrive, seq, s + 1, _ARRIVE_F, m))
            elif code == _I:
                m = heappop(ready_i[s])
                end = now + ti[s]
                if s > 0:
                    arrive = end + cd[s - 1] if qb is None else qb[s - 1].send(t0 + end, step).delivered - t0
                    if track:
                        coming_i[s - 1].append(arrive)
                    seq += 1
                    heappush(events, (arrive, seq, s - 1, _ARRIVE_I, m))
            else:
                m = heappop(ready_w[s])
                end = now + tw[s]
            if record:
                orders[s].append((code, m))
            busy[s] = True
            seq += 1
            heappush(events, (end, seq, s, code, m))
        dirty.clear()
        if not events:
            break
        first = events[0][0]
        if delta is None:
            now = first
        else:
            now = max(now, math.ceil(first / delta - 1e-9) * delta)
        horizon = now + 1e-9 * max(1.0, abs(now))
        # Apply every event up to `now` before deciding (ties resolved by priority, not order).
        while events and events[0][0] <= horizon:
            t, _, s, code, m = heappop(events)
            if not marked[s]:
                marked[s] = True
                dirty.append(s)
            if code == _ARRIVE_F:
                heappush(ready_f[s], m)
                if track:
                    coming_f[s].popleft()
                continue
            if code == _ARRIVE_I:
                heappush(ready_i[s], m)
                if track:
                    coming_i[s].popleft()
                continue
            busy[s] = False
            done[s] += 1
            end_time = t
            if code == _F:
                if s == last:
                    heappush(ready_i[s], m)
            elif code == _I:
                in_flight[s] -= 1
                if split_backward:
                    heappush(ready_w[s], m)
    per_stage = n * (3 if split_backward else 2)
    if any(d != per_stage for d in done):
        return math.inf, None
    return end_time, orders if record else None
