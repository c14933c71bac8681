"""From ``[morph.inject]`` to the link models the emulator and the simulator share.

One definition per mode (static, random, trace, break, rank pairs), so the delays a run injects
and the delays the simulator and the end-of-run summary assume are the same objects.

Bandwidth (``bandwidth_mbit``, ``random_bandwidth_mbit``, a trace's ``bandwidth_mbit`` column) turns a
rate into a transmit time per message, bytes x 8 / rate: the builder is given each link's message
size per direction (:func:`configured_message_bytes`, or the stage's activations where the model is
known), so the emulator and the simulator time the same bytes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from titan_morph.config.fields import fail, limit_reason
from titan_morph.pipelining.core.links import DIRECTIONS, Bandwidth, LinkModel, StaticDelays
from titan_morph.pipelining.core.speeds import (
    ComputeModel,
    RandomFactors,
    StaticFactors,
    TraceFactors,
    WindowedFactors,
    is_compute_trace,
)
from titan_morph.pipelining.core.stragglers import RandomDelays, TraceDelays, table3_trace
from titan_morph.pipelining.core.trace_rows import read_trace_rows

if TYPE_CHECKING:
    from titan_morph.comm.emulator.collectives import PairDelays
    from titan_morph.config.settings import InjectSettings, MorphSettings, Settings

__all__ = [
    "BUILTIN_TRACES",
    "MessageBytes",
    "bandwidth_keys",
    "break_window",
    "check_trace",
    "compute_model",
    "configured_message_bytes",
    "link_model",
    "pair_delays",
    "plan_transmit",
    "trace_path",
]

MessageBytes = int | Sequence[tuple[int, int]]
"""One size for every message, or (fwd, bwd) bytes per link."""

BUILTIN_TRACES = ("table3",)


def trace_path(spec: str) -> str:
    return spec if spec in BUILTIN_TRACES else os.path.expanduser(spec)


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
    try:
        if is_compute_trace(path):
            TraceFactors.from_csv(path, links + 1 if links is not None else 1 << 30)
        if not read_trace_rows(path).links:
            return
    except ValueError as err:
        raise fail(key, spec, str(err)) from None
    if links is None:
        return
    try:
        trace = TraceDelays.from_csv(path, links)
    except (ValueError, KeyError) as err:
        raise fail(key, spec, str(err)) from None
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
    from titan_morph.comm.emulator.collectives import PairDelays  # torch: only where a job builds them

    return PairDelays(dict(zip(inject.rank_links, delays)), inject.start_step, inject.end_step)


def configured_message_bytes(settings: Settings) -> int | None:
    """Bytes of every inter-stage message when the configuration alone fixes them: the synthetic
    testbed's ``message_kb`` (activations and gradients alike); None otherwise (the model's)."""
    syn = settings.morph.synthetic
    return round(syn.message_kb * 1024) if syn.enabled and syn.message_kb > 0 else None


def bandwidth_keys(inject: InjectSettings) -> list[str]:
    """The bandwidth options ``inject`` sets (a rate limit on some link), by key."""
    keys = []
    if any(r > 0 for r in inject.bandwidth_mbit):
        keys.append("morph.inject.bandwidth_mbit")
    if inject.random_bandwidth_mbit:
        keys.append("morph.inject.random_bandwidth_mbit")
    return keys


def _per_link_bytes(message_bytes: MessageBytes, num_links: int) -> tuple[tuple[int, int], ...]:
    if isinstance(message_bytes, int):
        return ((message_bytes, message_bytes),) * num_links
    sizes = tuple((int(f), int(b)) for f, b in message_bytes)
    if len(sizes) != num_links:
        raise ValueError(f"message sizes: {num_links} (fwd, bwd) pairs needed (one per link), got {len(sizes)}")
    return sizes


def _with_bandwidth(
    inject: InjectSettings, inner: LinkModel, num_links: int, message_bytes: MessageBytes | None
) -> LinkModel:
    """``inner`` with the configured rates, when any link has one (else ``inner`` itself)."""
    rated = bool(bandwidth_keys(inject)) or (isinstance(inner, TraceDelays) and inner.has_rates)
    if not rated:
        return inner
    if message_bytes is None:
        key = (bandwidth_keys(inject) or ["morph.inject.trace_file"])[0]
        raise ValueError(
            f"{key}: a rate needs the size of each link's messages, unknown for this model: "
            "set [morph.synthetic] message_kb (synthetic testbed) or use a llama3 model"
        )
    rates = inject.bandwidth_mbit or (0.0,)
    rates = rates * num_links if len(rates) == 1 else rates
    return Bandwidth(inner, tuple(rates), _per_link_bytes(message_bytes, num_links))


def link_model(
    inject: InjectSettings,
    num_links: int,
    steps: int = 200,
    hosts: Sequence[int] | Sequence[Sequence[int]] | None = None,
    message_bytes: MessageBytes | None = None,
) -> LinkModel | None:
    """The injected-delay model for ``num_links`` links (None when mode = none, or break, which
    fails the real path instead of modelling a delay).

    ``steps`` (the run's training steps) rescales the built-in Table 3 trace onto the run. With
    ``rank_links``, ``hosts`` (the host of each stage of this pipeline, first to last) gives link
    ``i`` the delay of the pair (hosts[i], hosts[i+1]); given the hosts of several pipelines (the TP
    lanes of one), each link gets its slowest lane's delay: what the step waits for.
    ``message_bytes`` (one size, or (fwd, bwd) per link) turns the configured rates into transmit
    times; needed only when a rate is set.
    """
    if inject.mode in ("none", "break") or not _links_emulated(inject):
        return None
    pairs = pair_delays(inject)
    if pairs is not None:
        rows = _host_rows(hosts)
        if not rows or any(len(row) != num_links + 1 for row in rows):
            raise ValueError(f"rank_links: the hosts of the pipeline's {num_links + 1} stages are needed, got {hosts}")
        delays = tuple(
            max(pairs.delays.get((min(row[i], row[i + 1]), max(row[i], row[i + 1])), 0.0) for row in rows)
            for i in range(num_links)
        )
        return _Windowed(StaticDelays(delays), inject.start_step, inject.end_step, inject.direction)
    inner: LinkModel
    if inject.mode == "static":
        delays = inject.delays_ms * num_links if len(inject.delays_ms) == 1 else inject.delays_ms
        inner = StaticDelays(delays)
    elif inject.mode == "random":
        low, high = inject.random_interval_ms
        rates = inject.random_bandwidth_mbit
        inner = RandomDelays(
            num_links,
            inject.random_mean_ms,
            inject.random_std_ms,
            (low, high),
            inject.seed,
            inject.links or None,
            rates=(rates[0], rates[1]) if rates else None,
        )
    else:
        path = trace_path(inject.trace_file)
        inner = table3_trace(num_links + 1, steps) if path == "table3" else TraceDelays.from_csv(path, num_links)
    inner = _with_bandwidth(inject, inner, num_links, message_bytes)
    return _Windowed(inner, inject.start_step, inject.end_step, inject.direction)


def _host_rows(hosts: Sequence[int] | Sequence[Sequence[int]] | None) -> list[Sequence[int]]:
    """``hosts`` as one row per pipeline (a single pipeline's list is one row)."""
    if not hosts:
        return []
    if isinstance(hosts[0], int):
        return [cast("Sequence[int]", hosts)]
    return [cast("Sequence[int]", row) for row in hosts]


def _links_emulated(inject: InjectSettings) -> bool:
    """Whether ``inject`` delays links (else it injects compute factors only)."""
    if inject.mode == "static":
        return bool(inject.delays_ms)
    if inject.mode == "random":
        quiet = inject.random_mean_ms == 0 and inject.random_std_ms == 0 and not bandwidth_keys(inject)
        return not (quiet and inject.compute_factor)
    if inject.mode == "trace":
        path = trace_path(inject.trace_file)
        return path in BUILTIN_TRACES or not os.path.isfile(path) or bool(read_trace_rows(path).links)
    return inject.mode != "none"


def _trace_sets_ranks(inject: InjectSettings) -> bool:
    """Whether ``inject``'s trace file has rank rows (compute factors)."""
    path = trace_path(inject.trace_file)
    return path not in BUILTIN_TRACES and os.path.isfile(path) and is_compute_trace(path)


def compute_model(inject: InjectSettings, ranks: int) -> ComputeModel | None:
    """The injected compute factors of ``ranks`` pipeline ranks (:mod:`titan_morph.pipelining.core.speeds`),
    within ``start_step``..``end_step``; None when nothing slows compute. A ``compute_factor`` list of
    one value per rank of the world (DP x PP) gives a model of that many ranks, indexed by host."""
    inner: ComputeModel
    factors = inject.compute_factor * ranks if len(inject.compute_factor) == 1 else inject.compute_factor
    if inject.mode == "static" and factors:
        inner = StaticFactors(factors)
    elif inject.mode == "random" and factors:
        inner = RandomFactors(factors, inject.seed)
    elif inject.mode == "trace" and _trace_sets_ranks(inject):
        inner = TraceFactors.from_csv(trace_path(inject.trace_file), ranks)
    else:
        return None
    return WindowedFactors(inner, inject.start_step, inject.end_step)


def plan_transmit(morph: MorphSettings, links: LinkModel | None) -> tuple[float, ...] | None:
    """Per-link transmit times PipeMorph's initial plan assumes: the injected rates' at
    ``start_step`` (max over directions), when the plan is made for known link conditions
    (``plan_delays_ms``) and some link has a rate; None otherwise (the planner's ``CostModel.transmit``)."""
    if links is None or not morph.plan_delays_ms:
        return None
    transmit = links.transmit_snapshot(step=morph.inject.start_step)
    return transmit if any(t > 0 for t in transmit) else None


def break_window(inject: InjectSettings, num_links: int) -> tuple[frozenset[int], int, int] | None:
    """Break mode: (the links that fail, first step, last step or 0 = for good); None otherwise."""
    if inject.mode != "break":
        return None
    return frozenset(inject.links or range(num_links)), inject.start_step, inject.end_step
