"""Straggler detection with hysteresis: the same rule, on the same gathered data, on every rank.

A link is **congested** in a step when either

* its delay -- the exact samples' median, a message's latency + transmit time with any queueing
  behind earlier messages left out (:mod:`.delays`) -- exceeds the active plan's Eq. 1 tolerance
  by ``margin`` (never below ``floor_ms``, so host jitter on a plan with no slack cannot trigger); or
* its measured transmit time (:mod:`.bandwidth`) exceeds the wire time per message the plan can
  absorb by ``margin`` (and ``floor_ms``). That capacity is a simple bound, not the simulator: the pipeline completes
  at most one microbatch per period (the busiest rank's F + B + W per microbatch), and each
  direction of a link carries one message per microbatch for each hop it joins (two in the V), so
  the wire keeps pace while transmit <= period / hops; beyond it the backlog grows by the
  difference every microbatch, a cascade no slackness absorbs.

Per link, per step (paper §6, Eq. 1):

* a healthy link turns **slow** after ``detect_steps`` (k) consecutive congested steps;
* a slow link is re-planned for a **worse** condition after k consecutive steps above the active
  (adapted) plan's tolerance: a cascade, so at once;
* a slow link whose condition **moved** -- k consecutive steps each measuring a cost (latency +
  transmit) or a transmit time off the planned one by more than :meth:`DetectRule.band_ms`, in
  either direction -- proposes the condition of its last k steps (no delay at all when that is
  under the recovery threshold). A :class:`Judge` (the monitor's simulator) takes the proposal only
  when the new plan pays for its switch; a refused one is not proposed again until the condition
  moves elsewhere. No flapping: a link's condition moves at most :data:`MOVES_PER_WINDOW` times in
  any ``MOVE_WINDOW`` x k steps this way (the worse rule, a cascade, is never held back), and every
  move of either kind needs k steps measured after the last;
* a slow link **recovers** (for reporting, and its delegated path) after m = ``recover_steps``
  consecutive steps whose delay (or upper bound, see :mod:`titan_morph.monitor.delays`) is below
  ``recover_ratio`` x the initial plan's tolerance (or ``floor_ms``, whichever is larger).

A plan is made for a latency and a transmit time per link: the transmit time is the
``plan_quantile`` of the transmit times measured over the last k steps (0 when none was: the
delay-only model), rounded up to ``transmit_quantum_ms``; the latency is the ``plan_quantile`` of
the last k steps' exact samples less that transmit time, rounded up to ``quantum_ms`` so that small
fluctuations do not re-plan (their sum covers the measured Eq. 1 cost). Everything here is
deterministic: ranks that feed identical estimates (and a judge that is a pure function of them)
reach identical decisions.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from titan_morph.monitor.delays import LinkEstimate, quantile

__all__ = ["MOVES_PER_WINDOW", "MOVE_WINDOW", "DetectRule", "LinkState", "Decision", "Detector", "Judge", "Verdict"]

MOVES_PER_WINDOW = 2
"""A slow link's planned condition moves by a judge's verdict at most this often ..."""
MOVE_WINDOW = 4
"""... in any this many x ``detect_steps`` steps."""


@dataclass(frozen=True)
class Verdict:
    """A judge's answer to a proposed condition: take it or not, and the numbers behind it."""

    pays: bool
    why: str


class Judge(Protocol):
    """Whether planning for ``delays_ms`` / ``transmit_ms`` (per link, every link's) pays for the
    switch, the condition having held ``age_steps`` steps so far."""

    def __call__(self, delays_ms: Sequence[float], transmit_ms: Sequence[float], age_steps: int) -> Verdict: ...


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
    transmit_quantum_ms: float = 0.1

    def __post_init__(self) -> None:
        if self.detect_steps < 1 or self.recover_steps < 1:
            raise ValueError(
                f"detect_steps and recover_steps must be >= 1, got {self.detect_steps}, {self.recover_steps}"
            )
        if not (0 < self.recover_ratio <= 1):
            raise ValueError(f"recover_ratio must satisfy 0 < ratio <= 1, got {self.recover_ratio}")
        if self.margin < 0 or self.floor_ms < 0 or self.quantum_ms <= 0 or self.transmit_quantum_ms <= 0:
            raise ValueError("margin and floor_ms must be >= 0, quantum_ms and transmit_quantum_ms > 0")
        if not 0 <= self.plan_quantile <= 1:
            raise ValueError(f"plan_quantile must be in [0, 1], got {self.plan_quantile}")

    def slow_threshold(self, tolerance_ms: float) -> float:
        return max(tolerance_ms * (1.0 + self.margin), self.floor_ms)

    def recover_threshold(self, initial_tolerance_ms: float) -> float:
        return max(self.recover_ratio * initial_tolerance_ms, self.floor_ms)

    def round_up(self, delay_ms: float) -> float:
        return math.ceil(delay_ms / self.quantum_ms - 1e-9) * self.quantum_ms

    def round_transmit(self, transmit_ms: float) -> float:
        q = self.transmit_quantum_ms
        return round(math.ceil(transmit_ms / q - 1e-9) * q, 6)

    def band_ms(self, planned_cost_ms: float) -> float:
        """How far a step's cost (or transmit time) may lie from the planned condition's before the
        condition counts as moved: ``margin`` of the planned cost, at least one ``quantum_ms``."""
        return max(self.quantum_ms, self.margin * planned_cost_ms)

    def plan_for(self, window: Sequence[float], transmits: Sequence[float]) -> tuple[float, float]:
        """(latency, transmit) to plan for from the recent exact samples and measured transmit times."""
        tau = self.round_transmit(quantile(transmits, self.plan_quantile)) if transmits else 0.0
        return self.round_up(max(0.0, quantile(window, self.plan_quantile) - tau)), tau


