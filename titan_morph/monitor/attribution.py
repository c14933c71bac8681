"""What each straggler costs (what-if analysis, pure): per step, the step the simulator times for the
plan that ran under the times the monitor measured, against the same with one link or one rank at
its baseline. The difference is that straggler's cost in ms.

**Measured.** Per rank, its speed as :mod:`.compute` measures it (its op time at speed 1 / its
measured op time), applied to its stages' times at speed 1 through the compute model
(:meth:`~titan_morph.pipelining.core.speeds.ComputeModel.scale`, factor = 1 / speed); per link, the
latency and the transmit time per message the monitor measured (:mod:`.delays`, :mod:`.bandwidth`).
The plan's orders are timed by the planner's one timing routine
(:func:`~titan_morph.pipelining.timing.simulate.makespan`: fixed orders under other delays, paper §3 and
Fig. 5) with the transport's queue depth (§3.2's head-of-line blocking).

**Baseline.** A rank at speed 1; a link with latency 0 and the transmit time it showed over the
baseline steps (0 where none was identified: the delay-only model). The times at speed 1 are the
partitioner's per-layer costs where ``partition = "auto"`` measured them (they survive relaunches),
else every stage's median F, B, W over ``profile_steps`` steps after the first (a warm-up).

**Incremental.** Only causes off their baseline in the step are timed again: a rank slower than the
detector's margin (speed < 1 / (1 + margin)), a link whose latency exceeds the detector's floor
(``detect_min_ms``) or whose transmit time exceeds its baseline's by the margin and
``transmit_quantum_ms``. Every rank off at once is one cause, ``host`` (a loaded host or a slower
clock slows them all; a straggler slows one), and every link off at once (two or more) is
``links``. A step costs 1 + (causes off baseline) simulations (twice that while an adapted plan
runs: the initial plan is timed too, see :func:`straggler_costs`), at most 4R, and the state is a
few numbers per rank and link, whatever the run's length.

**Significant.** A simulated cost is charged (summary, TensorBoard) only when it is more than the
step's noise (:class:`CostGate`): while the monitor holds the cause (a link it holds slow), or once
the cost -- and the measured step's excess over the quiet steps' median -- stayed above the noise
for ``detect_steps`` steps in a row (those steps charged then), until
it stays below for ``recover_steps`` -- the detectors' own hysteresis. The noise is three standard
deviations (from the median absolute deviation) of the pipeline time over the last quiet steps, and
at least half the detector's margin of their median: a cost smaller than that is what the step
varies by anyway.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from titan_morph.monitor.compute import op_time_ms, rank_speeds, stage_kind_ms
from titan_morph.monitor.delays import LinkEstimate
from titan_morph.monitor.detect import DetectRule
from titan_morph.monitor.profile import StepProfile
from titan_morph.monitor.repartition import Partitioner
from titan_morph.pipelining.core.links import LinkDownError
from titan_morph.pipelining.core.model import CostModel, Order
from titan_morph.pipelining.core.speeds import StaticFactors
from titan_morph.pipelining.partition import LayerCost, stage_ranges
from titan_morph.pipelining.timing.simulate import makespan

__all__ = [
    "ALL_LINKS",
    "HOST",
    "Attribution",
    "CostGate",
    "Measured",
    "StragglerCosts",
    "cause_label",
    "cause_names",
    "straggler_costs",
]

Triple = tuple[float, float, float]
HOST, ALL_LINKS = "host", "links"
QUIET_STEPS = 64  # quiet steps the noise is taken over
MIN_QUIET = 5  # before this many, the noise is half the margin of the steps' median


def cause_names(ranks: int) -> tuple[str, ...]:
    """Every cause of a pipeline of ``ranks`` ranks: ``link{i}`` (i < R - 1), ``rank{r}``, then the
    host-wide ones (``host``: every rank; ``links``: every link, with two or more)."""
    wide = (HOST, ALL_LINKS) if ranks > 2 else (HOST,)
    return (*(f"link{i}" for i in range(ranks - 1)), *(f"rank{r}" for r in range(ranks)), *wide)


def cause_label(cause: str) -> str:
    """How the summary names ``cause``: ``link 2``, ``rank 3``, ``the host``, ``all links``."""
    return {HOST: "the host", ALL_LINKS: "all links"}.get(cause, f"{cause[:4]} {cause[4:]}")


@dataclass(frozen=True)
class Measured:
    """One step as the monitor measured it, and which causes were off their baseline."""

    step: int
    speeds: tuple[float, ...]  # per rank (1 = its baseline; unknown counts as 1)
    latency_ms: tuple[float, ...]  # per link
    transmit_ms: tuple[float, ...]  # per link, per message
    baseline_transmit_ms: tuple[float, ...]  # per link
    off: tuple[str, ...]  # the causes off their baseline (:func:`cause_names`)


@dataclass(frozen=True)
class Attribution:
    """Step ``step``'s simulated step under the measured times and every cause's cost (ms; 0 for
    the causes at their baseline), the causes ``off`` their baseline (the ones timed), and
    ``took_ms``: the simulations' own time."""

    step: int
    makespan_ms: float
    costs: dict[str, float]
    off: tuple[str, ...]
    took_ms: float


