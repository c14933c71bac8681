"""Latency and bandwidth of one link direction, from one step's per-message timings and sizes.

The link model (:mod:`titan_morph.pipelining.core.links`) sends one message at a time per direction, in
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
and reads the transmit time from the arrival gaps within runs of back-to-back transmissions
(median of the pairs' per-byte gaps, inliers only: messages of several sizes share one rate, and
one late arrival stamp spoils a few pairs, not the estimate); then the latency is the idle messages'
median of ``a_k - s_k - tau_k``. Gaps that equal the send gap (a latency change looks like that)
or vanish (a FIFO delay-only link releasing a message held behind a slower one) are not
transmit samples, and the fit is kept only if it is physical (no message faster than its own
transmit time) and predicts most of the step's arrivals: a latency that wanders within a step
is not mistaken for a rate. A message that found the wire idle may beat its transmit time by a
shaper's burst (a token bucket lets its first bytes through at line rate: 1.75 ms of 34 ms at
12 Mbit/s on the lab), so "faster than its transmit time" means by more than :data:`BURST_BYTES`
at the fitted rate; gaps widened by the other direction's traffic fail the test (an idle message
crossed faster than they allow), and the link's rate comes from a probe instead.
Transmit times within a few jitter floors are measured coarsely.
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
MAX_SPAN = 8  # transmit samples pair arrivals at most this many messages apart
LOADED_CAP = 3.0  # a queued gap beyond this many transmit times at the known rate is a stall, not the wire
BURST_BYTES = 8192
"""What a shaper lets through at line rate onto an idle wire (its bucket): a message may beat its
transmit time by this many bytes' worth (htb's default bucket at these rates is about two frames)."""


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
    typical_bytes: float = 0.0  # the median message size (0: sizes unknown)
    assumed_rate: bool = False  # the rate was given (a probe's), not measured from these messages
    # the transmit time the queued messages met (their arrival gaps), where it exceeds the wire's:
    # the reverse direction's traffic slows a direction down (None: as ``transmit_ms``)
    loaded_transmit_ms: float | None = None

    @property
    def model_transmit_ms(self) -> float | None:
        """The transmit time per message the link model uses: what the queue met, else the wire's."""
        return self.loaded_transmit_ms if self.loaded_transmit_ms is not None else self.transmit_ms

    @property
    def per_byte_ms(self) -> float | None:
        """The transmit time of one byte (None: no rate measured, or sizes unknown)."""
        if self.transmit_ms is None or self.typical_bytes <= 0:
            return None
        return self.transmit_ms / self.typical_bytes

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
    msgs: Sequence[WireTiming], units: Sequence[float], fit: tuple[float, float], floor_ms: float
) -> tuple[float, set[int]] | None:
    """One pass: the messages that waited behind their predecessor and the per-unit transmit
    their arrivals give, under the previous pass's ``fit`` (per-unit transmit, latency; 0, 0 at first).

    A message queued when it took longer than the idle floor and was accepted before its
    predecessor left the wire (its arrival less the latency); both by more than the jitter floor
    and a fifth of the fitted transmit time, so jitter on a delay-only link makes no queue. Within
    a run of back-to-back transmissions (a head, then messages that each queued behind the one
    before) any two arrivals are the transmit times in between apart; every such pair (up to
    :data:`MAX_SPAN` apart) whose gap is not the send gap is a sample, so one late arrival stamp
    spoils a few of them, not the step.
    """
    per_unit, latency = fit
    cost = [m.arrived - m.sent - per_unit * u for m, u in zip(msgs, units, strict=True)]
    base = min(cost)
    waited = [False] * len(msgs)
    for k in range(1, len(msgs)):
        prev, cur, slack = msgs[k - 1], msgs[k], max(floor_ms, INLIER_SPREAD * per_unit * units[k])
        waited[k] = cur.seq == prev.seq + 1 and cost[k] > base + slack and cur.sent < prev.arrived - latency - slack
    samples = []
    for j in range(len(msgs)):
        spanned = 0.0
        for k in range(j + 1, min(len(msgs), j + MAX_SPAN + 1)):
            if not waited[k]:
                break
            spanned += units[k]
            gap, send_gap = msgs[k].arrived - msgs[j].arrived, msgs[k].sent - msgs[j].sent
            if gap > floor_ms and abs(gap - send_gap) > max(floor_ms, INLIER_SPREAD * gap):
                samples.append((k, gap, spanned))  # else a FIFO release, or a latency change
    found = _median_inliers(samples, floor_ms)
    return None if found is None else (found[0], {k for k in range(len(msgs)) if waited[k]})


