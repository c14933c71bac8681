"""Straggler detection with hysteresis: the same rule, on the same gathered data, on every rank.

Per link, per step (paper §6, Eq. 1):

* a healthy link turns **slow** after ``detect_steps`` (k) consecutive steps whose exact delay
  median exceeds the active plan's Eq. 1 tolerance by ``margin`` (never below ``floor_ms``, so
  host jitter on a plan with no slack cannot trigger);
* a slow link is re-planned for a **worse** delay after k consecutive steps above the active
  (adapted) plan's tolerance, and for an **eased** one after ``recover_steps`` (m) steps whose
  planning delay is under half the planned one;
* a slow link **recovers** after m consecutive steps whose delay (or upper bound, see
  :mod:`titan_morph.monitor.delays`) is below ``recover_ratio`` × the initial plan's tolerance
  (or ``floor_ms``, whichever is larger).

The delay a plan is made for is the ``plan_quantile`` of the last k steps' exact samples, rounded
up to ``quantum_ms`` so that small fluctuations do not re-plan. Everything here is deterministic:
ranks that feed identical estimates reach identical decisions.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from titan_morph.monitor.delays import LinkEstimate, quantile

__all__ = ["DetectRule", "LinkState", "Decision", "Detector"]


@dataclass(frozen=True)
class DetectRule:
    """Thresholds of the detector (``[morph] detect_*`` / ``recover_*``)."""

    detect_steps: int = 3
    recover_steps: int = 5
    margin: float = 0.1
    recover_ratio: float = 0.5
    floor_ms: float = 5.0
    quantum_ms: float = 5.0
    plan_quantile: float = 0.75

    def __post_init__(self) -> None:
        if self.detect_steps < 1 or self.recover_steps < 1:
            raise ValueError(
                f"detect_steps and recover_steps must be >= 1, got {self.detect_steps}, {self.recover_steps}"
            )
        if not (0 < self.recover_ratio <= 1):
            raise ValueError(f"recover_ratio must satisfy 0 < ratio <= 1, got {self.recover_ratio}")
        if self.margin < 0 or self.floor_ms < 0 or self.quantum_ms <= 0:
            raise ValueError("margin and floor_ms must be >= 0 and quantum_ms > 0")
        if not 0 <= self.plan_quantile <= 1:
            raise ValueError(f"plan_quantile must be in [0, 1], got {self.plan_quantile}")

    def slow_threshold(self, tolerance_ms: float) -> float:
        return max(tolerance_ms * (1.0 + self.margin), self.floor_ms)

    def recover_threshold(self, initial_tolerance_ms: float) -> float:
        return max(self.recover_ratio * initial_tolerance_ms, self.floor_ms)

    def round_up(self, delay_ms: float) -> float:
        return math.ceil(delay_ms / self.quantum_ms - 1e-9) * self.quantum_ms


@dataclass
class LinkState:
    """Detector state of one link."""

    slow: bool = False
    planned_ms: float = 0.0  # the delay the active plan absorbs on this link (0 = none)
    over: int = 0  # consecutive steps above the active plan's threshold
    healthy: int = 0  # consecutive steps below the recovery threshold (slow links)
    eased: int = 0  # consecutive steps planning far below planned_ms (slow links)
    recent: deque[list[float]] = field(default_factory=deque)  # exact samples of the last k steps


@dataclass(frozen=True)
class Decision:
    """A change of plan, decided after ``step``: what to plan for, and why (with the numbers)."""

    step: int
    delays_ms: tuple[float, ...]  # per link: the delay to plan for (0 = healthy)
    slow_links: tuple[int, ...]
    newly_slow: tuple[int, ...]
    recovered: tuple[int, ...]
    reasons: tuple[str, ...]
    # per link: the exact delay samples of the last k steps behind a slow link's plan (() if healthy)
    windows_ms: tuple[tuple[float, ...], ...] = ()

    @property
    def all_healthy(self) -> bool:
        return not self.slow_links


class Detector:
    """Per-link state machines; :meth:`update` once per step with the gathered estimates."""

    def __init__(self, num_links: int, rule: DetectRule | None = None) -> None:
        self.rule = rule or DetectRule()
        self.links = [LinkState() for _ in range(num_links)]

    @property
    def slow_links(self) -> tuple[int, ...]:
        return tuple(i for i, s in enumerate(self.links) if s.slow)

    @property
    def planned_ms(self) -> tuple[float, ...]:
        return tuple(s.planned_ms for s in self.links)

    def update(
        self,
        step: int,
        estimates: Sequence[LinkEstimate],
        tolerance_ms: Sequence[float],
        initial_tolerance_ms: Sequence[float],
    ) -> Decision | None:
        """Advance every link by one step; a :class:`Decision` when the plan must change."""
        rule = self.rule
        reasons: list[str] = []
        newly, recovered, changed = [], [], False
        for i, (state, est) in enumerate(zip(self.links, estimates, strict=True)):
            state.recent.append(list(est.exact))
            while len(state.recent) > rule.detect_steps:
                state.recent.popleft()
            window = [x for xs in state.recent for x in xs]
            delay = est.delay_ms
            threshold = rule.slow_threshold(tolerance_ms[i])
            state.over = state.over + 1 if delay is not None and delay > threshold else 0
            if not state.slow:
                if state.over >= rule.detect_steps and window:
                    state.slow, state.planned_ms = True, rule.round_up(quantile(window, rule.plan_quantile))
                    state.over = state.healthy = state.eased = 0
                    newly.append(i)
                    reasons.append(
                        f"link {i} slow: delay {delay:.1f} ms > {threshold:.1f} ms (Eq. 1 tolerance "
                        f"{tolerance_ms[i]:.1f} ms + {rule.margin:.0%}) for {rule.detect_steps} steps; "
                        f"planning for {state.planned_ms:g} ms "
                        f"(p{rule.plan_quantile * 100:.0f} of {len(window)} samples)"
                    )
                continue
            upper = est.upper_ms
            recover_at = rule.recover_threshold(initial_tolerance_ms[i])
            state.healthy = state.healthy + 1 if upper is not None and upper < recover_at else 0
            target = rule.round_up(quantile(window, rule.plan_quantile)) if window else None
            state.eased = state.eased + 1 if target is not None and target < 0.5 * state.planned_ms else 0
            if state.healthy >= rule.recover_steps:
                reasons.append(
                    f"link {i} recovered: delay {upper:.1f} ms < {recover_at:.1f} ms (max of {rule.recover_ratio:g} x "
                    f"initial tolerance, {rule.floor_ms:g} ms) for {rule.recover_steps} steps"
                )
                state.slow, state.planned_ms = False, 0.0
                state.over = state.healthy = state.eased = 0
                recovered.append(i)
            elif state.over >= rule.detect_steps and target is not None and target > state.planned_ms:
                reasons.append(
                    f"link {i} worse: delay {delay:.1f} ms > {threshold:.1f} ms (tolerance of the plan for "
                    f"{state.planned_ms:g} ms) for {rule.detect_steps} steps; planning for {target:g} ms"
                )
                state.planned_ms, state.over, state.eased, changed = target, 0, 0, True
            elif state.eased >= rule.recover_steps and target is not None:
                reasons.append(
                    f"link {i} eased: delay p{rule.plan_quantile * 100:.0f} {target:g} ms < half the planned "
                    f"{state.planned_ms:g} ms for {rule.recover_steps} steps"
                )
                state.planned_ms, state.over, state.eased, changed = max(target, rule.quantum_ms), 0, 0, True
        if not (newly or recovered or changed):
            return None
        windows = tuple(tuple(x for xs in state.recent for x in xs) if state.slow else () for state in self.links)
        return Decision(step, self.planned_ms, self.slow_links, tuple(newly), tuple(recovered), tuple(reasons), windows)
