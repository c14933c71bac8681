"""``[morph] partition = "auto"``: measure, re-plan, and move layers when it pays (pure).

:class:`Partitioner` is fed the same exchanged profiles as the link monitor, on every rank:

1. **Baseline.** Over ``profile_steps`` steps after the first (a warm-up) it measures every stage's
   F, B, W and spreads them over the layers (:func:`~.compute.spread_costs`): the per-layer costs at
   speed 1 the partition planner splits. A relaunched run gets them, and the planned speeds, from
   before the relaunch (:class:`PartitionState`).
2. **Re-plan.** After the baseline, and whenever :class:`~.compute.SpeedDetector` changes a rank's
   planned speed (slow, slower/faster, recovered), the schedule is re-planned for the split the
   run holds at the measured speeds (:func:`~titan_morph.pipelining.partition.evaluate_split`, with
   the link monitor's planned delays): no restart.
3. **Re-partition** (ski rental). The same decision asks the partition planner for the best split
   at those speeds (:func:`~titan_morph.pipelining.partition.partition`); its planned step is
   ``gain`` ms shorter. From then on every step the run keeps the old split loses ``gain`` ms; once
   the time lost reaches ``after`` x the relaunch cost, and when the gain is at least ``min_gain``
   of the step and the steps left can pay the cost back, :attr:`Partitioner.repartition` names the
   new split. The trainer checkpoints and asks the launcher for a relaunch with it. A later decision
   (the same rank slower still, another rank slow) changes the gain, not the time already lost. A
   recovery is a decision like any other: the split moves back the same way, at its own price.

   The claim of ``after = 1`` and what it assumes: for one condition that holds until it ends, the
   time lost to it (rent, then the relaunch) is at most twice what the best fixed choice in
   hindsight loses -- when the relaunch cost is the price actually paid, the gain is the planner's
   (both per condition), and a condition's move back is counted as its own purchase, under its own
   condition. A price estimated off by a factor ``e`` moves ``e`` times early or late: the bound
   becomes ``1 + max(e, 1/e)``.

The relaunch cost is what a move spends beyond the step it replaces: the checkpoint's save, the
end of the run, a new start (processes, imports, groups, model), the checkpoint's load and the first
step, less one planned step. A relaunched run measures it whole, from the decision to the end of its
first step. The first launch estimates it (:class:`RelaunchParts`): its own start to the end of its
first step, plus a probed save and load and the release's end of run. The runtime agrees one value
for every rank (:meth:`Partitioner.set_startup`) and the state carries the latest across relaunches.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from titan_morph.monitor.compute import SpeedDetector, Weights, rank_speeds, spread_costs, stage_kind_ms
from titan_morph.monitor.detect import DetectRule
from titan_morph.monitor.profile import StepProfile
from titan_morph.pipelining.core.model import Plan
from titan_morph.pipelining.partition import LayerCost, PartitionProblem, SplitPlan, evaluate_split, partition

__all__ = ["Entries", "PartitionState", "Partitioner", "RelaunchParts", "Repartition", "layers_of", "entries_of"]


def entries_of(layers_per_stage: Sequence[int]) -> tuple[int, ...]:
    """Transformer layers per stage -> entries per stage (the embedding on the first stage, the
    output on the last, each an entry of its own)."""
    out = list(layers_per_stage)
    out[0] += 1
    out[-1] += 1
    return tuple(out)


def layers_of(entries: Sequence[int]) -> tuple[int, ...]:
    """Entries per stage -> transformer layers per stage (:func:`entries_of` undone)."""
    out = list(entries)
    out[0] -= 1
    out[-1] -= 1
    return tuple(out)


def first_stage_backward(
    times: tuple[float, float, float], weights: Sequence[Weights], idle: float = 0.05
) -> tuple[float, float, float]:
    """The first stage's (F, B, W) with its backward shared out by weight when its I ran idle (below
    ``idle`` of its W): its input, the tokens, has no gradient, so torch's stage computes the whole
    backward in W; its layers elsewhere would spend it in I and W as the weights say."""
    f, b, w = times
    wb, ww = sum(x[1] for x in weights), sum(x[2] for x in weights)
    if b >= idle * w or wb + ww <= 0:
        return times
    total = b + w
    return f, total * wb / (wb + ww), total * ww / (wb + ww)


@dataclass(frozen=True)
class Entries:
    """The model as the planner splits it: names, per-kind weights (:mod:`.compute`) and (parameter,
    activation) bytes of every entry, the embedding first and the output last."""

    names: tuple[str, ...]
    weights: tuple[Weights, ...]
    bytes: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class RelaunchParts:
    """What a relaunch spends that a first launch does not: the checkpoint's save and load (probed
    before any relaunch) and the end of the run (the release's, after the last step)."""

    save_ms: float
    load_ms: float
    end_ms: float

    @property
    def total_ms(self) -> float:
        return self.save_ms + self.load_ms + self.end_ms

    def describe(self) -> str:
        return (
            f"the checkpoint's save {self.save_ms / 1e3:.1f} s and load {self.load_ms / 1e3:.1f} s (probed)"
            f" and the end of the run {self.end_ms / 1e3:.1f} s"
        )


@dataclass(frozen=True)
class PartitionState:
    """What a relaunch carries ($TITAN_MORPH_PARTITION): the per-entry costs at speed 1, the planned
    speeds, re-partitions so far, the latest relaunch cost and when the move was decided (wall s)."""

    costs: tuple[LayerCost, ...]
    speeds: tuple[float, ...]
    repartitions: int
    relaunch_cost_ms: float | None
    decided_at: float

    def to_json(self) -> str:
        return json.dumps(
            {
                "costs": [[c.name, c.fwd, c.bwd, c.wgt, c.param_bytes, c.act_bytes] for c in self.costs],
                "speeds": list(self.speeds),
                "repartitions": self.repartitions,
                "relaunch_cost_ms": self.relaunch_cost_ms,
                "decided_at": self.decided_at,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> PartitionState:
        data = json.loads(text)
        return cls(
            tuple(LayerCost(str(n), f, b, w, p, a) for n, f, b, w, p, a in data["costs"]),
            tuple(float(s) for s in data["speeds"]),
            int(data["repartitions"]),
            None if data["relaunch_cost_ms"] is None else float(data["relaunch_cost_ms"]),
            float(data["decided_at"]),
        )


@dataclass(frozen=True)
class Repartition:
    """A decided move of layers, after ``step``: the new split (entries per stage) and the numbers."""

    step: int
    entries: tuple[int, ...]
    before: tuple[int, ...]
    speeds: tuple[float, ...]
    current_ms: float
    best_ms: float
    lost_ms: float
    cost_ms: float
    since: int
    after: float = 1.0

    def describe(self) -> str:
        why = (
            f"lost since step {self.since} {self.lost_ms / 1e3:.1f} s >= {self.after:g} x the relaunch cost"
            f" {self.cost_ms / 1e3:.1f} s"
            if self.after > 0
            else f"at once (repartition_after = 0; relaunch cost {self.cost_ms / 1e3:.1f} s)"
        )
        return (
            f"step {self.step}: re-partition: layers per stage {list(layers_of(self.before))} ->"
            f" {list(layers_of(self.entries))} (rank speeds {list(self.speeds)}: planned step"
            f" {self.current_ms:.1f} -> {self.best_ms:.1f} ms); {why}"
        )


@dataclass
class _Pending:
    """A better split known since ``since``, and what the split running now loses per step."""

    since: int
    best: SplitPlan
    current: SplitPlan
    lost_ms: float = 0.0

    @property
    def gain_ms(self) -> float:
        return self.current.makespan_ms - self.best.makespan_ms


@dataclass
class Partitioner:
    """See the module docstring. ``split``: entries per stage of this launch; ``steps``: the run's
    last step; ``max_in_flight``/``memory``: the plans' in-flight cap and the ranks' bytes."""

    entries: Entries
    split: tuple[int, ...]
    microbatches: int
    schedule: str
    steps: int
    profile_steps: int = 2
    rule: DetectRule = field(default_factory=DetectRule)
    after: float = 1.0
    min_gain: float = 0.05
    max_in_flight: int | None = None
    memory: tuple[float, ...] | None = None
    carried: PartitionState | None = None

    def __post_init__(self) -> None:
        ranks = len(self.split)
        carried = self.carried
        self.costs: tuple[LayerCost, ...] | None = carried.costs if carried else None
        self.detector = SpeedDetector(ranks, self.rule, carried.speeds if carried else None)
        self.repartitions = carried.repartitions if carried else 0
        self.relaunch_cost_ms: float | None = carried.relaunch_cost_ms if carried else None
        self.repartition: Repartition | None = None
        self.measured: list[float | None] = [None] * ranks
        self.plan_ms: float | None = None  # the planned step of the split and speeds running now
        self._pending: _Pending | None = None
        self._baseline: list[list[tuple[float, float, float]]] = [[] for _ in range(ranks)]
        self._observed = 0
        self._startup_ms: float | None = None
        self._parts: RelaunchParts | None = None
        self.notes: list[str] = []  # what the log should say (a move not worth its cost); the caller empties it
        self.startup_known = False  # the runtime gave this launch's start-up (set_startup) or has none
        self.applied = False  # the runtime acted on :attr:`repartition`

    # ------------------------------------------------------------------ inputs
    def set_startup(self, startup_ms: float, parts: RelaunchParts | None = None) -> None:
        """The time from this launch's start (a relaunch: the decision) to the end of its first
        step, agreed by every rank, and on a first launch what a relaunch adds to it (``parts``);
        the relaunch cost follows once a step is planned."""
        self._startup_ms = startup_ms
        self._parts = parts
        self._update_cost()

    def _update_cost(self) -> None:
        if self._startup_ms is None or self.plan_ms is None:
            return
        start = f"{self._startup_ms / 1e3:.1f} s from"
        less = f"less one planned step ({self.plan_ms / 1e3:.1f} s)"
        cost = max(0.0, self._startup_ms - self.plan_ms)
        if self.carried is not None:  # measured whole
            before = self.carried.relaunch_cost_ms
            priced = "" if not before else f"; the move was priced at {before / 1e3:.1f} s ({cost / before:.2f}x)"
            text = f"{start} the re-partition's decision to the end of this launch's first step, {less}{priced}"
            measured = "measured"
        else:
            parts = self._parts
            cost += parts.total_ms if parts is not None else 0.0
            add = f", plus {parts.describe()}" if parts is not None else " (no checkpoint's save or load counted)"
            text = f"{start} the launch to the end of its first step, {less}{add}"
            measured = "estimated"
        self.relaunch_cost_ms = cost
        self.notes.append(f"relaunch cost {cost / 1e3:.1f} s ({measured}): {text}")
        self._startup_ms = None

    def problem(self, speeds: Sequence[float], delays: Sequence[float]) -> PartitionProblem:
        assert self.costs is not None
        return PartitionProblem(
            self.costs,
            tuple(speeds),
            self.microbatches,
            schedule=self.schedule,
            delays=tuple(delays),
            memory=self.memory,
            max_in_flight=self.max_in_flight,
        )

    # ------------------------------------------------------------------ steps
    def observe(self, step: int, profiles: Sequence[StepProfile], delays: Sequence[float]) -> tuple[Plan, str] | None:
        """Take step ``step``'s profiles (one per rank); a plan to install now and why, if any."""
        self._observed += 1
        if self._observed == 1:  # this launch's warm-up step: not measured
            if self.carried is None:
                return None
            speeds = self.detector.speeds
            split = list(layers_of(self.split))
            reason = f"layers per stage {split} with rank speeds {list(speeds)} from before the relaunch"
            return self._replan(step, speeds, delays, reason, look=False)
        if self.costs is None:
            return self._profile(step, profiles, delays)
        self.measured = rank_speeds(profiles, self.costs, self.split)
        decision = self.detector.update(step, self.measured)
        if decision is not None:
            return self._replan(step, decision.speeds, delays, "; ".join(decision.reasons), look=True)
        self._account(step)
        return None

    def _profile(self, step: int, profiles: Sequence[StepProfile], delays: Sequence[float]) -> tuple[Plan, str] | None:
        for prof in profiles:
            kinds = stage_kind_ms(prof)
            if kinds is not None:
                self._baseline[prof.stage].append(kinds)
        if min(len(b) for b in self._baseline) < self.profile_steps:
            return None
        medians = [
            (
                statistics.median(k[0] for k in seen),
                statistics.median(k[1] for k in seen),
                statistics.median(k[2] for k in seen),
            )
            for seen in self._baseline
        ]
        e = self.entries
        medians[0] = first_stage_backward(medians[0], e.weights[: self.split[0]])
        self.costs = spread_costs(e.names, e.weights, self.split, medians, e.bytes)
        reason = (
            f"stage times measured over {self.profile_steps} steps: F,B,W per stage"
            f" {[[round(x, 1) for x in m] for m in medians]} ms spread over the layers"
        )
        return self._replan(step, self.detector.speeds, delays, reason, look=True)

    def _replan(
        self, step: int, speeds: Sequence[float], delays: Sequence[float], reason: str, *, look: bool
    ) -> tuple[Plan, str]:
        """The plan for the split running now at ``speeds``; with ``look``, the best split too (the
        ski rental starts over)."""
        problem = self.problem(speeds, delays)
        current = evaluate_split(problem, self.split)
        self.plan_ms = current.makespan_ms
        self._update_cost()
        was, self._pending = self._pending, None
        text = f"{reason} -> planned step {current.makespan_ms:.1f} ms"
        if look:
            best = partition(problem).best
            if best.layers_per_stage != self.split and best.makespan_ms < current.makespan_ms:
                # the rent already paid for keeping this split stays paid: another rank's decision
                # changes the gain from here on, not what was lost
                self._pending = _Pending(step, best, current)
                if was is not None:
                    self._pending.since, self._pending.lost_ms = was.since, was.lost_ms
                text += (
                    f"; layers per stage {list(layers_of(best.layers_per_stage))} would plan {best.makespan_ms:.1f} ms"
                )
            self._account(step)
        return current.plan, text

    def _account(self, step: int) -> None:
        """One more step on the split running now: the ski rental's rent, and the move when due."""
        pending = self._pending
        if pending is None or self.repartition is not None:
            return
        pending.lost_ms += pending.gain_ms
        cost = self.relaunch_cost_ms
        current = pending.current.makespan_ms
        if cost is None or pending.gain_ms < self.min_gain * current:
            return
        if self.after > 0 and (self.steps - step) * pending.gain_ms <= cost:  # cannot pay for itself any more
            self._pending = None
            self.notes.append(
                f"step {step}: layers per stage {list(layers_of(pending.best.layers_per_stage))} would save"
                f" {pending.gain_ms:.1f} ms per step, but the {self.steps - step} steps left cannot pay back"
                f" the relaunch cost {cost / 1e3:.1f} s: keeping {list(layers_of(self.split))}"
            )
            return
        if pending.lost_ms >= self.after * cost:
            self.repartition = Repartition(
                step,
                pending.best.layers_per_stage,
                self.split,
                self.detector.speeds,
                current,
                pending.best.makespan_ms,
                pending.lost_ms,
                cost,
                pending.since,
                self.after,
            )

    # ------------------------------------------------------------------ outputs
    def state(self, decided_at: float) -> PartitionState:
        """What the relaunch for :attr:`repartition` carries."""
        assert self.costs is not None
        return PartitionState(
            self.costs, self.detector.speeds, self.repartitions + 1, self.relaunch_cost_ms, decided_at
        )

    def metrics(self) -> dict[str, float]:
        """TensorBoard scalars of the last step (identical on every rank)."""
        out: dict[str, float] = {"morph/repartitions": float(self.repartitions)}
        for s, n in enumerate(layers_of(self.split)):
            out[f"morph/partition/stage{s}"] = float(n)
        for r, (measured, state) in enumerate(zip(self.measured, self.detector.ranks)):
            if measured is not None:
                out[f"morph/rank_speed/rank{r}"] = measured
            out[f"morph/planned_speed/rank{r}"] = state.speed
            out[f"morph/slow_rank/rank{r}"] = float(state.slow)
        if self.relaunch_cost_ms is not None:
            out["morph/relaunch_cost_ms"] = self.relaunch_cost_ms
        if self._pending is not None:
            out["morph/partition_gain_ms"] = self._pending.gain_ms
            out["morph/partition_lost_ms"] = self._pending.lost_ms
        return out
