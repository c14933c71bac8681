"""Latency and bandwidth of one link direction, from one step's per-message timings and sizes.

The link model (:mod:`titan_morph.pipelining.links`) sends one message at a time per direction, in
order: a message accepted at ``s_k`` starts transmitting at ``max(s_k, end of the previous one)``,
takes ``tau_k`` (its size / the rate) and arrives ``c`` (the latency) later. In arrival times::

    a_k = max(s_k + tau_k + c,  a_{k-1} + tau_k)

so every message attains one of two lower bounds, and that is what separates them:

* a message that found the wire **idle** takes ``a_k - s_k = tau_k + c`` (the Eq. 1 cost of a
  message; latency alone when ``tau = 0``);
* a message that **queued** behind the previous one (accepted before that one had left the wire,
  ``s_k < a_{k-1} - c``) arrives one transmit time after it: ``a_k - a_{k-1} = tau_k``.

:func:`estimate_wire` finds the idle floor (the least ``a_k - s_k``), calls a message queued when it
took more than that floor plus the jitter floor and was accepted before its predecessor arrived,
and reads the transmit time from the queued messages' arrival gaps (median, inliers only), per
byte so that messages of several sizes share one rate; then the latency is the idle messages'
median of ``a_k - s_k - tau_k``. Gaps that equal the send gap (a latency change looks like that)
or vanish (a FIFO delay-only link releasing a message held behind a slower one) are not
transmit samples, and the fit is kept only if it is physical (no message faster than its own
transmit time) and predicts most of the step's arrivals: a latency that wanders within a step
is not mistaken for a rate. Transmit times within a few jitter floors are measured coarsely.
When no message queued the rate is not identifiable: the estimate says so
(``bandwidth_mbps = None``) and gives only the lower bound every message proves
(``tau_k <= a_k - s_k``). Pure Python, a function of its arguments only: every rank that feeds the
same exchanged stamps gets the same numbers.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["WireEstimate", "WireTiming", "estimate_wire", "mbps"]

INLIER_SPREAD = 0.2  # a transmit sample agrees with the median within 20 % (or the jitter floor)
EXPLAINED = 0.75  # the share of a step's messages the fitted wire must predict


def mbps(nbytes: float, transmit_ms: float) -> float:
    """Mbit/s of ``nbytes`` put on the wire in ``transmit_ms``."""
    return nbytes * 8.0 / (transmit_ms * 1e3)


@dataclass(frozen=True)
class WireTiming:
    """One message of one (link, direction): its FIFO position ``seq``, when the sender's link
    accepted it and when it arrived (ms on the common clock; NaN = arrival unknown) and its size."""

    seq: int
    sent: float
    arrived: float
    nbytes: int = 0

    @property
    def known(self) -> bool:
        return math.isfinite(self.sent) and math.isfinite(self.arrived)


@dataclass(frozen=True)
class WireEstimate:
    """One link direction in one step.

    ``latency_ms`` is ``c``, or, when the rate is not identifiable, the idle cost ``c + tau`` (the
    delay-only reading); ``transmit_ms`` is the transmit time of a message of the step's median size
    (None: not identifiable) and ``bandwidth_mbps`` its rate; ``bandwidth_floor_mbps`` is what the
    step proves at least. ``costs_ms`` are the per-message samples for Eq. 1 (arrival - acceptance,
    each queued message's wait behind its predecessor left out); ``queued`` counts those messages.
    """

    messages: int = 0
    queued: int = 0
    latency_ms: float | None = None
    transmit_ms: float | None = None
    bandwidth_mbps: float | None = None
    bandwidth_floor_mbps: float | None = None
    costs_ms: tuple[float, ...] = ()
    queued_seqs: tuple[int, ...] = ()

    @property
    def identified(self) -> bool:
        """Was the rate measured (some message queued), not just bounded?"""
        return self.transmit_ms is not None


def _median_inliers(values: Sequence[tuple[int, float, float]], floor_ms: float) -> tuple[float, list[int]] | None:
    """Per-unit transmit (ms per byte, or per message) from ``(index, gap ms, units)`` samples: the
    median of the samples that agree with it; None unless at least two agree and they are the
    majority (one odd gap is a latency change, not a rate)."""
    if len(values) < 2:
        return None
    rate = statistics.median(g / u for _, g, u in values)
    agree = [(k, g, u) for k, g, u in values if abs(g - rate * u) <= max(floor_ms, INLIER_SPREAD * rate * u)]
    if len(agree) < 2 or 2 * len(agree) < len(values):
        return None
    return statistics.median(g / u for _, g, u in agree), [k for k, _, _ in agree]


def _queued(
    msgs: Sequence[WireTiming], units: Sequence[float], per_unit: float, floor_ms: float
) -> tuple[float, list[int]] | None:
    """One pass: the messages that waited behind their predecessor (given the current per-unit
    transmit estimate, 0 on the first pass) and the per-unit transmit their gaps give."""
    cost = [m.arrived - m.sent - per_unit * u for m, u in zip(msgs, units, strict=True)]
    base = min(cost)
    samples = []
    for k in range(1, len(msgs)):
        prev, cur = msgs[k - 1], msgs[k]
        if cur.seq != prev.seq + 1 or cost[k] <= base + floor_ms or cur.sent >= prev.arrived:
            continue  # no known predecessor, or it did not wait, or the wire was surely free
        gap, send_gap = cur.arrived - prev.arrived, cur.sent - prev.sent
        if gap <= floor_ms or abs(gap - send_gap) <= floor_ms:
            continue  # a FIFO release or a latency change, not a transmission
        samples.append((k, gap, units[k]))
    return _median_inliers(samples, floor_ms)


def _explains(
    msgs: Sequence[WireTiming], units: Sequence[float], per_unit: float, latency: float, floor_ms: float
) -> bool:
    """Does the FIFO wire with this latency and transmit time predict the arrivals, within the
    jitter floor, for at least :data:`EXPLAINED` of the messages? A latency that changed within
    the step leaves many unexplained: then the gaps are not a rate."""
    hits = 0
    for k, m in enumerate(msgs):
        tau = per_unit * units[k]
        due = m.sent + latency + tau
        if k and m.seq == msgs[k - 1].seq + 1:
            due = max(due, msgs[k - 1].arrived + tau)
        hits += abs(m.arrived - due) <= max(floor_ms, INLIER_SPREAD * tau)
    return hits >= EXPLAINED * len(msgs)


def estimate_wire(timings: Iterable[WireTiming], floor_ms: float = 1.0) -> WireEstimate:
    """Latency and transmit time of one link direction from one step's messages (module docstring).

    ``floor_ms`` is the jitter floor: waits and gaps within it are noise. Messages whose arrival is
    unknown are left out (and break the chain: the next one has no known predecessor).
    """
    if not floor_ms >= 0:
        raise ValueError(f"floor_ms must be >= 0 ms, got {floor_ms}")
    msgs = sorted((m for m in timings if m.known), key=lambda m: m.seq)
    if not msgs:
        return WireEstimate()
    sized = all(m.nbytes > 0 for m in msgs)
    units = [float(m.nbytes) if sized else 1.0 for m in msgs]
    per_unit, queued = 0.0, set[int]()
    for _ in range(3):  # later passes measure idle costs net of each message's own transmit time
        found = _queued(msgs, units, per_unit, floor_ms)
        if found is None:
            break
        same = set(found[1]) == queued
        per_unit, queued = found[0], set(found[1])
        if same:
            break
    floor_bw = None
    if sized:  # every message proves tau_k <= a_k - s_k
        floor_bw = max((mbps(m.nbytes, m.arrived - m.sent) for m in msgs if m.arrived > m.sent), default=None)
    costs = tuple(m.arrived - m.sent for m in msgs)
    unidentified = WireEstimate(len(msgs), 0, statistics.median(costs), None, None, floor_bw, costs)
    if not queued:
        return unidentified
    net = [m.arrived - m.sent - per_unit * u for m, u in zip(msgs, units, strict=True)]
    base = min(net)
    if base < -floor_ms:  # a message arrived sooner than its own transmit time: the gaps are no rate
        return unidentified
    idle = [x for k, x in enumerate(net) if k not in queued and x <= base + floor_ms] or [base]
    latency = max(0.0, statistics.median(idle))
    if not _explains(msgs, units, per_unit, latency, floor_ms):
        return unidentified
    # Queued, by the fitted wire: accepted while the predecessor was still on it (the samples
    # above, and those whose gap the send gap also explained)
    queued = {
        k
        for k in range(1, len(msgs))
        if msgs[k].seq == msgs[k - 1].seq + 1 and msgs[k - 1].arrived - latency - msgs[k].sent > floor_ms
    }
    typical = statistics.median(units)
    transmit = per_unit * typical
    return WireEstimate(
        len(msgs),
        len(queued),
        latency,
        transmit,
        mbps(typical, transmit) if sized and transmit > 0 else None,
        floor_bw,
        tuple(x for k, x in enumerate(costs) if k not in queued),
        tuple(msgs[k].seq for k in sorted(queued)),
    )
