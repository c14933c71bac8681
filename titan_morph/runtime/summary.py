"""The end-of-run summary: step time before, during and after a straggler, and what ZB-H2 would take.

The schedule hands every step's :class:`StepPoint` (the pipeline time from the per-step exchange and
the monitor's view of the links) to a :class:`StepHistory`, which files it at once under its phase:
before, during (and during once the adapted plan runs) and after the straggler. At the end of
training the last stage logs a few lines: each phase's median pipeline time with, from the
simulator, the time ZB-H2's fixed orders take under the same link delays on the blocking default
transport -- the baseline PipeMorph's adaptation is measured against (paper §7.2) -- and the lower
bound on any schedule under them. With two stages per rank (the V) the baseline is ZB-V (torch's
``ScheduleZBVZeroBubble``), the static V schedule PipeMorph-V replaces.

A run may last 10^5 steps: each phase keeps a bounded sample of its steps (:class:`StepSample`), and
the simulator replays at most :data:`SIMULATED` of them per phase at the end, so neither the memory
nor the time the summary takes grows with the run.

Then the top causes by what they cost (:class:`CostTally`, fed each step's attribution above the
noise, :mod:`titan_morph.monitor.attribution`): per cause, its median cost per step over the steps it
was charged, that cost's share of those steps' pipeline time, and the time it lost in all. A run
with no phase during a straggler but with costs names them in its head line: the head line and the
costs tell one story.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from titan_morph.monitor.attribution import cause_label
from titan_morph.pipelining.core.links import LinkDownError, LinkModel
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.search.builders import build
from titan_morph.pipelining.timing.bounds import lower_bound_under
from titan_morph.pipelining.timing.simulate import simulate

__all__ = [
    "SAMPLE_CAP",
    "SIMULATED",
    "TOP_CAUSES",
    "CostTally",
    "StepHistory",
    "StepPoint",
    "StepSample",
    "summary_lines",
    "zbh2_ms",
]

SAMPLE_CAP = 256
"""Steps a sample keeps (24 bytes each): its median is exact up to this many, then taken over 128 to
256 evenly spread steps. Small, so that the last stage's twenty samples (six phases, two per cause)
stay within 123 KB and are full early in a long run instead of growing through its first thousand
steps."""
SIMULATED = 64
"""Steps per phase the simulator replays at the end (ZB-H2 and the bound): a fixed cost at exit."""
TOP_CAUSES = 3
"""Causes the summary names, the costliest first."""


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One step as every rank saw it after the exchange (TorchTitan's 1-based step)."""

    step: int
    pipeline_ms: float | None
    slow_links: tuple[int, ...]
    delegated: tuple[int, ...]
    plan_id: str
    start_ms: float = 0.0
    """When the step began on the common clock (the time axis of a time-keyed link model)."""


class StepSample:
    """One phase's steps: how many, the first and the last, the links delegated in any of them, and
    a systematic sample of at most ``cap``: every step while they fit, then the steps that are
    multiples of a stride that doubles each time the sample is full (step, pipeline time and start
    in arrays). A sample merges a later one into itself (the larger stride holds)."""

    def __init__(self, cap: int = SAMPLE_CAP) -> None:
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.cap = cap
        self.count = 0
        self.first = self.last = 0
        self.stride = 1
        self.delegated: set[int] = set()
        self._steps = array("q")
        self._ms = array("d")
        self._start = array("d")

    def __len__(self) -> int:
        """Steps held (at most ``cap``; :attr:`count` counts the phase's)."""
        return len(self._steps)

    def add(self, point: StepPoint) -> None:
        if point.pipeline_ms is None:
            raise ValueError(f"step {point.step} has no pipeline time")
        self.first = point.step if not self.count else self.first
        self.last = point.step
        self.count += 1
        self.delegated.update(point.delegated)
        self._keep(point.step, point.pipeline_ms, point.start_ms)

    def _keep(self, step: int, ms: float, start: float) -> None:
        if step % self.stride:
            return
        self._steps.append(step)
        self._ms.append(ms)
        self._start.append(start)
        if len(self._steps) > self.cap:
            self._thin(2 * self.stride)

    def _thin(self, stride: int) -> None:
        """Keep the multiples of ``stride`` (a multiple of the current one), doubling it while over ``cap``."""
        while True:
            keep = [k for k, s in enumerate(self._steps) if s % stride == 0]
            if len(keep) <= self.cap:
                break
            stride *= 2
        self.stride = stride
        self._steps = array("q", (self._steps[k] for k in keep))
        self._ms = array("d", (self._ms[k] for k in keep))
        self._start = array("d", (self._start[k] for k in keep))

    def merge(self, later: StepSample) -> None:
        """Take in ``later``'s steps (all after this one's)."""
        if not later.count:
            return
        self.first = later.first if not self.count else self.first
        self.last = later.last
        self.count += later.count
        self.delegated |= later.delegated
        if later.stride > self.stride:
            self._thin(later.stride)
        for step, ms, start in zip(later._steps, later._ms, later._start, strict=True):
            self._keep(step, ms, start)

    def median_ms(self) -> float | None:
        """Median pipeline time of the sampled steps (all of them up to ``cap``)."""
        return statistics.median(self._ms) if self._ms else None

    def starts(self, limit: int = SIMULATED) -> list[tuple[int, float]]:
        """(step, start ms) of at most ``limit`` sampled steps: the multiples of the least stride
        (a power of two times the sample's) that leaves no more."""
        stride = self.stride
        while sum(1 for s in self._steps if s % stride == 0) > limit:
            stride *= 2
        return [(s, t) for s, t in zip(self._steps, self._start, strict=True) if s % stride == 0]


