"""The link model: one definition of inter-stage delay shared by the simulator and the emulator.

The simulator (``simulate``) uses it to predict iteration time; the link emulator
(``titan_morph.comm.emulator.transport``) uses the very same objects to delay real messages, so predicted
and measured iteration times are comparable (architecture contract).

Semantics (documented once, here):

* Link ``i`` joins stage ``i`` and ``i+1``. Direction ``"fwd"`` carries activations
  ``i → i+1``; ``"bwd"`` carries gradients ``i+1 → i``.
* A message accepted on a link at time ``t`` with delay ``c`` is delivered at ``t + c``, and
  never before an earlier message on the same (link, direction): links are FIFO.
* Bandwidth: a link may also have a per-message transmit time ``tau`` (size / rate,
  :meth:`LinkModel.transmit_ms`). It sends one message at a time per direction, in the order they
  were accepted: transmission starts at ``max(t, end of the previous transmission)``, takes ``tau``,
  and the latency ``c`` follows; delivery = start + tau + c. ``tau = 0`` is the delay-only model
  above, bit for bit (:class:`StaticDelays` ``transmit=``, :class:`WithTransmit` for other models).
  A rate instead of a time: :class:`Bandwidth` gives ``tau`` = message bytes x 8 / rate, from a
  fixed message size per (link, direction) and a rate per link, which a model may vary itself
  (:meth:`LinkModel.rate_mbit`: random re-draws, a trace's ``bandwidth_mbit`` column).
* ``LinkQueue(depth=d)`` models the default (NCCL-like) transport: at most ``d`` messages are in
  flight (accepted, not yet delivered) per (link, direction); issuing a send while ``d`` are in
  flight blocks the caller until the oldest one is delivered. ``depth=None`` models a decoupled
  (delegated) transport: sends never block the caller.
* A delay of ``math.inf`` means the link is down: :class:`LinkDownError`.
* Delay models are functions of (link, direction, time since the run's epoch in ms, step), so one
  model serves static delays, the paper's random stragglers (§7.2) and trace replay (§7.5); the
  time-varying ones are in :mod:`stragglers`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

DIRECTIONS = ("fwd", "bwd")


class LinkDownError(RuntimeError):
    """A message was sent on a link whose delay is infinite (the link is down)."""

    def __init__(self, link: int, direction: str, when: str = "") -> None:
        self.link = link
        self.direction = direction
        super().__init__(f"pipeline link {link} ({link}<->{link + 1}, {direction}) is down{when}")


def check_direction(direction: str) -> None:
    """Refuse a direction other than ``"fwd"`` or ``"bwd"``."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