def straggler_costs(
    base: CostModel,
    orders: Sequence[Order],
    measured: Measured,
    *,
    depth: int | None,
    initial: Sequence[Order] | None = None,
) -> tuple[float, dict[str, float]]:
    """(The simulated step under ``measured``, {cause: its cost}) for the causes off their baseline:
    the step less the same step with that one rank at speed 1 or that one link at latency 0 and its
    baseline transmit time. ``base``: stage times at speed 1; ``orders``: the plan that ran;
    ``initial``: the plan the monitor runs when nothing is slow (None: the same). A plan adapted to
    a straggler may run slower than the initial one without it, so the step without the straggler
    is the better of the two plans (the monitor, §6, returns to the initial one on recovery)."""
    m = measured

    def timed(
        speeds: Sequence[float], latency: Sequence[float], transmit: Sequence[float], plan: Sequence[Order]
    ) -> float:
        model = StaticFactors(tuple(1.0 / s for s in speeds)).scale(base, 0)
        return makespan(model.with_delays(latency).with_transmit(transmit), plan, depth=depth)

    plans = [orders] if initial is None or tuple(initial) == tuple(orders) else [orders, initial]
    full = timed(m.speeds, m.latency_ms, m.transmit_ms, orders)
    costs: dict[str, float] = {}
    for cause in m.off:
        speeds, latency, transmit = list(m.speeds), list(m.latency_ms), list(m.transmit_ms)
        if cause == HOST:
            speeds = [1.0] * len(speeds)
        elif cause == ALL_LINKS:
            latency, transmit = [0.0] * len(latency), list(m.baseline_transmit_ms)
        elif cause.startswith("rank"):
            speeds[int(cause[4:])] = 1.0
        else:
            index = int(cause[4:])
            latency[index], transmit[index] = 0.0, m.baseline_transmit_ms[index]
        costs[cause] = full - min(timed(speeds, latency, transmit, plan) for plan in plans)
    return full, costs


