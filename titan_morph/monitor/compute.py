"""Per-rank compute speed and per-layer costs from the stages' exchanged step profiles, and the
detector of slow ranks (the compute side of §6's monitor; :mod:`.detect` is the link side).

**Op time.** Every rank's row of the per-step exchange carries its op times per kind, on the op
clock (:mod:`titan_morph.runtime.optime`: CUDA events on a GPU, the testbed's device clock, host
times on a CPU), so nothing here synchronises a device. A rank's op time in a step is its compute
per microbatch: the F, I, W (and fused B) totals over the microbatches it ran.

**Per-layer costs.** Over the baseline steps every stage's median F, B (= I) and W per microbatch
is spread over the layers it holds, in proportion to each layer's *weight* (per kind): the model's
FLOP shares (the embedding and the output with the loss are entries of their own, so a head that
costs more than a layer is seen as such), or the synthetic testbed's configured per-layer times.
The result is every layer's F, B, W at speed 1 (:class:`~titan_morph.pipelining.partition.LayerCost`),
what the partition planner splits. The costs are carried across relaunches: after a re-partition a
rank holds other layers, and its speed is still measured against the same costs.

**Speed.** Rank r's speed in a step = the predicted op time of its layers at speed 1 (their summed
costs) / its measured op time: 1 at the baseline, 0.5 for a rank computing twice as slow, whichever
layers it holds.

**Detection** (:class:`SpeedDetector`), per rank, with the link detector's hysteresis
(``detect_consecutive`` k, ``recover_consecutive`` m, ``detect_margin``, ``recover_ratio``):

* a healthy rank turns **slow** after k consecutive steps whose op time exceeds its baseline by the
  margin (speed < 1 / (1 + margin)); it is planned at the median of those k speeds;
* a slow rank is re-planned (**changed**) after k consecutive steps whose speed differs from the
  planned one by more than the margin, either way, at the median of those k -- at speed 1 when that
  median is back within the recovery band (planned as healthy; reported slow until it recovers);
* a slow rank **recovers** after m consecutive steps within margin x ``recover_ratio`` of its
  baseline (speed >= 1 / (1 + margin x ratio)).

Speeds are rounded to :data:`SPEED_QUANTUM`. Everything is a pure function of the exchanged rows
and the carried state, so every rank reaches the same decisions.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from titan_morph.monitor.detect import DetectRule
from titan_morph.monitor.profile import StepProfile
from titan_morph.pipelining.partition import LayerCost, stage_ranges

__all__ = [
    "SPEED_QUANTUM",
    "RankState",
    "SpeedDecision",
    "SpeedDetector",
    "Weights",
    "op_time_ms",
    "rank_speeds",
    "spread_costs",
    "stage_kind_ms",
]

SPEED_QUANTUM = 0.01
"""Planned speeds are multiples of this: one noisy step does not re-plan."""

Weights = tuple[float, float, float]
"""A layer's share of its stage's F, B and W (relative units)."""


def _round(speed: float) -> float:
    return max(SPEED_QUANTUM, round(round(speed / SPEED_QUANTUM) * SPEED_QUANTUM, 6))


def stage_kind_ms(profile: StepProfile) -> tuple[float, float, float] | None:
    """A one-stage rank's mean F, B (the input backward I, or a fused B less its W) and W per
    microbatch in a step; None when it ran no forward (e.g. a CUDA step whose ops outlasted the read-back's bound)."""
    f = profile.mean_ms("F")
    if f is None:
        return None
    i, b, w = profile.mean_ms("I"), profile.mean_ms("B"), profile.mean_ms("W")
    if i is None and b is not None:  # fused backward: B = I + W; no split is measured, give W none
        return f, b, 0.0
    return f, i or 0.0, w or 0.0


def op_time_ms(profile: StepProfile) -> float | None:
    """A rank's op time in a step: all its compute per microbatch (F + B + W); None when unknown."""
    kinds = stage_kind_ms(profile)
    return None if kinds is None else sum(kinds)


def spread_costs(
    names: Sequence[str],
    weights: Sequence[Weights],
    split: Sequence[int],
    stage_ms: Sequence[tuple[float, float, float]],
    bytes_per_layer: Sequence[tuple[float, float]] | None = None,
) -> tuple[LayerCost, ...]:
    """Every entry's (F, B, W) at speed 1: its stage's measured time per kind times its share of the
    stage's weight of that kind (an even share where the stage's weights are all 0). ``split``:
    entries per stage; ``bytes_per_layer``: (parameter, activation) bytes per entry."""
    if len(names) != len(weights) or sum(split) != len(names) or len(split) != len(stage_ms):
        raise ValueError(
            f"spread_costs: {len(names)} names, {len(weights)} weights, split {list(split)}, {len(stage_ms)} stages"
        )
    out = []
    for (a, b), times in zip(stage_ranges(split), stage_ms):
        for e in range(a, b):
            shares = []
            for k in range(3):
                total = sum(weights[j][k] for j in range(a, b))
                shares.append(times[k] * (weights[e][k] / total if total > 0 else 1.0 / (b - a)))
            params, acts = bytes_per_layer[e] if bytes_per_layer is not None else (0.0, 0.0)
            out.append(LayerCost(names[e], shares[0], shares[1], shares[2], params, acts))
    return tuple(out)


def rank_speeds(
    profiles: Sequence[StepProfile], costs: Sequence[LayerCost], split: Sequence[int]
) -> list[float | None]:
    """Every rank's speed in a step (module docstring): its layers' predicted op time at speed 1 /
    its measured op time; None where it is unknown (no ops read back, or layers of no cost)."""
    out: list[float | None] = []
    ranges = stage_ranges(split)
    for prof in profiles:
        a, b = ranges[prof.stage]
        predicted = sum(c.fwd + c.bwd + c.wgt for c in costs[a:b])
        measured = op_time_ms(prof)
        out.append(predicted / measured if measured and predicted > 0 else None)
    return out


@dataclass
class RankState:
    """Detector state of one rank."""

    slow: bool = False
    speed: float = 1.0  # the speed plans assume (1 = its baseline)
    over: int = 0  # consecutive steps slower than the threshold (healthy) / off the planned speed (slow)
    healthy: int = 0  # consecutive steps back at its baseline (slow ranks)
    recent: deque[float] = field(default_factory=deque)  # measured speeds of the last k steps


@dataclass(frozen=True)
class SpeedDecision:
    """Planned speeds changed after ``step``: the new speed of every rank, and why."""

    step: int
    speeds: tuple[float, ...]
    slow_ranks: tuple[int, ...]
    newly_slow: tuple[int, ...]
    recovered: tuple[int, ...]
    reasons: tuple[str, ...]


class SpeedDetector:
    """Per-rank state machines (module docstring); :meth:`update` once per step with every rank's
    measured speed. ``speeds``: planned speeds carried from before a relaunch (a rank below 1 is slow)."""

    def __init__(self, ranks: int, rule: DetectRule | None = None, speeds: Sequence[float] | None = None) -> None:
        self.rule = rule or DetectRule()
        self.ranks = [RankState() for _ in range(ranks)]
        for state, speed in zip(self.ranks, speeds or ()):
            state.slow, state.speed = speed < 1.0, float(speed)

    @property
    def speeds(self) -> tuple[float, ...]:
        return tuple(s.speed for s in self.ranks)

    @property
    def slow_ranks(self) -> tuple[int, ...]:
        return tuple(r for r, s in enumerate(self.ranks) if s.slow)

    def update(self, step: int, measured: Sequence[float | None]) -> SpeedDecision | None:
        """Advance every rank by one step; a :class:`SpeedDecision` when a planned speed changes."""
        rule = self.rule
        slow_below = 1.0 / (1.0 + rule.margin)
        healthy_from = 1.0 / (1.0 + rule.margin * rule.recover_ratio)
        newly, recovered, reasons = [], [], []
        changed = False
        for r, (state, speed) in enumerate(zip(self.ranks, measured, strict=True)):
            if speed is None:
                continue
            state.recent.append(speed)
            while len(state.recent) > rule.detect_steps:
                state.recent.popleft()
            window = f"median of {len(state.recent)} steps"
            if not state.slow:
                state.over = state.over + 1 if speed < slow_below else 0
                if state.over >= rule.detect_steps:
                    state.slow, state.speed = True, _round(statistics.median(state.recent))
                    state.over = state.healthy = 0
                    newly.append(r)
                    reasons.append(
                        f"rank {r} slow: op time {1 / speed:.2f}x its baseline (> 1 + {rule.margin:g}) for"
                        f" {rule.detect_steps} steps; planning for speed {state.speed:g} ({window})"
                    )
                continue
            state.healthy = state.healthy + 1 if speed >= healthy_from else 0
            off = abs(speed / state.speed - 1.0) > rule.margin
            state.over = state.over + 1 if off else 0
            if state.healthy >= rule.recover_steps:
                reasons.append(
                    f"rank {r} recovered: op time {1 / speed:.2f}x its baseline"
                    f" (< 1 + {rule.margin * rule.recover_ratio:g}) for {rule.recover_steps} steps"
                )
                state.slow, state.speed, state.over, state.healthy = False, 1.0, 0, 0
                recovered.append(r)
            elif state.over >= rule.detect_steps:
                state.over = 0
                median = statistics.median(state.recent)
                target = 1.0 if median >= healthy_from else _round(median)  # back at its baseline: plan so
                if target == state.speed:
                    continue
                kind = "slower" if target < state.speed else "at its baseline" if target == 1.0 else "faster"
                reasons.append(
                    f"rank {r} {kind}: speed {_round(median):g} against the planned {state.speed:g} for"
                    f" {rule.detect_steps} steps ({window}); planning for {target:g}"
                )
                state.speed, changed = target, True
        if not (newly or recovered or changed):
            return None
        return SpeedDecision(step, self.speeds, self.slow_ranks, tuple(newly), tuple(recovered), tuple(reasons))