@dataclass
class LinkState:
    """Detector state of one link."""

    slow: bool = False
    planned_ms: float = 0.0  # the latency the active plan absorbs on this link (0 = none)
    planned_transmit_ms: float = 0.0  # the transmit time per message it plans for (0 = delay-only)
    over: int = 0  # consecutive steps above the active plan's threshold
    healthy: int = 0  # consecutive steps below the recovery threshold (slow links)
    moved: int = 0  # consecutive steps off the planned condition by more than the band (slow links)
    refused: tuple[float, float] | None = None  # the last condition the judge turned down
    moves: deque[int] = field(default_factory=deque)  # steps of the condition's recent moves
    recent: deque[list[float]] = field(default_factory=deque)  # exact samples of the last k steps
    transmits: deque[float | None] = field(default_factory=deque)  # transmit measured in the last k steps

    @property
    def planned_cost_ms(self) -> float:
        return self.planned_ms + self.planned_transmit_ms


@dataclass(frozen=True)
class Decision:
    """A change of plan, decided after ``step``: what to plan for, and why (with the numbers)."""

    step: int
    delays_ms: tuple[float, ...]  # per link: the latency to plan for (0 = healthy)
    slow_links: tuple[int, ...]
    newly_slow: tuple[int, ...]
    recovered: tuple[int, ...]
    reasons: tuple[str, ...]
    # per link: the exact delay samples of the last k steps behind a slow link's plan (() if healthy)
    windows_ms: tuple[tuple[float, ...], ...] = ()
    transmit_ms: tuple[float, ...] = ()  # per link: the transmit time per message to plan for (() = all 0)

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

    @property
    def planned_transmit_ms(self) -> tuple[float, ...]:
        return tuple(s.planned_transmit_ms for s in self.links)

    def update(
        self,
        step: int,
        estimates: Sequence[LinkEstimate],
        tolerance_ms: Sequence[float],
        initial_tolerance_ms: Sequence[float],
        capacity_ms: Sequence[float] | None = None,
        judge: Judge | None = None,
    ) -> Decision | None:
        """Advance every link by one step; a :class:`Decision` when the plan must change.
        ``capacity_ms``: per link, the transmit time per message the plan absorbs (module
        docstring); None = transmit times are not judged. ``judge``: who takes a moved condition
        (None: every one is taken)."""
        rule = self.rule
        reasons: list[str] = []
        newly, recovered, changed = [], [], False
        proposed: dict[int, tuple[float, float]] = {}
        for i, (state, est) in enumerate(zip(self.links, estimates, strict=True)):
            state.recent.append(list(est.exact))
            state.transmits.append(est.transmit_ms)
            while len(state.recent) > rule.detect_steps:
                state.recent.popleft()
                state.transmits.popleft()
            window = [x for xs in state.recent for x in xs]
            taus = [t for t in state.transmits if t is not None]
            delay, tau = est.delay_ms, est.transmit_ms
            threshold = rule.slow_threshold(tolerance_ms[i])
            cap = capacity_ms[i] if capacity_ms is not None else math.inf
            slow_delay = delay is not None and delay > threshold
            slow_wire = tau is not None and tau > max(cap * (1.0 + rule.margin), rule.floor_ms)
            state.over = state.over + 1 if slow_delay or slow_wire else 0
            why = (
                f"delay {delay:.1f} ms > {threshold:.1f} ms"
                if slow_delay and delay is not None
                else f"transmit {tau:.1f} ms per message > {cap:.1f} ms the plan absorbs"
                if tau is not None
                else ""
            )
            if not state.slow:
                if state.over >= rule.detect_steps and window:
                    state.slow = True
                    state.planned_ms, state.planned_transmit_ms = rule.plan_for(window, taus)
                    state.over = state.healthy = state.moved = 0
                    newly.append(i)
                    reasons.append(
                        f"link {i} slow: {why} (Eq. 1 tolerance {tolerance_ms[i]:.1f} ms + {rule.margin:.0%}"
                        f"{_capacity(cap)}) for {rule.detect_steps} steps; planning for {state.planned_ms:g} ms"
                        f"{_plus(state.planned_transmit_ms)} (p{rule.plan_quantile * 100:.0f} of {len(window)} samples)"
                    )
                continue
            upper = est.upper_ms
            recover_at = rule.recover_threshold(initial_tolerance_ms[i])
            wire_ok = tau is None or tau <= rule.recover_ratio * cap
            state.healthy = state.healthy + 1 if upper is not None and upper < recover_at and wire_ok else 0
            target = rule.plan_for(window, taus) if window else None
            cost = sum(target) if target is not None else None
            state.moved = state.moved + 1 if self._moved(state, est) else 0
            if state.healthy >= rule.recover_steps:
                reasons.append(
                    f"link {i} recovered: delay {upper:.1f} ms < {recover_at:.1f} ms (max of {rule.recover_ratio:g} x "
                    f"initial tolerance, {rule.floor_ms:g} ms) for {rule.recover_steps} steps"
                )
                state.slow, state.planned_ms, state.planned_transmit_ms = False, 0.0, 0.0
                state.over = state.healthy = state.moved = 0
                state.refused = None
                recovered.append(i)
            elif (
                state.over >= rule.detect_steps
                and target is not None
                and cost is not None
                and (cost > state.planned_cost_ms + 1e-9 or target[1] > state.planned_transmit_ms + 1e-9)
            ):
                reasons.append(
                    f"link {i} worse: {why} (tolerance of the plan for {state.planned_ms:g} ms"
                    f"{_plus(state.planned_transmit_ms)}) for {rule.detect_steps} steps; planning for "
                    f"{target[0]:g} ms{_plus(target[1])}"
                )
                self._move(state, target)
                changed = True
            elif state.moved >= rule.detect_steps and target is not None:
                if quantile(window, rule.plan_quantile) < recover_at:
                    target = (0.0, 0.0)  # under the recovery threshold: plan as if healthy
                held = (state.planned_ms, state.planned_transmit_ms)
                if target not in (state.refused, held) and self._may_move(state, step):
                    proposed[i] = target
                state.moved = 0
        if proposed:
            changed |= self._propose(step, proposed, judge, reasons)
        if not (newly or recovered or changed):
            return None
        windows = tuple(
            tuple(x for xs in state.recent for x in xs) if state.slow and state.planned_cost_ms > 0 else ()
            for state in self.links
        )
        transmit = self.planned_transmit_ms if any(self.planned_transmit_ms) else ()
        return Decision(
            step,
            self.planned_ms,
            self.slow_links,
            tuple(newly),
            tuple(recovered),
            tuple(reasons),
            windows,
            transmit,
        )

    def _moved(self, state: LinkState, est: LinkEstimate) -> bool:
        """Whether this step's own samples put the link off its planned condition (the band)."""
        if not est.exact:
            return False
        lat, tau = self.rule.plan_for(list(est.exact), [est.transmit_ms] if est.transmit_ms is not None else [])
        band = self.rule.band_ms(state.planned_cost_ms)
        return abs(lat + tau - state.planned_cost_ms) > band or abs(tau - state.planned_transmit_ms) > band

    def _may_move(self, state: LinkState, step: int) -> bool:
        """The flapping bound: fewer than :data:`MOVES_PER_WINDOW` moves in the window behind ``step``."""
        while state.moves and state.moves[0] <= step - MOVE_WINDOW * self.rule.detect_steps:
            state.moves.popleft()
        return len(state.moves) < MOVES_PER_WINDOW

    def _move(self, state: LinkState, target: tuple[float, float]) -> None:
        state.planned_ms, state.planned_transmit_ms = target
        state.over = state.moved = 0
        state.refused = None

    def _propose(
        self, step: int, proposed: dict[int, tuple[float, float]], judge: Judge | None, reasons: list[str]
    ) -> bool:
        """Put the moved conditions to ``judge`` together; True when it took them."""
        conditions = [proposed.get(i, (s.planned_ms, s.planned_transmit_ms)) for i, s in enumerate(self.links)]
        delays, transmit = [c[0] for c in conditions], [c[1] for c in conditions]
        verdict = judge(delays, transmit, self.rule.detect_steps) if judge is not None else Verdict(True, "")
        for i, target in proposed.items():
            state = self.links[i]
            if not verdict.pays:
                state.refused = target
                continue
            was = state.planned_cost_ms
            kind = "eased" if sum(target) < was else "moved"
            reasons.append(
                f"link {i} {kind}: p{self.rule.plan_quantile * 100:.0f} of its last {self.rule.detect_steps} steps "
                f"{sum(target):g} ms{_plus(target[1])} against the planned {state.planned_ms:g} ms"
                f"{_plus(state.planned_transmit_ms)}; planning for {target[0]:g} ms{_plus(target[1])}"
                + (f" ({verdict.why})" if verdict.why else "")
            )
            self._move(state, target)
            state.moves.append(step)
        return verdict.pays


def _plus(transmit_ms: float) -> str:
    return f" + {transmit_ms:g} ms transmit" if transmit_ms > 0 else ""


def _capacity(cap: float) -> str:
    return f"; wire time per message {cap:.1f} ms" if math.isfinite(cap) else ""