def _latency(net: Sequence[float], queued: set[int], floor_ms: float) -> float:
    """The idle messages' median cost net of their own transmit time (>= 0)."""
    base = min(net)
    idle = [x for k, x in enumerate(net) if k not in queued and x <= base + floor_ms] or [base]
    return max(0.0, statistics.median(idle))


def _explains(
    msgs: Sequence[WireTiming], units: Sequence[float], per_unit: float, latency: float, floor_ms: float
) -> bool:
    """Does the FIFO wire with this latency and transmit time predict the arrivals, within the
    jitter floor, for at least :data:`EXPLAINED` of the messages? A latency that changed within
    the step leaves many unexplained: then the gaps are not a rate."""
    hits, last = 0, math.inf  # last: the predecessor's arrival, the earlier of stamp and prediction
    for k, m in enumerate(msgs):
        tau = per_unit * units[k]
        due = m.sent + latency + tau
        if k and m.seq == msgs[k - 1].seq + 1:
            due = max(due, last + tau)  # a late stamp (host jitter) does not spoil its successor
        hits += abs(m.arrived - due) <= max(floor_ms, INLIER_SPREAD * tau)
        last = min(m.arrived, due)
    return hits >= EXPLAINED * len(msgs)


def estimate_wire(
    timings: Iterable[WireTiming],
    floor_ms: float = 1.0,
    per_byte_ms: float | None = None,
    min_transmit_ms: float = 0.0,
) -> WireEstimate:
    """Latency and transmit time of one link direction from one step's messages (module docstring).

    ``floor_ms`` is the jitter floor: waits and gaps within it are noise. Messages whose arrival is
    unknown are left out (and break the chain: the next one has no known predecessor).
    ``per_byte_ms``: the link's rate measured otherwise (a probe train's, on the idle wire between
    steps), used when these messages do not give a faster one: it tells queueing from latency, and
    slower gaps are the wire loaded by the other direction's traffic (:func:`_at_known_rate`).
    ``min_transmit_ms``: a fitted transmit time per message below it is no rate (on a fast link a
    probe train's arrivals are spaced by the receiver's own handling, a millisecond or so).
    """
    if not floor_ms >= 0:
        raise ValueError(f"floor_ms must be >= 0 ms, got {floor_ms}")
    msgs = sorted((m for m in timings if m.known), key=lambda m: m.seq)
    if not msgs:
        return WireEstimate()
    sized = all(m.nbytes > 0 for m in msgs)
    units = [float(m.nbytes) if sized else 1.0 for m in msgs]
    per_unit, latency, queued = 0.0, 0.0, set[int]()
    for _ in range(4):  # each pass re-selects the queued messages under the last fit
        found = _queued(msgs, units, (per_unit, latency), floor_ms)
        if found is None:
            queued = set()
            break
        same = found[1] == queued
        per_unit, queued = found
        latency = _latency(
            [m.arrived - m.sent - per_unit * u for m, u in zip(msgs, units, strict=True)], queued, floor_ms
        )
        if same:
            break
    floor_bw = None
    if sized:  # every message proves tau_k <= a_k - s_k
        floor_bw = max((mbps(m.nbytes, m.arrived - m.sent) for m in msgs if m.arrived > m.sent), default=None)
    costs = tuple(m.arrived - m.sent for m in msgs)
    typical = statistics.median(units) if sized else 0.0
    unidentified = WireEstimate(len(msgs), 0, statistics.median(costs), None, None, floor_bw, costs, (), typical)
    if per_byte_ms is not None and sized:
        unidentified = _at_known_rate(msgs, per_byte_ms, floor_ms, unidentified)
    if not queued or per_unit * statistics.median(units) < min_transmit_ms:
        return unidentified
    burst = per_unit * BURST_BYTES if sized else 0.0
    if min(m.arrived - m.sent - per_unit * u for m, u in zip(msgs, units, strict=True)) < -max(floor_ms, burst):
        return unidentified  # a message arrived well before its own transmit time: the gaps are no rate
    if not _explains(msgs, units, per_unit, latency, floor_ms):
        return unidentified
    if unidentified.assumed_rate and per_unit > (1.0 - INLIER_SPREAD) * (per_byte_ms or 0.0):
        # not faster than the probe's rate: the gaps are the wire loaded by the reverse direction's
        # traffic (its acknowledgements share this queue), which the known rate reads as such
        return unidentified
    # Queued, by the fitted wire: accepted while the predecessor was still on it (the samples
    # above, and those whose gap the send gap also explained)
    queued = {
        k
        for k in range(1, len(msgs))
        if msgs[k].seq == msgs[k - 1].seq + 1 and msgs[k - 1].arrived - latency - msgs[k].sent > floor_ms
    }
    transmit = per_unit * statistics.median(units)
    return WireEstimate(
        len(msgs),
        len(queued),
        latency,
        transmit,
        mbps(typical, transmit) if sized and transmit > 0 else None,
        floor_bw,
        tuple(x for k, x in enumerate(costs) if k not in queued),
        tuple(msgs[k].seq for k in sorted(queued)),
        typical,
    )