class CostTally:
    """What each straggler cost over the run: per cause (``link2``, ``rank3``), the steps it was off
    its baseline, the sum of its costs, and two bounded samples of those steps (:class:`StepSample`,
    the same steps in both): its cost, and its share of the step in %. Memory: two samples per
    cause, at most 2R - 1 causes."""

    def __init__(self, cap: int = SAMPLE_CAP) -> None:
        self.cap = cap
        self.total_ms: dict[str, float] = {}
        self._cost: dict[str, StepSample] = {}
        self._share: dict[str, StepSample] = {}

    def add(self, step: int, costs: Mapping[str, float], step_ms: float) -> None:
        """Step ``step``'s costs (ms) of the causes off their baseline; ``step_ms``: its pipeline time."""
        for cause, ms in costs.items():
            if cause not in self._cost:
                self._cost[cause], self._share[cause] = StepSample(self.cap), StepSample(self.cap)
            self.total_ms[cause] = self.total_ms.get(cause, 0.0) + ms
            self._cost[cause].add(StepPoint(step, ms, (), (), ""))
            share = 100.0 * ms / step_ms if step_ms > 0 else 0.0
            self._share[cause].add(StepPoint(step, share, (), (), ""))

    def top(self, limit: int = TOP_CAUSES) -> list[tuple[str, float, float, StepSample]]:
        """The ``limit`` causes that lost the most time in all (ties by name), positive ones only:
        (cause, median cost per step, median share of the step %, their steps)."""
        ranked = sorted((c for c, t in self.total_ms.items() if t > 0), key=lambda c: (-self.total_ms[c], c))
        out = []
        for cause in ranked[:limit]:
            cost, share = self._cost[cause].median_ms(), self._share[cause].median_ms()
            assert cost is not None and share is not None
            out.append((cause, cost, share, self._cost[cause]))
        return out

    def lines(self, limit: int = TOP_CAUSES) -> list[str]:
        """The summary's lines about the top causes (none when nothing cost anything)."""
        top = self.top(limit)
        if not top:
            return []
        lines = [
            "  what the stragglers cost (simulated: the measured step against the same with one link or rank"
            " at its baseline; median per step while above the step's noise):"
        ]
        for cause, cost, share, sample in top:
            lines.append(
                f"    {cause_label(cause):<9} {cost:7.0f} ms per step ({share:4.1f} % of the step) over"
                f" {sample.count} steps ({sample.first}-{sample.last}), {self.total_ms[cause] / 1e3:.1f} s in all"
            )
        return lines


class StepHistory:
    """Every step's point, filed at once under its phase: before, during (``adapted``: the steps of
    it that ran another plan than its first step) and after the straggler -- the injection ``window``
    (first, last step) when one was injected, else the steps from the first to the last one the
    monitor held a link slow. The first ``skip`` steps (warm-up: first-use costs) and steps without
    a pipeline time are left out. Memory: six :class:`StepSample` of at most ``cap`` steps, and the
    straggler costs' :class:`CostTally`."""

    def __init__(self, window: tuple[int, int] | None = None, *, skip: int = 1, cap: int = SAMPLE_CAP) -> None:
        self.window, self.skip, self.cap = window, skip, cap
        self.before, self.during, self.adapted, self.after = (StepSample(cap) for _ in range(4))
        self._after_adapted = StepSample(cap)  # steps since the last slow one that ran another plan
        self._first_plan: str | None = None
        self.steps = 0
        self.costs = CostTally(cap)  # what each straggler cost, filed by the attribution

    def __len__(self) -> int:
        """Steps appended (the left-out ones included)."""
        return self.steps

    def append(self, point: StepPoint) -> None:
        self.steps += 1
        if point.step <= self.skip or point.pipeline_ms is None:
            return
        if self.window is not None:
            first, last = self.window
            if point.step < first:
                self.before.add(point)
            elif point.step > last:
                self.after.add(point)
            else:
                self._add_during(point)
        elif point.slow_links:  # the steps since the last slow one were during the straggler too
            self.during.merge(self.after)
            self.adapted.merge(self._after_adapted)
            self.after, self._after_adapted = StepSample(self.cap), StepSample(self.cap)
            self._add_during(point)
        elif self._first_plan is None:
            self.before.add(point)
        else:
            self.after.add(point)
            if point.plan_id != self._first_plan:
                self._after_adapted.add(point)

    def _add_during(self, point: StepPoint) -> None:
        if self._first_plan is None:
            self._first_plan = point.plan_id
        self.during.add(point)
        if point.plan_id != self._first_plan:
            self.adapted.add(point)

    def phases(self) -> dict[str, StepSample]:
        """The phases, in order; with no step during the straggler, every step is ``before``."""
        if not self.during.count:
            everything = StepSample(self.cap)
            everything.merge(self.before)
            everything.merge(self.after)
            return {"before": everything}
        return {"before": self.before, "during": self.during, "adapted": self.adapted, "after": self.after}


