"""Per-link delivery delay from the stages' gathered step profiles.

A message's delivery delay is the time from its acceptance on the sender's link (after any
head-of-line blocking, so queueing is not mistaken for a slow wire) to its data being available
at the receiver — the ``c_i`` of Eq. 1. Both stamps are on the common clock (clock offsets are
estimated at start-up, :mod:`titan_morph.monitor.clock`), so no synchronized clocks are assumed.

How arrival is observed, per message:

* the transport stamps arrival itself (the delegate process on receipt; the link emulator's
  receive watcher): an **exact** sample, whatever the training thread was doing;
* otherwise only the training thread's wait is visible. If it began waiting before the message
  was accepted, or the wait blocked for more than ``block_eps_ms``, the wait returned at the
  arrival: **exact**. If the wait returned at once, the data was already there: the sample is
  only an **upper bound** (the consumer was late, not the link).

Detection (delay above tolerance) needs exact samples: a straggling link makes its consumer
block, so they exist exactly when they matter. A bound below a threshold still proves a link
healthy, which is what recovery needs.

The exact samples of each (path, link, direction) also go through the bandwidth estimate
(:mod:`.bandwidth`): a message that queued behind the previous one on the wire gives the link's
transmit time, not a delay sample, so queueing is not mistaken for latency; every other exact
sample is a message's Eq. 1 cost, latency + its transmit time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from titan_morph.monitor.bandwidth import WireEstimate, WireTiming, estimate_wire
from titan_morph.monitor.profile import PROBE_PATH, MessageStamp, StepProfile

__all__ = ["LinkEstimate", "estimate_links", "quantile"]

PROBE_MIN_FLOORS = 3.0
"""A probe train names a rate only when each message takes more than this many jitter floors on
the wire: below that its arrival gaps are the receiver's handling (an unlimited link read 314 Mbit/s
from 1.25 ms gaps between 48 KiB messages), and no plan depends on so short a transmit time."""


@dataclass
class LinkEstimate:
    """One link's delivery delays in one step (both directions pooled), in ms, and per path and
    direction its wire estimate (``wires``: latency, transmit time, rate)."""

    link: int
    exact: list[float] = field(default_factory=list)
    bounds: list[float] = field(default_factory=list)
    wires: dict[tuple[str, str], WireEstimate] = field(default_factory=dict)  # (path, direction) ->
    # the link's last probe train that measured a rate (the monitor holds it while the link stays
    # congested): the rate when no pipeline message of this step queued
    probed: WireEstimate | None = None

    def _identified(self) -> list[WireEstimate]:
        """The wires that measured a rate: this step's pipeline messages where some queued, else
        the link's probe."""
        found = [w for (path, _), w in self.wires.items() if path != PROBE_PATH and w.identified]
        return found or ([self.probed] if self.probed is not None and self.probed.identified else [])

    @property
    def measured_by_probe(self) -> bool:
        """Is this step's rate a probe's (no pipeline message measured one itself)?"""
        return bool(self._identified()) and not any(
            w.identified and not w.assumed_rate for (path, _), w in self.wires.items() if path != PROBE_PATH
        )

    @property
    def transmit_ms(self) -> float | None:
        """The link's per-message transmit time: its slower direction's (None: no rate measured)."""
        found = [w.transmit_ms for w in self._identified() if w.transmit_ms is not None]
        return max(found) if found else None

    @property
    def bandwidth_mbps(self) -> float | None:
        """The link's rate in Mbit/s: its slower direction's (None: not identifiable this step)."""
        found = [w.bandwidth_mbps for w in self._identified() if w.bandwidth_mbps is not None]
        return min(found) if found else None

    @property
    def latency_ms(self) -> float | None:
        """The latency without the transmit time, where a rate was measured (the larger over
        directions); None: only the delays (latency + transmit) are known. With a probe's rate the
        pipeline's wires were read at it (:func:`estimate_links`): their latency is the one they
        meet in the pipeline, reverse traffic included."""
        found = [w.latency_ms for w in self._identified() if w.latency_ms is not None]
        return max(found) if found else None

    def direction_latency_ms(self) -> dict[str, float]:
        """Per direction, the latency of this step's pipeline messages beyond their transmit time,
        where a rate is known (:meth:`direction_wire_ms`)."""
        return {d: lat for d, (lat, tau) in self.direction_wire_ms().items() if tau > 0}

    def direction_wire_ms(self) -> dict[str, tuple[float, float]]:
        """Per direction, (latency, transmit time) of this step's pipeline messages: the wire's own
        where a rate is known, its own or a probe's (the transmit time queued messages met,
        :attr:`~titan_morph.monitor.bandwidth.WireEstimate.model_transmit_ms`); else the median cost
        as latency and no transmit time (the delay-only reading). Directions without exact samples
        are left out."""
        out: dict[str, tuple[float, float]] = {}
        for (path, direction), w in sorted(self.wires.items()):
            if path == PROBE_PATH or not w.costs_ms:
                continue
            if w.identified and w.latency_ms is not None and w.model_transmit_ms is not None:
                found = (w.latency_ms, w.model_transmit_ms)
            else:
                found = (statistics.median(w.costs_ms), 0.0)
            old = out.get(direction)
            out[direction] = found if old is None or sum(found) > sum(old) else old
        return out

    @property
    def delay_ms(self) -> float | None:
        """Median of the exact samples; None when the step had none."""
        return statistics.median(self.exact) if self.exact else None

    @property
    def upper_ms(self) -> float | None:
        """What the step proves at most: the exact median, else the smallest upper bound."""
        if self.exact:
            return statistics.median(self.exact)
        return min(self.bounds) if self.bounds else None

    @property
    def samples(self) -> int:
        return len(self.exact) + len(self.bounds)


