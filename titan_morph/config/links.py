"""From ``[morph.inject]`` to the link models the emulator and the simulator share.

One definition per mode (static, random, trace, break, rank pairs), so the delays a run injects
and the delays the simulator and the end-of-run summary assume are the same objects.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from titan_morph.comm.collectives import PairDelays
from titan_morph.config.fields import fail, limit_reason
from titan_morph.pipelining.links import DIRECTIONS, LinkModel, RandomDelays, StaticDelays, TraceDelays, table3_trace

if TYPE_CHECKING:
    from titan_morph.config.settings import InjectSettings

__all__ = ["BUILTIN_TRACES", "break_window", "check_trace", "link_model", "pair_delays", "trace_path"]

BUILTIN_TRACES = ("table3",)


def trace_path(spec: str) -> str:
    return spec if spec in BUILTIN_TRACES else os.path.expanduser(spec)


def _short_row(path: str) -> str:
    """Where a trace CSV has a row with fewer fields than its header ('' if none)."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    header = len(rows[0]) if rows else 0
    for line, row in enumerate(rows[1:], 2):
        if row and len(row) < header:
            return f"line {line} has {len(row)} fields, the header has {header}"
    return ""


def check_trace(spec: str, links: int | None, limit: float | None) -> None:
    """A trace file exists, parses for ``links`` links and stays within the delay ``limit``."""
    key = "morph.inject.trace_file"
    if not spec:
        raise fail(key, spec, f"is empty: trace mode needs a CSV path or one of {', '.join(BUILTIN_TRACES)}")
    path = trace_path(spec)
    if path in BUILTIN_TRACES:
        return
    if not os.path.isfile(path):
        raise fail(key, spec, "file not found")
    if links is None:
        return
    try:
        trace = TraceDelays.from_csv(path, links)
    except (ValueError, KeyError, TypeError) as err:
        short = _short_row(path) if isinstance(err, TypeError) else ""
        raise fail(key, spec, short or str(err)) from None
    worst = max((e.delay_ms for e in trace.events if math.isfinite(e.delay_ms)), default=0.0)
    if limit is not None and worst > limit:
        raise fail(key, spec, f"has a delay of {worst:g} ms; {limit_reason(limit)}")


@dataclass
class _Windowed(LinkModel):
    """A link model restricted to a step window and a direction ([morph.inject] start/end/direction)."""

    inner: LinkModel
    start_step: int = 1
    end_step: int = 0
    direction: str = "both"

    def __post_init__(self) -> None:
        self.num_links = self.inner.num_links

    def _active(self, direction: str, step: int) -> bool:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        if self.direction != "both" and direction != self.direction:
            return False
        return not (step < self.start_step or (self.end_step and step > self.end_step))

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        return self.inner.delay_ms(link, direction, t_ms, step) if self._active(direction, step) else 0.0

    def transmit_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        return self.inner.transmit_ms(link, direction, t_ms, step) if self._active(direction, step) else 0.0


def pair_delays(inject: InjectSettings) -> PairDelays | None:
    """The host-pair delays of ``rank_links`` (None when no pair is named or mode = none)."""
    if not inject.rank_links or inject.mode == "none":
        return None
    delays = inject.delays_ms * len(inject.rank_links) if len(inject.delays_ms) == 1 else inject.delays_ms
    return PairDelays(dict(zip(inject.rank_links, delays)), inject.start_step, inject.end_step)


def link_model(
    inject: InjectSettings, num_links: int, steps: int = 200, hosts: Sequence[int] | None = None
) -> LinkModel | None:
    """The injected-delay model for ``num_links`` links (None when mode = none, or break, which
    fails the real path instead of modelling a delay).

    ``steps`` (the run's training steps) rescales the built-in Table 3 trace onto the run. With
    ``rank_links``, ``hosts`` (the host of each stage of this pipeline, first to last) gives link
    ``i`` the delay of the pair (hosts[i], hosts[i+1]).
    """
    if inject.mode in ("none", "break"):
        return None
    pairs = pair_delays(inject)
    if pairs is not None:
        if hosts is None or len(hosts) != num_links + 1:
            raise ValueError(f"rank_links: the hosts of the pipeline's {num_links + 1} stages are needed, got {hosts}")
        delays = tuple(pairs.delays.get((min(a, b), max(a, b)), 0.0) for a, b in zip(hosts, hosts[1:]))
        return _Windowed(StaticDelays(delays), inject.start_step, inject.end_step, inject.direction)
    inner: LinkModel
    if inject.mode == "static":
        delays = inject.delays_ms * num_links if len(inject.delays_ms) == 1 else inject.delays_ms
        inner = StaticDelays(delays)
    elif inject.mode == "random":
        low, high = inject.random_interval_ms
        inner = RandomDelays(
            num_links, inject.random_mean_ms, inject.random_std_ms, (low, high), inject.seed, inject.links or None
        )
    else:
        path = trace_path(inject.trace_file)
        inner = table3_trace(num_links + 1, steps) if path == "table3" else TraceDelays.from_csv(path, num_links)
    return _Windowed(inner, inject.start_step, inject.end_step, inject.direction)


def break_window(inject: InjectSettings, num_links: int) -> tuple[frozenset[int], int, int] | None:
    """Break mode: (the links that fail, first step, last step or 0 = for good); None otherwise."""
    if inject.mode != "break":
        return None
    return frozenset(inject.links or range(num_links)), inject.start_step, inject.end_step
