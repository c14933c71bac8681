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
  model serves static delays, the paper's random stragglers (§7.2) and trace replay (§7.5).
"""

from __future__ import annotations

import bisect
import csv
import math
import random
import threading
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .trace_rows import read_trace_rows

DIRECTIONS = ("fwd", "bwd")


class LinkDownError(RuntimeError):
    """A message was sent on a link whose delay is infinite (the link is down)."""

    def __init__(self, link: int, direction: str, when: str = "") -> None:
        self.link = link
        self.direction = direction
        super().__init__(f"pipeline link {link} ({link}<->{link + 1}, {direction}) is down{when}")


def _check_direction(direction: str) -> None:
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
        _check_direction(direction)
        tf, tb = self.static_transmit
        return (tf if direction == "fwd" else tb)[link]

    @classmethod
    def zeros(cls, num_links: int) -> StaticDelays:
        return cls((0.0,) * num_links)

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        _check_direction(direction)
        return (self.fwd if direction == "fwd" or self.bwd is None else self.bwd)[link]


class _Window:
    """One link's change points within one window of :class:`RandomDelays`: their times, delays
    and rates (NaN: none drawn) in arrays, drawn lazily from the window's own streams."""

    __slots__ = ("delays", "end", "index", "rates", "rng", "times")

    def __init__(self, owner: RandomDelays, link: int, index: int) -> None:
        tag = f"{owner.seed}:{link}" if index == 0 else f"{owner.seed}:{link}:{index}"
        rate_tag = f"{owner.seed}:{link}:rate" if index == 0 else f"{owner.seed}:{link}:rate:{index}"
        self.index = index
        self.end = (index + 1) * owner.window_ms
        self.rng = (random.Random(tag), random.Random(rate_tag))
        self.times, self.delays, self.rates = array("d"), array("d"), array("d")
        self._add(owner, index * owner.window_ms)

    def _add(self, owner: RandomDelays, at: float) -> None:
        delay, rate = owner._draw(self.rng)
        self.times.append(at)
        self.delays.append(delay)
        self.rates.append(math.nan if rate is None else rate)

    def at(self, owner: RandomDelays, t_ms: float) -> tuple[float, float | None]:
        times = self.times
        while times[-1] <= t_ms and times[-1] < self.end:  # extend lazily, in the one order of draws
            self._add(owner, times[-1] + self.rng[0].uniform(*owner.interval))
        k = max(0, bisect.bisect_right(times, t_ms) - 1)
        rate = self.rates[k]
        return self.delays[k], None if math.isnan(rate) else rate

    def __len__(self) -> int:
        return len(self.times)


