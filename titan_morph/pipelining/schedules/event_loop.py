"""Full-pipeline schedule generation (paper §4.3, Appendix Alg. 3 and Alg. 4): the ONE generator.

Given warm-up forward counts x_s per stage (from Alg. 1 / Alg. 2, :mod:`slackness`), the generator
simulates the pipeline and, whenever a rank is idle, picks its next operation with the two-phase
policy of Alg. 3: a stage first runs x_s forwards (nothing else of that stage meanwhile), then
priority ``I > F > W`` (the paper's ``B > F > W``), never starting a forward that would put more
than ``limit[r]`` microbatches in flight on its rank (default ``limit = warmup``, which keeps every
stage within its warm-up memory). The builders (:mod:`baselines`) and the search (:mod:`search.driver`)
both run this event loop (:func:`run_generator`, through :mod:`generate`'s checked entry points or
directly); the search varies its knobs: x_s, the limit and the policy bits below.

Several stages per rank (the V placement, :class:`model.CostModel`): each stage of an idle rank
proposes its op by the rules above, and the rank runs the proposal of the earliest phase (warm-up
F, refill F, I, F, W), then of the oldest microbatch, then of the later stage; forwards past a
stage's warm-up leave room in the rank's in-flight limit for the warm-up forwards its stages still
owe, and the first leg never takes the last slot while nothing in flight on the rank can free one
without the second leg (a microbatch the first leg passed on needs a slot on its way back: without
it both legs wait for memory and the pipeline deadlocks). With one stage per rank this is Alg. 3 as before.
With :data:`PAIR_W` and the warm-ups of ZB-V this loop reproduces torch's ``ScheduleZBVZeroBubble``
orders for uniform op times (tests/pipelining/test_vshape.py).

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
  :data:`PAIR_W` — a ``W`` runs right after its ``I`` while the rank still has forwards to run (and
  after the ``I`` that follows its last forward): the steady phase of ZB-V and DualPipeV, whose
  back-to-back ``I``/``W`` time exactly like a fused ``B``; the cool-down then lets ``W`` fill gaps.
* Per-stage ready queues (heaps by microbatch) make every decision O(log N); one pass is
  O(S·N·log N).

The generator assumes a non-blocking (delegated, §5) transport, as the paper's Alg. 4 does; the
timing routine (:mod:`timing.simulate`) evaluates the resulting orders under blocking links too.
Links with a transmit time (``model.transmit``, the bandwidth model of :mod:`links`) send one
message at a time per direction: the generator times each message with the simulator's own rule
(:func:`core.layout.arrival`), max(end, wire free) + tau + c, so a warm-up burst queues on a slow
wire here exactly as it will at run time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from titan_morph.pipelining.core.codes import CHUNK, OP_F, OP_I, OP_W
from titan_morph.pipelining.core.layout import arrival, layout, queued_sends, static_sends
from titan_morph.pipelining.core.links import LinkModel
from titan_morph.pipelining.core.model import CostModel

__all__ = ["run_generator", "WAIT_W", "WAIT_F", "WAIT_W_FOR_F", "REFILL", "PAIR_W", "ALL_POLICY_BITS"]

_F, _I, _W = OP_F, OP_I, OP_W  # op kinds; _I also stands for a fused B
_ARRIVE_F, _ARRIVE_I = 3, 4  # event codes: an input arrives from a neighbour
_SENT_F, _SENT_I = 5, 6  # an F (I) ends and its output arrives at that instant (a hop without delay)
_PHASE_KIND = (_F, _F, _I, _F, _W)  # the op kind of each decision phase (warm-up F, refill F, I, F, W)

WAIT_W = 1
"""Policy bit: a ``W`` does not start if an ``I``'s gradient arrives before the ``W`` would end."""
WAIT_F = 2
"""Policy bit: an ``F`` does not start (after warm-up) if a gradient arrives before it would end."""
WAIT_W_FOR_F = 4
"""Policy bit: a ``W`` does not start if an admissible ``F`` input arrives before it would end."""
REFILL = 8
"""Policy bit: in the steady phase an available ``F`` below the in-flight limit goes before an ``I``."""
PAIR_W = 16
"""Policy bit: a ``W`` runs right after its ``I`` while the rank has forwards left (ZB-V's steady phase)."""
ALL_POLICY_BITS = WAIT_W | WAIT_F | WAIT_W_FOR_F | REFILL | PAIR_W


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
    """The event loop behind :func:`generate.generate` and the search: (makespan, per-rank orders as codes).

    Inputs are trusted (validated by :func:`generate.generate_codes`, or built within range by the search):
    ``warmup`` per stage, ``limit`` and ``policy`` per rank. Orders are lists of ``(code,
    microbatch)`` with code = kind + 4·chunk, kind 0 = F, 1 = I (B when fused), 2 = W and chunk the
    op's stage within its rank (:meth:`model.CostModel.rank_stages`); they are None when
    ``record`` is False or when generation stalls (makespan ``inf``). The makespan is the
    generator's own timeline: under non-blocking links it equals :func:`timing.simulate.simulate` of the
    orders (tested), so the search scores knobs without re-timing.
    """
    s_count, n, r_count = model.stages, model.microbatches, model.ranks
    last = s_count - 1
    lay = layout(model)
    # How messages travel: the model's static delays (with the wires of the bandwidth model), or
    # one queue per (link, direction) of ``links``; timed by the simulator's rule (core.layout).
    if links is None:
        delays, transmit = (model.delays, model.delays), (model.transmit, model.transmit)
        sends = static_sends(lay, model.num_links, delays, transmit)
    else:
        sends = queued_sends(lay, links, None)
    df, db, direct_f, direct_b, qf, qb, txf, txb, wf, wb, wire = sends.tables()
    # Per-stage tables: where each stage runs, its op times, its ready queues (heaps by microbatch).
    rank_of, stages_of = lay.rank_of, lay.stages_of
    chunk_of = [k * CHUNK for k in lay.chunk_of]
    # Per stage: does its F's (I's) message cross to another rank (only those are announced early)?
    cross_f = [s < last and rank_of[s + 1] != rank_of[s] for s in range(s_count)]
    cross_i = [s > 0 and rank_of[s - 1] != rank_of[s] for s in range(s_count)]
    tf, tw = model.fwd, model.wgt
    ti = model.bwd if split_backward else tuple(b + w for b, w in zip(model.bwd, model.wgt))
    ready_f: list[list[int]] = [[] for _ in range(s_count)]
    ready_i: list[list[int]] = [[] for _ in range(s_count)]
    ready_w: list[list[int]] = [[] for _ in range(s_count)]
    ready_f[0] = list(range(n))  # a sorted list is a valid heap
    ready = (ready_f, ready_i, ready_w)  # by op kind
    # Arrival times of inputs already on their way from another rank (known when the producer
    # starts), per stage: what the WAIT_* policy bits look ahead at.
    coming_i: list[list[float]] = [[] for _ in range(s_count)]
    coming_f: list[list[float]] = [[] for _ in range(s_count)]
    track = any(p & (WAIT_W | WAIT_F | WAIT_W_FOR_F) for p in policy)  # are arrival times needed?
    # Per-rank bookkeeping: warm-up forwards owed, memory in flight, the V's two legs, PAIR_W.
    warm_left = list(warmup)
    warm_rank = [sum(warmup[s] for s in stages_of[r]) for r in range(r_count)]  # warm-up forwards owed
    f_left = [n * len(stages_of[r]) for r in range(r_count)]
    # The V's second leg: a microbatch the rank's first stage passed on needs one more slot here
    # later (on its way back), so the first leg never takes the last slot while the second leg
    # holds nothing it could free (else both legs wait for memory: a deadlock).
    up_of = [stages_of[r][-1] if len(stages_of[r]) > 1 else -1 for r in range(r_count)]
    f_stage = [n] * s_count  # forwards left per stage
    up_in_flight = [0] * r_count
    down_done = [0] * r_count  # backward inputs the first leg has run (each of them passed the second leg)
    last_f = [False] * r_count  # the rank's previous op was a forward
    pair: list[tuple[int, int] | None] = [None] * r_count  # PAIR_W: the W that must run next
    in_flight = [0] * r_count
    busy = [False] * r_count
    done = 0  # ops run
    pairing = split_backward and any(p & PAIR_W for p in policy)
    orders: list[list[tuple[int, int]]] = [[] for _ in range(r_count)]
    # The event loop: decide for idle ranks, then advance to the next instant and apply its events.
    # (time, seq, stage, kind or _ARRIVE_* or _SENT_*, mb); seq orders events of one instant as issued.
    events: list[tuple[float, int, int, int, int]] = []
    heappush, heappop = heapq.heappush, heapq.heappop
    seq = 0
    dirty = list(range(r_count))
    marked = [True] * r_count
    now = 0.0
    end_time = 0.0
    while True:
        # (1) Decisions for idle ranks whose state changed (Alg. 3, with the policy bits).
        for r in dirty:
            marked[r] = False
            if busy[r]:
                continue
            p = policy[r]
            paired = pair[r] if pairing else None
            if paired is not None:
                s, m = paired
                pair[r] = None
                ready_w[s].remove(m)
                heapq.heapify(ready_w[s])
                code = _W
            else:
                # Slots beyond those owed to warm-up forwards and to the second leg (module docstring).
                up = up_of[r]
                held = up >= 0 and (
                    up_in_flight[r] == 0
                    and warm_left[up] == 0
                    and f_stage[up] > 0
                    and n - f_stage[up] == down_done[r]  # no first-leg microbatch is past the second leg
                )
                room = limit[r] - in_flight[r] - warm_rank[r] - held
                mine = stages_of[r]
                wait = 5  # the earliest phase a stage chose to wait in: nothing of it or later runs
                best = 5  # the proposal: earliest phase (5: none), then oldest microbatch, then later stage
                m = s = 0
                for q in mine:
                    rf = ready_f[q]
                    if warm_left[q] > 0:
                        if not rf:
                            continue
                        phase, mb = 0, rf[0]
                    elif p & REFILL and rf and (room > 0 or (held and q == up)):
                        phase, mb = 1, rf[0]
                    elif ready_i[q]:
                        phase, mb = 2, ready_i[q][0]
                    elif rf and (room > 0 or (held and q == up)):
                        phase, mb = 3, rf[0]
                        if p & WAIT_F:  # a gradient the rank will take (its stage past warm-up) comes first
                            due = now + tf[q]
                            for o in mine:
                                if not warm_left[o] and coming_i[o] and coming_i[o][0] < due:
                                    phase, wait = 5, min(wait, 3)
                    elif ready_w[q]:
                        phase, mb = 4, ready_w[q][0]
                        due = now + tw[q]
                        if p & WAIT_W:
                            for o in mine:
                                if not warm_left[o] and coming_i[o] and coming_i[o][0] < due:
                                    phase, wait = 5, min(wait, 4)
                        if p & WAIT_W_FOR_F and phase < 5:  # an input the rank may forward comes first
                            for o in mine:
                                if (
                                    coming_f[o]
                                    and coming_f[o][0] < due
                                    and (warm_left[o] or room > 0 or held and o == up)
                                ):
                                    phase, wait = 5, min(wait, 4)
                    else:
                        continue
                    if phase < best or (phase == best < 5 and (mb < m or (mb == m and q > s))):
                        best, m, s = phase, mb, q
                if best >= wait:
                    continue
                code = _PHASE_KIND[best]
                heappop(ready[code][s])
            # (2) Start the chosen op; its output's arrival (if it sends one) is known now.
            kind = code
            if code == _F:
                if warm_left[s] > 0:
                    warm_left[s] -= 1
                    warm_rank[r] -= 1
                in_flight[r] += 1
                f_left[r] -= 1
                f_stage[s] -= 1
                if s == up_of[r]:
                    up_in_flight[r] += 1
                end = now + tf[s]
                if s < last:
                    if direct_f[s]:
                        arrive = end + df[s]
                    else:
                        arrive = arrival(end, qf[s], wire, wf[s], txf[s], df[s], t0, step)[0]
                    if track and cross_f[s]:
                        heappush(coming_f[s + 1], arrive)
                    seq += 1
                    if arrive == end:  # delivered as the op ends: one event for both (same instant, same order)
                        kind = _SENT_F
                    else:
                        heappush(events, (arrive, seq, s + 1, _ARRIVE_F, m))
            elif code == _I:
                end = now + ti[s]
                if pairing and p & PAIR_W and (f_left[r] > 0 or last_f[r]):
                    pair[r] = (s, m)
                if s > 0:
                    if direct_b[s]:
                        arrive = end + db[s]
                    else:
                        arrive = arrival(end, qb[s], wire, wb[s], txb[s], db[s], t0, step)[0]
                    if track and cross_i[s]:
                        heappush(coming_i[s - 1], arrive)
                    seq += 1
                    if arrive == end:
                        kind = _SENT_I
                    else:
                        heappush(events, (arrive, seq, s - 1, _ARRIVE_I, m))
            else:
                end = now + tw[s]
            if pairing:
                last_f[r] = code == _F
            if record:
                orders[r].append((code + chunk_of[s], m))
            busy[r] = True
            if kind == code:
                seq += 1
                heappush(events, (end, seq, s, code, m))
            else:  # the arrival's place in the order of events (the op's own end comes right after it)
                heappush(events, (end, seq, s, kind, m))
                seq += 1
        # (3) Advance to the next event (to a multiple of delta when quantised).
        dirty.clear()
        if not events:
            break
        first = events[0][0]
        if delta is None:
            now = first
        else:
            now = max(now, math.ceil(first / delta - 1e-9) * delta)
        horizon = now + 1e-9 * max(1.0, abs(now))
        # (4) Apply every event up to `now` before deciding (ties resolved by priority, not order):
        # arrivals fill ready queues, op ends free their rank (and an I frees memory).
        while events and events[0][0] <= horizon:
            t, _, s, code, m = heappop(events)
            if code >= _ARRIVE_F:
                if code == _ARRIVE_F or code == _SENT_F:
                    at = s + 1 if code == _SENT_F else s
                    r = rank_of[at]
                    if not marked[r]:
                        marked[r] = True
                        dirty.append(r)
                    heappush(ready_f[at], m)
                    if track and cross_f[at - 1]:
                        heappop(coming_f[at])
                else:
                    at = s - 1 if code == _SENT_I else s
                    r = rank_of[at]
                    if not marked[r]:
                        marked[r] = True
                        dirty.append(r)
                    heappush(ready_i[at], m)
                    if track and cross_i[at + 1]:
                        heappop(coming_i[at])
                if code < _SENT_F:
                    continue
                code = _F if code == _SENT_F else _I
            r = rank_of[s]
            if not marked[r]:
                marked[r] = True
                dirty.append(r)
            busy[r] = False
            done += 1
            end_time = t
            if code == _F:
                if s == last:
                    heappush(ready_i[s], m)
            elif code == _I:
                in_flight[r] -= 1
                if s == up_of[r]:
                    up_in_flight[r] -= 1
                elif up_of[r] >= 0:
                    down_done[r] += 1
                if split_backward:
                    heappush(ready_w[s], m)
    # The result: every op ran, or a rank stalled.
    if done != n * s_count * (3 if split_backward else 2):  # a rank stalled: the others cannot finish it
        return math.inf, None
    return end_time, orders if record else None