class StragglerCosts:
    """Per-step attribution for one pipeline (module docstring). :meth:`observe` every step with
    the exchanged profiles and the monitor's link estimates (cheap: a few numbers kept);
    :meth:`attribute` runs the simulations for what it returned, when the caller has time."""

    def __init__(self, stages: int, rule: DetectRule, *, profile_steps: int = 2, stages_per_rank: int = 1) -> None:
        self.stages, self.stages_per_rank = stages, stages_per_rank
        self.ranks = stages // stages_per_rank
        self.rule, self.profile_steps = rule, max(1, profile_steps)
        self.gate = CostGate(rule)  # which of the costs it times are charged
        self.costs: tuple[LayerCost, ...] | None = None  # per rank: its op time at speed 1 (kinds summed by stage)
        self.stage_times: tuple[Triple, ...] | None = None  # per stage at speed 1
        self.baseline_transmit: tuple[float, ...] = (0.0,) * (self.ranks - 1)
        self._seen_stage: list[list[Triple]] = [[] for _ in range(stages)]
        self._seen_rank: list[list[Triple]] = [[] for _ in range(self.ranks)]
        self._seen_transmit: list[list[float]] = [[] for _ in range(self.ranks - 1)]
        self._observed = 0

    @property
    def names(self) -> tuple[str, ...]:
        return cause_names(self.ranks)

    def observe(
        self,
        step: int,
        profiles: Sequence[StepProfile],
        estimates: Sequence[LinkEstimate],
        partitioner: Partitioner | None = None,
    ) -> Measured | None:
        """Step ``step``'s measurements (one profile per rank, the monitor's estimates of every
        link); None while the baseline is not known yet."""
        self._observed += 1
        if partitioner is not None and partitioner.costs is not None:
            speeds = self._speeds(partitioner.measured)
            self.stage_times = tuple(
                (sum(c.fwd for c in part), sum(c.bwd for c in part), sum(c.wgt for c in part))
                for part in (partitioner.costs[a:b] for a, b in stage_ranges(partitioner.split))
            )
        elif self.costs is not None:
            speeds = self._speeds(rank_speeds(profiles, self.costs, (1,) * self.ranks))
        else:
            if self._observed > 1:  # the first step is a warm-up (first-use costs)
                self._profile(profiles, estimates)
            return None
        latency, transmit = [], []
        for link, est in enumerate(estimates):
            tau = est.transmit_ms if est.transmit_ms is not None else self.baseline_transmit[link]
            delay = est.delay_ms
            lat = est.latency_ms if est.transmit_ms is not None and est.latency_ms is not None else None
            latency.append(max(0.0, lat if lat is not None else (delay - tau if delay is not None else 0.0)))
            transmit.append(tau)
        return Measured(
            step, speeds, tuple(latency), tuple(transmit), self.baseline_transmit, self._off(speeds, latency, transmit)
        )

    def _speeds(self, measured: Sequence[float | None]) -> tuple[float, ...]:
        return tuple(1.0 if s is None or s <= 0 else float(s) for s in measured)

    def _off(self, speeds: Sequence[float], latency: Sequence[float], transmit: Sequence[float]) -> tuple[str, ...]:
        rule = self.rule
        slow = 1.0 / (1.0 + rule.margin)
        links = [
            f"link{link}"
            for link, (lat, tau, base) in enumerate(zip(latency, transmit, self.baseline_transmit, strict=True))
            if lat > rule.floor_ms or tau - base > max(rule.margin * base, rule.transmit_quantum_ms)
        ]
        ranks = [f"rank{r}" for r, s in enumerate(speeds) if s < slow]
        if len(links) == len(latency) >= 2:
            links = [ALL_LINKS]
        if len(ranks) == len(speeds) >= 2:
            ranks = [HOST]
        return (*links, *ranks)

    def _profile(self, profiles: Sequence[StepProfile], estimates: Sequence[LinkEstimate]) -> None:
        for prof in profiles:
            kinds = stage_kind_ms(prof)
            if kinds is None or op_time_ms(prof) is None:
                continue
            self._seen_rank[prof.stage].append(kinds)
            for stage, compute in prof.stage_times().items():
                own = stage_kind_ms(StepProfile(stage, prof.step, prof.start_ms, prof.end_ms, compute))
                if own is not None:
                    self._seen_stage[stage].append(own)
        for link, est in enumerate(estimates):
            if est.transmit_ms is not None:
                self._seen_transmit[link].append(est.transmit_ms)
        if min(len(s) for s in (*self._seen_stage, *self._seen_rank)) < self.profile_steps:
            return
        self.stage_times = tuple(_median(seen) for seen in self._seen_stage)
        self.costs = tuple(LayerCost(f"rank{r}", *_median(seen)) for r, seen in enumerate(self._seen_rank))
        self.baseline_transmit = tuple(statistics.median(t) if t else 0.0 for t in self._seen_transmit)
        self._seen_stage = self._seen_rank = []
        self._seen_transmit = []

    def base_model(self, microbatches: int) -> CostModel:
        """The stage times at speed 1 as a cost model of ``microbatches`` microbatches."""
        assert self.stage_times is not None
        times = self.stage_times
        return CostModel.uniform(
            self.stages,
            microbatches,
            tuple(t[0] for t in times),
            tuple(t[1] for t in times),
            tuple(t[2] for t in times),
            stages_per_rank=self.stages_per_rank,
        )

    def attribute(
        self,
        measured: Measured,
        orders: Sequence[Order],
        microbatches: int,
        *,
        depth: int | None,
        initial: Sequence[Order] | None = None,
    ) -> Attribution | None:
        """The step's attribution (every cause named; 0 at its baseline; ``initial``: as for
        :func:`straggler_costs`); None when the plan cannot complete under the measured links (a
        link down)."""
        t0 = time.perf_counter()
        try:
            base = self.base_model(microbatches)
            full, costs = straggler_costs(base, orders, measured, depth=depth, initial=initial)
        except LinkDownError:
            return None
        out = {name: costs.get(name, 0.0) for name in self.names}
        return Attribution(measured.step, full, out, measured.off, (time.perf_counter() - t0) * 1e3)