@dataclass
class RandomDelays(LinkModel):
    """Paper §7.2 dynamic stragglers: each link's delay ~ N(mean, std) ms (clipped at 0),
    re-drawn at intervals ~ U(low, high) ms. Deterministic for a seed, so every rank and the
    simulator see the same delay at the same time. Both directions share the link's delay.
    With ``rates = (low, high)`` Mbit/s a straggling link's rate ~ U(low, high) is re-drawn with
    its delay, from a stream of its own (the delays are those of the same seed without rates).

    Any time is answered in constant time and bounded memory however long the run: time is cut
    into windows of :attr:`WINDOW_CHANGES` mean intervals (:attr:`window_ms`), and window ``w``
    draws from streams seeded by (seed, link, w), starting with a draw at its start. So a time,
    however old, costs at most one window's draws, and a link holds two windows: the newest one
    asked about (the transports' present) and one other (an old step the summary simulates).
    The first window is the stream of (seed, link) alone.
    """

    WINDOW_CHANGES = 512  # mean intervals per window (~77 s at the paper's 100-200 ms)

    num_links: int
    mean: float
    std: float
    interval: tuple[float, float]
    seed: int = 0
    links: tuple[int, ...] | None = None  # which links straggle; None = all
    rates: tuple[float, float] | None = None  # Mbit/s U(low, high) of the straggling links; None = not set
    _windows: list[list[_Window | None]] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        low, high = self.interval
        if not (0 < low <= high):
            raise ValueError(f"interval must satisfy 0 < low <= high ms, got {self.interval}")
        if self.mean < 0 or self.std < 0:
            raise ValueError(f"mean and std must be >= 0 ms, got mean={self.mean} std={self.std}")
        if self.rates is not None and not (len(self.rates) == 2 and 0 < self.rates[0] <= self.rates[1] < math.inf):
            raise ValueError(f"rates must be (low, high) Mbit/s with 0 < low <= high, got {self.rates}")
        active = set(range(self.num_links) if self.links is None else self.links)
        for link in active:
            if not 0 <= link < self.num_links:
                raise ValueError(f"link {link} out of range 0..{self.num_links - 1}")
        self._active = active
        self.window_ms = self.WINDOW_CHANGES * (low + high) / 2.0
        self._windows = [[None, None] for _ in range(self.num_links)]  # per link: [newest, other]
        self._lock = threading.Lock()  # the transports' threads ask too: one extends a window at a time

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _draw(self, rng: tuple[random.Random, random.Random]) -> tuple[float, float | None]:
        """(delay, rate) of one change (no rate drawn when rates are not set)."""
        delay = max(0.0, rng[0].gauss(self.mean, self.std))
        return delay, None if self.rates is None else rng[1].uniform(*self.rates)

    def _window(self, link: int, index: int) -> _Window:
        """The link's window ``index``: a held one, or drawn anew (it then replaces the newest when
        it is later, else the other)."""
        slots = self._windows[link]
        for win in slots:
            if win is not None and win.index == index:
                return win
        win, newest = _Window(self, link, index), slots[0]
        if newest is None or index > newest.index:
            slots[0], slots[1] = win, newest
        else:
            slots[1] = win
        return win

    def _at(self, link: int, t_ms: float) -> tuple[float, float | None]:
        if link not in self._active:
            return 0.0, None
        index = max(0, math.floor(t_ms / self.window_ms)) if math.isfinite(t_ms) else 0
        with self._lock:
            return self._window(link, index).at(self, t_ms)

    def held(self, link: int) -> int:
        """Change points held for ``link`` (two windows' at most, whatever the run's length)."""
        return sum(len(w) for w in self._windows[link] if w is not None)

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        _check_direction(direction)
        return self._at(link, t_ms)[0]

    def rate_mbit(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float | None:
        _check_direction(direction)
        return self._at(link, t_ms)[1] if self.rates is not None else None


@dataclass(frozen=True)
class TraceEvent:
    """From ``at`` (a step, or ms since the epoch) on, ``link`` has ``delay_ms`` in ``direction``,
    and the rate ``bandwidth_mbit`` (0 = unlimited; None = the event does not set one)."""

    at: float
    link: int
    delay_ms: float
    direction: str = "both"
    bandwidth_mbit: float | None = None


@dataclass
class TraceDelays(LinkModel):
    """Trace replay (paper §7.5 / Table 3): piecewise-constant delays keyed by step or time.

    Each event sets the delay of its link from ``at`` until the next event on that link; before the
    first event a link has no delay. Events with a ``bandwidth_mbit`` set the link's rate the same
    way (:meth:`rate_mbit`; before the first of them the rate is not set here). ``key`` is
    ``"step"`` or ``"time_ms"``.
    """

    num_links: int
    events: tuple[TraceEvent, ...]
    key: str = "step"

    def __post_init__(self) -> None:
        if self.key not in ("step", "time_ms"):
            raise ValueError(f"trace key must be 'step' or 'time_ms', got {self.key!r}")
        self._series: dict[tuple[int, str], tuple[list[float], list[float]]] = {}
        self._rates: dict[tuple[int, str], tuple[list[float], list[float]]] = {}
        for ev in sorted(self.events, key=lambda e: e.at):
            if not 0 <= ev.link < self.num_links:
                raise ValueError(f"trace event link {ev.link} out of range 0..{self.num_links - 1}")
            if not ev.delay_ms >= 0:
                raise ValueError(f"trace event delay must be >= 0 ms (inf = down), got {ev.delay_ms}")
            rate = ev.bandwidth_mbit
            if rate is not None and not (rate >= 0 and math.isfinite(rate)):
                raise ValueError(f"trace event bandwidth_mbit must be finite and >= 0 (0 = unlimited), got {rate}")
            dirs = DIRECTIONS if ev.direction == "both" else (ev.direction,)
            for d in dirs:
                _check_direction(d)
                keys, vals = self._series.setdefault((ev.link, d), ([], []))
                keys.append(float(ev.at))
                vals.append(float(ev.delay_ms))
                if rate is not None:
                    keys, vals = self._rates.setdefault((ev.link, d), ([], []))
                    keys.append(float(ev.at))
                    vals.append(float(rate))

    @property
    def has_rates(self) -> bool:
        """Whether any event sets a rate (a ``bandwidth_mbit`` column)."""
        return bool(self._rates)

    def _lookup(
        self,
        table: dict[tuple[int, str], tuple[list[float], list[float]]],
        link: int,
        direction: str,
        t_ms: float,
        step: int,
    ) -> float | None:
        _check_direction(direction)
        series = table.get((link, direction))
        if series is None:
            return None
        keys, vals = series
        k = bisect.bisect_right(keys, step if self.key == "step" else t_ms) - 1
        return vals[k] if k >= 0 else None

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        value = self._lookup(self._series, link, direction, t_ms, step)
        return 0.0 if value is None else value

    def rate_mbit(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float | None:
        return self._lookup(self._rates, link, direction, t_ms, step)

    @classmethod
    def from_csv(cls, path: str | Path, num_links: int) -> TraceDelays:
        """Read the link rows (:mod:`.trace_rows`) of ``step`` (or ``time_ms``), ``link``,
        ``delay_ms`` [, ``direction``] [, ``bandwidth_mbit``]; an empty delay is 0 and, with the
        rate column, an empty rate or 0 is unlimited."""
        found = read_trace_rows(path)
        rows = [row for _, row in found.links]
        if not rows:
            raise ValueError(f"trace {path}: no link events")
        cols = found.columns
        key = "step" if "step" in cols else "time_ms" if "time_ms" in cols else None
        if key is None or not {"link", "delay_ms"} <= cols:
            raise ValueError(f"trace {path}: needs columns step|time_ms, link, delay_ms; got {sorted(cols)}")
        rated = "bandwidth_mbit" in cols
        events = tuple(
            TraceEvent(
                float(r[key]),
                int(r["link"]),
                float(r["delay_ms"] or 0.0),
                r.get("direction") or "both",
                float(r["bandwidth_mbit"] or 0.0) if rated else None,
            )
            for r in rows
        )
        return cls(num_links, events, key)

    def to_csv(self, path: str | Path) -> None:
        rated = any(ev.bandwidth_mbit is not None for ev in self.events)
        with open(path, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow([self.key, "link", "delay_ms", "direction"] + (["bandwidth_mbit"] if rated else []))
            for ev in sorted(self.events, key=lambda e: (e.at, e.link)):
                rate = [] if not rated else ["" if ev.bandwidth_mbit is None else ev.bandwidth_mbit]
                writer.writerow([ev.at, ev.link, ev.delay_ms, ev.direction, *rate])


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
        _check_direction(direction)
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
        _check_direction(direction)
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
        _check_direction(direction)
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


def table3_trace(num_stages: int = 4, steps: int = 200, paper_stages: int = 8, paper_steps: int = 1100) -> TraceDelays:
    """The paper's Table 3 straggler trace (adaptra-arxiv appendix), rescaled.

    Steps are scaled by ``steps / paper_steps`` (1100 by default, so the link-down event at
    paper step 1030 falls inside the run) and the 8-stage links mapped onto
    ``num_stages - 1`` links proportionally; event 9 (step 1030) takes link 2<->3 of the paper
    down (``inf``) for good. Overlapping mapped events keep the larger delay.
    """
    paper = [  # (start, end, [links as i for i<->i+1], delay ms)
        (15, 85, [2, 5], 30.0),
        (120, 190, [0, 6], 40.0),
        (230, 300, [2, 3], 20.0),
        (340, 410, [6, 5], 50.0),
        (450, 520, [1, 6], 60.0),
        (560, 630, [0, 4], 60.0),
        (670, 740, [0, 1], 20.0),
        (780, 850, [2, 4], 40.0),
        (890, 960, [5], 50.0),
        (1030, None, [2], math.inf),
    ]
    links = num_stages - 1
    if links < 1:
        raise ValueError("table3_trace needs at least 2 stages")
    scale = steps / paper_steps

    def map_link(pl: int) -> int:
        return min(links - 1, pl * links // (paper_stages - 1))

    # Build per-link interval lists, then flatten into set/reset events.
    intervals: dict[int, list[tuple[float, float, float]]] = {}
    for start, end, plinks, delay in paper:
        s = round(start * scale)
        e = math.inf if end is None else max(s + 1, round(end * scale))
        for pl in plinks:
            intervals.setdefault(map_link(pl), []).append((s, e, delay))
    events: list[TraceEvent] = []
    for link, ivs in intervals.items():
        points = sorted({p for s, e, _ in ivs for p in (s, e) if math.isfinite(p)})
        prev = None
        for p in points:
            active = [d for s, e, d in ivs if s <= p < e]
            value = max(active) if active else 0.0
            if value != prev:
                events.append(TraceEvent(p, link, value))
                prev = value
    return TraceDelays(links, tuple(events), key="step")


def parse_delays(
    spec: str | Sequence[float] | None, num_links: int, name: str = "delays", *, allow_inf: bool = True
) -> tuple[float, ...]:
    """Parse ``"0,30,inf"`` or a list into ``num_links`` non-negative delays in ms (a scalar
    broadcasts; ``None``/``""`` = no delay; ``inf`` = the link is down), with :func:`values.parse_list`.
    Transmit times use it too, with ``allow_inf=False``."""
    from .values import parse_list

    values = parse_list(spec, float, name=name, low=0.0, allow_inf=allow_inf)
    if not values:
        return (0.0,) * num_links
    if len(values) == 1:
        return values * num_links
    if len(values) != num_links:
        raise ValueError(f"{name} needs {num_links} values (one per link), got {len(values)}")
    return values