def quantile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated quantile ``q`` in [0, 1] of non-empty ``values``."""
    xs = sorted(values)
    if not xs:
        raise ValueError("quantile of no values")
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _sample(send: MessageStamp, recv: MessageStamp, block_eps_ms: float) -> tuple[float, bool] | None:
    accepted = send.t1
    if math.isnan(accepted):
        return None
    if not math.isnan(recv.t1):  # arrival stamped by the transport
        return max(0.0, recv.t1 - accepted), True
    waited, returned = recv.t2, recv.t3
    if math.isnan(returned):
        return None
    blocked = not math.isnan(waited) and (waited <= accepted or returned - waited > block_eps_ms)
    return max(0.0, returned - accepted), blocked


def estimate_links(
    profiles: Iterable[StepProfile],
    num_stages: int,
    block_eps_ms: float = 1.0,
    jitter_ms: float = 1.0,
    per_byte_ms: Sequence[float | None] | None = None,
) -> list[LinkEstimate]:
    """Per link (0..R-2), the step's delay samples matched send→receive by (path, link, direction, seq);
    ``num_stages`` counts the pipeline's ranks (its stages with one stage per rank). The exact ones
    go through :func:`~titan_morph.monitor.bandwidth.estimate_wire` (``jitter_ms``: its jitter
    floor) per (path, direction): queued messages leave the delay samples for the transmit time.
    ``per_byte_ms``: per link, the rate a probe measured before (None: none), which tells queueing
    from latency where the step's messages do not measure a rate; a train in this step replaces it
    (when its transmit time is above :data:`PROBE_MIN_FLOORS` jitter floors)."""
    sends: dict[tuple[str, int, str, int], MessageStamp] = {}
    recvs: list[MessageStamp] = []
    for prof in profiles:
        for m in prof.messages:
            (sends.__setitem__(m.key, m) if m.side == "send" else recvs.append(m))
    out = [LinkEstimate(link) for link in range(num_stages - 1)]
    wires: dict[tuple[int, str, str], list[WireTiming]] = {}
    for recv in recvs:
        send = sends.get(recv.key)
        if send is None or not 0 <= recv.link < num_stages - 1:
            continue
        got = _sample(send, recv, block_eps_ms)
        if got is None:
            continue
        value, exact = got
        if recv.path == PROBE_PATH and not exact:
            continue  # a probe's message that was there before its wait: no rate, and no delay either
        if exact:
            size = recv.nbytes or send.nbytes
            wire = wires.setdefault((recv.link, recv.path, recv.direction), [])
            wire.append(WireTiming(recv.seq, send.t1, send.t1 + value, size))
        else:
            out[recv.link].bounds.append(value)
    known: list[float | None] = list(per_byte_ms) if per_byte_ms is not None else [None] * len(out)
    probes_first = sorted(wires.items(), key=lambda kv: (kv[0][1] != PROBE_PATH, kv[0]))
    for (link, path, direction), timings in probes_first:
        if path == PROBE_PATH:
            est = estimate_wire(timings, jitter_ms, min_transmit_ms=PROBE_MIN_FLOORS * jitter_ms)
            if est.per_byte_ms is not None:  # this step's train: the link's rate from now on
                known[link] = max(est.per_byte_ms, known[link] or 0.0)
        else:
            est = estimate_wire(timings, jitter_ms, known[link])
            out[link].exact.extend(est.costs_ms)  # a probe measures the rate; the delays are the pipeline's
        out[link].wires[(path, direction)] = est
    return out