def _median(seen: Sequence[Triple]) -> Triple:
    return (
        statistics.median(t[0] for t in seen),
        statistics.median(t[1] for t in seen),
        statistics.median(t[2] for t in seen),
    )


class CostGate:
    """Which simulated costs are charged (module docstring, **Significant**): per cause, a run of
    steps above the noise, confirmed after ``rule.detect_steps`` and ended after
    ``rule.recover_steps`` below it; a cause the monitor holds is charged at once. Memory: the
    pending costs of at most ``detect_steps`` steps per cause and :data:`QUIET_STEPS` step times."""

    def __init__(self, rule: DetectRule) -> None:
        self.rule = rule
        self._quiet: deque[float] = deque(maxlen=QUIET_STEPS)
        self._pending: dict[str, list[tuple[int, float, float]]] = {}  # cause -> (step, cost, step ms)
        self._confirmed: dict[str, int] = {}  # cause -> steps below the noise since its last one above

    def noise_ms(self) -> float | None:
        """The pipeline time's noise over the quiet steps (None before any)."""
        if not self._quiet:
            return None
        median = statistics.median(self._quiet)
        floor = 0.5 * self.rule.margin * median
        if len(self._quiet) < MIN_QUIET:
            return floor
        mad = statistics.median(abs(t - median) for t in self._quiet)
        return max(3.0 * 1.4826 * mad, floor)

    def admit(
        self, att: Attribution, step_ms: float, held: Collection[str] = ()
    ) -> list[tuple[int, str, float, float]]:
        """The costs charged after step ``att.step`` (pipeline time ``step_ms``; ``held``: causes the
        monitor holds): (step, cause, cost ms, that step's ms), earlier steps of a run that was just
        confirmed included."""
        noise = self.noise_ms()
        limit = 0.5 * self.rule.margin * step_ms if noise is None else noise
        # a cost is real only where the measured step was slower too: one rank's op times can
        # wander above their baseline while the pipeline's step does not
        slower = not self._quiet or step_ms - statistics.median(self._quiet) > limit
        out: list[tuple[int, str, float, float]] = []
        for cause in sorted(set(att.off) | set(self._pending) | set(self._confirmed)):
            ms = att.costs.get(cause, 0.0) if cause in att.off else 0.0
            above = ms > limit and slower
            if cause in held and ms > 0:
                above = True
            if cause in self._confirmed:
                if above:
                    self._confirmed[cause] = 0
                    out.append((att.step, cause, ms, step_ms))
                else:
                    self._confirmed[cause] += 1
                    if self._confirmed[cause] >= self.rule.recover_steps:
                        del self._confirmed[cause]
                continue
            if not above:
                self._pending.pop(cause, None)
                continue
            run = self._pending.setdefault(cause, [])
            run.append((att.step, ms, step_ms))
            if cause in held or len(run) >= self.rule.detect_steps:
                out.extend((step, cause, cost, total) for step, cost, total in self._pending.pop(cause))
                self._confirmed[cause] = 0
        if not (self._pending or self._confirmed):
            self._quiet.append(step_ms)
        return out

    def charged(self) -> tuple[str, ...]:
        """The causes being charged now (confirmed, not yet back below the noise)."""
        return tuple(sorted(self._confirmed))