class LinkModel:
    """Base class: delay in ms of a message accepted on ``link``/``direction`` at ``t_ms``/``step``."""

    num_links: int

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        raise NotImplementedError

    def transmit_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        """Time the link needs to put one message on the wire (size / rate); 0 = delay-only model."""
        return 0.0

    def rate_mbit(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float | None:
        """The link's rate in Mbit/s where this model sets it (0 = unlimited); None = not set here
        (:class:`Bandwidth` then uses its configured rate)."""
        return None

    def snapshot(self, t_ms: float = 0.0, step: int = 0) -> tuple[float, ...]:
        """Per-link delay (max over directions) at one instant: what a planner would assume."""
        return tuple(max(self.delay_ms(link, d, t_ms, step) for d in DIRECTIONS) for link in range(self.num_links))

    def transmit_snapshot(self, t_ms: float = 0.0, step: int = 0) -> tuple[float, ...]:
        """Per-link transmit time (max over directions) at one instant: the planner's ``CostModel.transmit``."""
        return tuple(max(self.transmit_ms(link, d, t_ms, step) for d in DIRECTIONS) for link in range(self.num_links))


def _check_transmit(values: tuple[float, ...], links: int) -> tuple[float, ...]:
    if len(values) != links:
        raise ValueError(f"transmit times need {links} values (one per link), got {len(values)}")
    for t in values:
        if not (t >= 0 and math.isfinite(t)):
            raise ValueError(f"transmit times must be finite and >= 0 ms per message, got {t}")
    return values


@dataclass
class StaticDelays(LinkModel):
    """Constant per-link latencies and transmit times; ``bwd`` defaults to ``fwd`` (symmetric link),
    ``transmit`` to 0 (delay-only) and ``transmit_bwd`` to ``transmit``."""

    fwd: tuple[float, ...]
    bwd: tuple[float, ...] | None = None
    transmit: tuple[float, ...] | None = None
    transmit_bwd: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        self.fwd = tuple(float(d) for d in self.fwd)
        self.bwd = self.fwd if self.bwd is None else tuple(float(d) for d in self.bwd)
        if len(self.bwd) != len(self.fwd):
            raise ValueError(f"bwd delays need {len(self.fwd)} values (one per link), got {len(self.bwd)}")
        for d in self.fwd + self.bwd:
            if not d >= 0:
                raise ValueError(f"link delays must be >= 0 ms (inf = link down), got {d}")
        self.num_links = len(self.fwd)
        tf = (0.0,) * self.num_links if self.transmit is None else tuple(float(t) for t in self.transmit)
        self.transmit = _check_transmit(tf, self.num_links)
        tb = tf if self.transmit_bwd is None else tuple(float(t) for t in self.transmit_bwd)
        self.transmit_bwd = _check_transmit(tb, self.num_links)

    @property
    def static_transmit(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(fwd, bwd) per-link transmit times."""
        tf = self.transmit if self.transmit is not None else (0.0,) * self.num_links
        return tf, tf if self.transmit_bwd is None else self.transmit_bwd

    def transmit_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        check_direction(direction)
        tf, tb = self.static_transmit
        return (tf if direction == "fwd" else tb)[link]

    @classmethod
    def zeros(cls, num_links: int) -> StaticDelays:
        return cls((0.0,) * num_links)

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        check_direction(direction)
        return (self.fwd if direction == "fwd" or self.bwd is None else self.bwd)[link]


@dataclass
class WithTransmit(LinkModel):
    """Any delay model (latency: random stragglers, a trace...) plus constant per-link transmit
    times, so latency and bandwidth share one per-link description. ``transmit_bwd`` defaults to
    ``transmit``."""

    base: LinkModel
    transmit: tuple[float, ...]
    transmit_bwd: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        self.num_links = self.base.num_links
        self.transmit = _check_transmit(tuple(float(t) for t in self.transmit), self.num_links)
        tb = self.transmit if self.transmit_bwd is None else tuple(float(t) for t in self.transmit_bwd)
        self.transmit_bwd = _check_transmit(tb, self.num_links)

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        return self.base.delay_ms(link, direction, t_ms, step)

    def transmit_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        check_direction(direction)
        tb = self.transmit if self.transmit_bwd is None else self.transmit_bwd
        return (self.transmit if direction == "fwd" else tb)[link]


def transmit_ms_of(nbytes: float, mbit: float) -> float:
    """Time to put ``nbytes`` on a wire of ``mbit`` Mbit/s, in ms (0 Mbit/s = unlimited: 0 ms)."""
    return nbytes * 8.0 / (mbit * 1e3) if mbit > 0 else 0.0


@dataclass
class Bandwidth(LinkModel):
    """Any delay model plus a rate per link: one message of ``message_bytes[link]`` = (fwd, bwd)
    bytes takes bytes x 8 / rate to transmit. The rate is the base model's where it sets one
    (:meth:`LinkModel.rate_mbit`: random re-draws, a trace column), else ``rates_mbit[link]``
    (0 = unlimited). Time-varying rates vary the transmit time through the same ``LinkQueue``."""

    base: LinkModel
    rates_mbit: tuple[float, ...]
    message_bytes: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        self.num_links = self.base.num_links
        self.rates_mbit = tuple(float(r) for r in self.rates_mbit)
        self.message_bytes = tuple((int(f), int(b)) for f, b in self.message_bytes)
        for name, values in (("rates_mbit", self.rates_mbit), ("message_bytes", self.message_bytes)):
            if len(values) != self.num_links:
                raise ValueError(f"{name} needs {self.num_links} values (one per link), got {len(values)}")
        for r in self.rates_mbit:
            if not (r >= 0 and math.isfinite(r)):
                raise ValueError(f"rates must be finite and >= 0 Mbit/s (0 = unlimited), got {r}")
        for pair in self.message_bytes:
            if min(pair) < 0:
                raise ValueError(f"message sizes must be >= 0 bytes, got {pair}")

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        return self.base.delay_ms(link, direction, t_ms, step)

    def rate_mbit(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float | None:
        rate = self.base.rate_mbit(link, direction, t_ms, step)
        return self.rates_mbit[link] if rate is None else rate

    def transmit_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        check_direction(direction)
        rate = self.rate_mbit(link, direction, t_ms, step)
        size = self.message_bytes[link][0 if direction == "fwd" else 1]
        return transmit_ms_of(size, rate or 0.0)


@dataclass(frozen=True)
class SendTiming:
    """When a send was issued by the caller, accepted by the link, and delivered to the peer;
    ``started``/``finished`` bound its transmission (both = ``accepted`` with no transmit time)."""

    issued: float
    accepted: float
    delivered: float
    started: float | None = None
    finished: float | None = None

    @property
    def on_wire(self) -> tuple[float, float]:
        """(start, end) of the transmission: the link's occupancy by this message."""
        start = self.accepted if self.started is None else self.started
        return start, start if self.finished is None else self.finished

    @property
    def blocked(self) -> float:
        """How long the caller was blocked (head-of-line blocking)."""
        return self.accepted - self.issued


class LinkQueue:
    """FIFO of one (link, direction) with at most ``depth`` in-flight messages (None = unbounded).

    ``send`` is a pure function of the history, so the simulator can replay it and the emulator
    can use it to decide when a real message is released and how long the caller must block.
    """

    def __init__(self, model: LinkModel, link: int, direction: str, depth: int | None = None) -> None:
        check_direction(direction)
        if depth is not None and depth < 1:
            raise ValueError(f"link queue depth must be >= 1 (or None for non-blocking), got {depth}")
        self.model, self.link, self.direction, self.depth = model, link, direction, depth
        self._in_flight: deque[float] = deque()  # delivery times, non-decreasing
        self._last_delivery = -math.inf
        self._wire_free = -math.inf  # when the link finishes transmitting the last message

    def send(self, t_issue: float, step: int = 0) -> SendTiming:
        """Account one message issued at ``t_issue``; raises :class:`LinkDownError` if the link is down."""
        accepted = t_issue
        if self.depth is not None:
            while self._in_flight and self._in_flight[0] <= t_issue:
                self._in_flight.popleft()
            if len(self._in_flight) >= self.depth:
                accepted = self._in_flight[len(self._in_flight) - self.depth]
                while self._in_flight and self._in_flight[0] <= accepted:
                    self._in_flight.popleft()
        tau = self.model.transmit_ms(self.link, self.direction, accepted, step)
        start = accepted
        if tau > 0:  # one message on the wire at a time, in acceptance order
            start = max(accepted, self._wire_free)
            if start > accepted:
                tau = self.model.transmit_ms(self.link, self.direction, start, step)
            self._wire_free = start + tau
        delay = self.model.delay_ms(self.link, self.direction, start, step)
        if math.isinf(delay):
            raise LinkDownError(self.link, self.direction, f" at t={start:.1f} ms, step {step}")
        delivered = max(start + tau + delay, self._last_delivery)  # tau = 0: start = accepted, as before
        self._last_delivery = delivered
        if self.depth is not None:
            self._in_flight.append(delivered)
        if tau > 0:
            return SendTiming(t_issue, accepted, delivered, start, start + tau)
        return SendTiming(t_issue, accepted, delivered)


def parse_delays(
    spec: str | Sequence[float] | None, num_links: int, name: str = "delays", *, allow_inf: bool = True
) -> tuple[float, ...]:
    """Parse ``"0,30,inf"`` or a list into ``num_links`` non-negative delays in ms (a scalar
    broadcasts; ``None``/``""`` = no delay; ``inf`` = the link is down), with :func:`values.parse_list`.
    Transmit times use it too, with ``allow_inf=False``."""
    from titan_morph.pipelining.core.values import parse_list

    values = parse_list(spec, float, name=name, low=0.0, allow_inf=allow_inf)
    if not values:
        return (0.0,) * num_links
    if len(values) == 1:
        return values * num_links
    if len(values) != num_links:
        raise ValueError(f"{name} needs {num_links} values (one per link), got {len(values)}")
    return values
