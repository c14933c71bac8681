"""The end-of-run summary: step time before, during and after a straggler, and what ZB-H2 would take.

The schedule keeps one :class:`StepPoint` per step (the pipeline time from the per-step exchange and
the monitor's view of the links) in a :class:`StepHistory`. At the end of training the last stage
logs a few lines: the median pipeline time before, during (and during once the adapted plan runs)
and after the straggler, with, from the simulator, the time ZB-H2's fixed orders take under the
same link delays on the blocking default transport -- the baseline PipeMorph's adaptation is
measured against (paper §7.2) -- and the lower bound on any schedule under them. With two stages
per rank (the V) the baseline is ZB-V (torch's ``ScheduleZBVZeroBubble``), the static V schedule
PipeMorph-V replaces.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from titan_morph.pipelining.builders import build
from titan_morph.pipelining.exact import lower_bound_under
from titan_morph.pipelining.links import LinkDownError, LinkModel
from titan_morph.pipelining.model import CostModel
from titan_morph.pipelining.simulate import simulate

__all__ = ["StepHistory", "StepPoint", "phases", "summary_lines", "zbh2_ms"]


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One step as every rank saw it after the exchange (TorchTitan's 1-based step); slotted, since a
    long run keeps thousands."""

    step: int
    pipeline_ms: float | None
    slow_links: tuple[int, ...]
    delegated: tuple[int, ...]
    plan_id: str
    start_ms: float = 0.0
    """When the step began on the common clock (the time axis of a time-keyed link model)."""


class StepHistory:
    """The last ``capacity`` steps' points, ~30 bytes a step: step numbers, pipeline times and starts in
    arrays, and each step's (slow links, delegated links, plan) as an index into the few distinct
    ones a run goes through. A long run's memory must not grow with its steps."""

    def __init__(self, capacity: int = 8192) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._steps = array("q")
        self._ms = array("d")  # NaN: no pipeline time
        self._start = array("d")
        self._state = array("L")
        self._states: list[tuple[tuple[int, ...], tuple[int, ...], str]] = []
        self._index: dict[tuple[tuple[int, ...], tuple[int, ...], str], int] = {}

    def append(self, point: StepPoint) -> None:
        key = (point.slow_links, point.delegated, point.plan_id)
        if (i := self._index.get(key)) is None:
            i = self._index[key] = len(self._states)
            self._states.append(key)
        self._steps.append(point.step)
        self._ms.append(math.nan if point.pipeline_ms is None else point.pipeline_ms)
        self._start.append(point.start_ms)
        self._state.append(i)
        if len(self._steps) >= 2 * self.capacity:  # drop the oldest at once: amortised O(1) a step
            for column in (self._steps, self._ms, self._start, self._state):
                del column[: -self.capacity]

    def __len__(self) -> int:
        return min(len(self._steps), self.capacity)

    def __iter__(self) -> Iterator[StepPoint]:
        for k in range(len(self._steps) - len(self), len(self._steps)):
            slow, delegated, plan_id = self._states[self._state[k]]
            ms = self._ms[k]
            yield StepPoint(self._steps[k], None if math.isnan(ms) else ms, slow, delegated, plan_id, self._start[k])


def phases(points: Sequence[StepPoint], window: tuple[int, int] | None, skip: int = 1) -> dict[str, list[StepPoint]]:
    """Steps before, during and after the straggler: the injection ``window`` (first, last step) when
    one was injected, else the steps the monitor held a link slow. The first ``skip`` steps (warm-up:
    first-use costs) are left out."""
    kept = [p for p in points if p.step > skip and p.pipeline_ms is not None]
    if window is not None:
        first, last = window
        during = [p for p in kept if first <= p.step <= last]
    else:
        during = [p for p in kept if p.slow_links]
    if not during:
        return {"before": kept, "during": [], "after": []}
    start, end = during[0].step, during[-1].step
    return {
        "before": [p for p in kept if p.step < start],
        "during": during,
        "after": [p for p in kept if p.step > end],
    }


def baseline_name(model: CostModel) -> str:
    """The static baseline of the summary: ZB-H2, or ZB-V with two stages per rank."""
    return "zb-h2" if model.stages_per_rank == 1 else "zb-v"


def zbh2_ms(model: CostModel, links: LinkModel | None, depth: int | None, points: Sequence[StepPoint]) -> float | None:
    """Median simulated makespan of ZB-H2's orders (ZB-V's in the V; planned without delays, as
    they are) under ``links`` at the steps of ``points`` (each from its start), with the default
    transport's queue ``depth`` (None when a link is down)."""
    if not points:
        return None
    plan = build(baseline_name(model), model.with_delays((0.0,) * model.num_links))
    try:
        times = [
            simulate(plan.model, plan.orders, links=links, depth=depth, step=p.step, t0=p.start_ms).makespan
            for p in points
        ]
    except LinkDownError:
        return None
    return statistics.median(times)


def _bound_ms(model: CostModel, links: LinkModel, points: Sequence[StepPoint]) -> float | None:
    """Median over ``points`` of the lower bound on any schedule under ``links``
    (:func:`~titan_morph.pipelining.exact.lower_bound_under`; None when a link is down)."""
    values = [lower_bound_under(model, links, step=p.step, t0=p.start_ms) for p in points]
    return statistics.median(values) if values and all(math.isfinite(v) for v in values) else None


def _median(points: Sequence[StepPoint]) -> float | None:
    values = [p.pipeline_ms for p in points if p.pipeline_ms is not None]
    return statistics.median(values) if values else None


def summary_lines(
    points: Sequence[StepPoint],
    *,
    window: tuple[int, int] | None,
    model: CostModel,
    links: LinkModel | None,
    depth: int | None,
    decisions: int,
    schedule: str,
) -> list[str]:
    """The summary's lines (see the module docstring) for the run of ``schedule``; ``model`` holds
    the stage times to simulate ZB-H2 with (configured, or the ones the monitor measured)."""
    parts = phases(points, window)
    if not parts["during"]:
        median = _median(parts["before"])
        text = "n/a" if median is None else f"{median:.0f} ms"
        return [f"run summary: no straggler; median pipeline time {text} over {len(parts['before'])} steps"]
    base = "ZB-H2" if baseline_name(model) == "zb-h2" else "ZB-V"
    if links is None:  # no modelled delays (e.g. a link that really broke): nothing to simulate against
        lines = ["run summary (median pipeline time per step):"]
    else:
        lines = [
            f"run summary (median pipeline time per step; {base} from the simulator and the lower bound on"
            " any schedule, same delays):"
        ]
    during = parts["during"]
    parts["adapted"] = [p for p in during if p.plan_id != during[0].plan_id]  # once the new plan runs
    for name in ("before", "during", "adapted", "after"):
        pts = parts[name]
        if not pts:
            continue
        mine = _median(pts)
        theirs = zbh2_ms(model, links, depth, pts) if links is not None else None
        first, last = pts[0].step, pts[-1].step
        line = f"  {name:<7} steps {first:>3}-{last:<3}  {schedule} {mine:7.0f} ms"
        if theirs is not None and mine:
            line += f"   {base:<5} {theirs:7.0f} ms ({theirs / mine:.2f}x)"
        best = _bound_ms(model, links, pts) if links is not None else None
        if best is not None:
            line += f"   bound {best:5.0f} ms"
        if name == "adapted":
            line += f"   delegated links {sorted({link for p in pts for link in p.delegated}) or 'none'}"
        lines.append(line)
    lines.append(f"  plan changes made by the monitor: {decisions}")
    return lines
