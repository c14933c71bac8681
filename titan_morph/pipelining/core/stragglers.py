"""Time-varying link delays: the paper's random stragglers (§7.2, :class:`RandomDelays`) and trace
replay (§7.5 / Table 3, :class:`TraceDelays`, :func:`table3_trace`).

They are :class:`links.LinkModel` objects like the static ones, with the semantics documented in
:mod:`links`; they live apart because they need random streams, windows and CSV traces that the
simulator's static path never touches.
"""

from __future__ import annotations

import bisect
import csv
import math
import random
import threading
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from titan_morph.pipelining.core.links import DIRECTIONS, LinkModel, check_direction
from titan_morph.pipelining.core.trace_rows import read_trace_rows


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
        check_direction(direction)
        return self._at(link, t_ms)[0]

    def rate_mbit(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float | None:
        check_direction(direction)
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
                check_direction(d)
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
        check_direction(direction)
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