def _at_known_rate(
    msgs: Sequence[WireTiming], per_byte_ms: float, floor_ms: float, unidentified: WireEstimate
) -> WireEstimate:
    """The FIFO wire at a given rate: a message accepted before its predecessor left the wire
    queued, and its wait is not a delay. Left the wire: arrived, less the least latency any message
    of the step shows at that rate (a larger estimate would call queued messages idle, and their
    waits would feed the latency back). The queued messages' arrival gaps give the transmit time
    they met (their mean per byte, never below the given rate's): on a link whose two directions
    share their queues with each other's acknowledgements it exceeds the rate's while the reverse
    direction is busy. The latency is the idle messages' median cost less that transmit time (a
    message whose predecessor's arrival is unknown is neither). The costs of queued messages are
    left out of ``costs_ms``."""
    net = [m.arrived - m.sent - per_byte_ms * m.nbytes for m in msgs]
    least = max(0.0, min(net))
    queued = {
        k
        for k in range(1, len(msgs))
        if msgs[k].seq == msgs[k - 1].seq + 1 and msgs[k - 1].arrived - least - msgs[k].sent > floor_ms
    }
    # the queue drains at the gaps' mean (a sum of transmit times), a stall of the host beyond
    # LOADED_CAP transmit times left out
    gaps = [(msgs[k].arrived - msgs[k - 1].arrived) / msgs[k].nbytes for k in sorted(queued)]
    gaps = [g for g in gaps if g <= LOADED_CAP * per_byte_ms]
    loaded = max(per_byte_ms, statistics.fmean(gaps)) if len(gaps) >= 2 else per_byte_ms
    # idle: the step's first message and those accepted after their (known) predecessor left; one
    # whose predecessor's arrival is unknown may have waited behind it, and tells nothing
    chained = [k == 0 or msgs[k].seq == msgs[k - 1].seq + 1 for k in range(len(msgs))]
    idle = [m.arrived - m.sent - loaded * m.nbytes for k, m in enumerate(msgs) if k not in queued and chained[k]]
    latency = max(0.0, statistics.median(idle)) if idle else least
    typical = unidentified.typical_bytes
    transmit = per_byte_ms * typical
    return WireEstimate(
        len(msgs),
        len(queued),
        latency,
        transmit,
        mbps(typical, transmit) if transmit > 0 else None,
        unidentified.bandwidth_floor_mbps,
        tuple(x for k, x in enumerate(unidentified.costs_ms) if k not in queued),
        tuple(msgs[k].seq for k in sorted(queued)),
        typical,
        assumed_rate=True,
        loaded_transmit_ms=loaded * typical if loaded > per_byte_ms else None,
    )