def baseline_name(model: CostModel) -> str:
    """The static baseline of the summary: ZB-H2, or ZB-V with two stages per rank."""
    return "zb-h2" if model.stages_per_rank == 1 else "zb-v"


def zbh2_ms(
    model: CostModel, links: LinkModel | None, depth: int | None, steps: Sequence[tuple[int, float]]
) -> float | None:
    """Median simulated makespan of ZB-H2's orders (ZB-V's in the V; planned without delays, as
    they are) under ``links`` at ``steps`` ((step, start ms): each from its start), with the default
    transport's queue ``depth`` (None when a link is down)."""
    if not steps:
        return None
    plan = build(baseline_name(model), model.with_delays((0.0,) * model.num_links))
    try:
        times = [
            simulate(plan.model, plan.orders, links=links, depth=depth, step=step, t0=start).makespan
            for step, start in steps
        ]
    except LinkDownError:
        return None
    return statistics.median(times)


def _bound_ms(model: CostModel, links: LinkModel, steps: Sequence[tuple[int, float]]) -> float | None:
    """Median over ``steps`` of the lower bound on any schedule under ``links``
    (:func:`~titan_morph.pipelining.timing.bounds.lower_bound_under`; None when a link is down)."""
    values = [lower_bound_under(model, links, step=step, t0=start) for step, start in steps]
    return statistics.median(values) if values and all(math.isfinite(v) for v in values) else None


def summary_lines(
    history: StepHistory,
    *,
    model: CostModel,
    links: LinkModel | None,
    depth: int | None,
    decisions: int,
    schedule: str,
    replans: int | None = None,
) -> list[str]:
    """The summary's lines (see the module docstring) for the run of ``schedule``; ``model`` holds
    the stage times to simulate ZB-H2 with (configured, or the ones the monitor measured);
    ``replans``: how many of the ``decisions`` changed the running plan (None: not counted)."""
    parts = history.phases()
    if "during" not in parts:
        median = parts["before"].median_ms()
        text = "n/a" if median is None else f"{median:.0f} ms"
        found = [cause_label(cause) for cause, *_ in history.costs.top()]
        what = f"straggler {', '.join(found)} (costs below)" if found else "no straggler"
        head = f"run summary: {what}; median pipeline time {text} over {parts['before'].count} steps"
        return [head, *history.costs.lines()]
    base = "ZB-H2" if baseline_name(model) == "zb-h2" else "ZB-V"
    if links is None:  # no modelled delays (e.g. a link that really broke): nothing to simulate against
        lines = ["run summary (median pipeline time per step):"]
    else:
        lines = [
            f"run summary (median pipeline time per step; {base} from the simulator and the lower bound on"
            " any schedule, same delays):"
        ]
    for name, part in parts.items():
        mine = part.median_ms()
        if mine is None:
            continue
        steps = part.starts() if links is not None else []
        theirs = zbh2_ms(model, links, depth, steps) if links is not None else None
        line = f"  {name:<7} steps {part.first:>3}-{part.last:<3}  {schedule} {mine:7.0f} ms"
        if theirs is not None and mine:
            line += f"   {base:<5} {theirs:7.0f} ms ({theirs / mine:.2f}x)"
        best = _bound_ms(model, links, steps) if links is not None else None
        if best is not None:
            line += f"   bound {best:5.0f} ms"
        if name == "adapted":
            line += f"   delegated links {sorted(part.delegated) or 'none'}"
        lines.append(line)
    installed = f" ({replans} changed the plan)" if replans is not None and replans != decisions else ""
    lines.append(f"  plan changes made by the monitor: {decisions}{installed}")
    return [*lines, *history.costs.lines()]
