"""Live adaptation's decisions (paper §6): from the stages' exchanged step profiles to a plan change.

The runtime exchanges one profile row per stage after every step and hands every rank the same
list; :meth:`Monitor.observe` turns it into per-link delays, latencies and transmit times
(:mod:`.delays`, :mod:`.bandwidth`), runs the detector with hysteresis (:mod:`.detect`: Eq. 1,
and the wire's pace) and, on a decision, builds the new plan for the measured latencies and
transmit times (Alg. 2 + the search under the bandwidth model, :mod:`.replan`). Everything is a
pure function of the exchanged data, so every rank reaches the same :class:`Change`; the runtime
installs it at the iteration boundary (and, with ``[morph] transport = "auto"``, moves the slow
links to the delegates).

Before the first decision, when the stage times were not configured, the initial plan is rebuilt
from the times measured over the first ``profile_steps`` steps (``[morph] profile_steps``).

With ``[morph] partition = "auto"`` a :class:`~titan_morph.monitor.repartition.Partitioner`
(:attr:`Monitor.partitioner`) watches every rank's compute speed on the same profiles: its re-plans
for the measured speeds (with the links' planned delays) are changes like the link detector's, and
its re-partition decision waits in ``partitioner.repartition`` for the trainer.
"""

from __future__ import annotations

import logging
import math
import random
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from titan_morph.monitor.delays import LinkEstimate, estimate_links, quantile
from titan_morph.monitor.detect import Decision, Detector, DetectRule, Judge, Verdict
from titan_morph.monitor.profile import PROBE_PATH, StepProfile
from titan_morph.monitor.rate_probes import RateProbes
from titan_morph.monitor.repartition import Partitioner
from titan_morph.monitor.replan import MeasuredTimes, adapted_plan, search_iterations, wire_capacity_ms
from titan_morph.pipelining.core.links import StaticDelays
from titan_morph.pipelining.core.model import CostModel, Plan
from titan_morph.pipelining.partition import evaluate_split
from titan_morph.pipelining.schedules.slackness import tolerance_ms
from titan_morph.pipelining.timing.simulate import makespan, simulate

__all__ = ["MIN_GAIN", "AdaptPolicy", "Change", "Monitor"]

logger = logging.getLogger(__name__)

MIN_GAIN = 0.01
"""A moved condition re-plans only when the simulator's step gains at least this share: below it
the model's own error (a few per cent against measured steps, docs/results.md) decides, not the plan."""


@dataclass(frozen=True)
class AdaptPolicy:
    """What a decision may change (from ``[morph]``)."""

    enabled: bool = True  # re-plan (PipeMorph with ``adapt = true``); False = measure and report only
    memory: int | tuple[int, ...] | None = None  # in-flight cap of adapted plans, per rank (None = none, §4.2)
    search: bool = False
    search_iterations: int = 0  # the search's fixed work (0 = what takes ~search_budget_ms of CPU)
    search_budget_ms: float = 200.0
    depth: int | None = None  # link-queue depth adapted plans are evaluated with (None = delegated)
    delegate_slow_links: bool = False  # ``auto`` transport: slow links go to the delegates
    samples: int = 0  # plan for this many delay vectors when a slow link's delay varies (0 = never)


@dataclass(frozen=True)
class Change:
    """A plan change decided after ``step``: the plan to install, the links to move, and why."""

    step: int
    plan: Plan
    reasons: tuple[str, ...]
    delays_ms: tuple[float, ...]  # per link: the latency the plan is made for (0 = healthy)
    switch: tuple[int, ...] = ()  # links to move to the delegated path
    restore: tuple[int, ...] = ()  # links to move back to the default path
    replan_ms: float = 0.0
    decision: Decision | None = None  # None: the profiled initial plan
    transmit_ms: tuple[float, ...] = ()  # per link: the transmit time per message it is made for (() = none)

    def describe(self, active: Plan, times: Sequence[Sequence[float]], delegated: Sequence[int]) -> str:
        """The log line of this change once installed (``active``: the plan now running)."""
        return (
            f"step {self.step}: {'; '.join(self.reasons)} -> plan {active.plan_id} x={list(active.warmup)} "
            f"(planned delays {[round(d, 1) for d in self.delays_ms]} ms{self._transmit()}, "
            f"measured F,B,W {[list(t) for t in times]} "
            f"ms, {self.replan_ms:.0f} ms to plan), delegated links {list(delegated)}"
        )

    def _transmit(self) -> str:
        return f" + transmit {[round(t, 2) for t in self.transmit_ms]} ms" if any(self.transmit_ms) else ""


class Monitor:
    """Detection and re-planning for one pipeline, fed the same exchanged profiles on every rank.

    Args:
        num_stages, microbatches: the pipeline; ``stages_per_rank`` (1, or 2 for the V) places
            the stages on ranks, and links join adjacent ranks.
        initial_plan: the plan the run starts with; it comes back when every link has recovered.
        fallback_times: per-stage (F, B, W) ms used until a stage's times have been measured.
        rule, policy: detector thresholds and what a decision may change.
        initial_planner: rebuilds the initial plan from measured times (None: it does not depend on
            them), applied after ``profile_steps`` steps.
        plan_for: the initial plan for another count of microbatches (a DP replica's share changed,
            :meth:`resize`); None: the count never changes.
    """

    def __init__(
        self,
        *,
        num_stages: int,
        microbatches: int,
        initial_plan: Plan,
        fallback_times: Sequence[tuple[float, float, float]],
        rule: DetectRule | None = None,
        policy: AdaptPolicy | None = None,
        initial_planner: Callable[[CostModel], Plan] | None = None,
        profile_steps: int = 0,
        stages_per_rank: int = 1,
        plan_for: Callable[[int], Plan] | None = None,
    ) -> None:
        self.num_stages, self.microbatches = num_stages, microbatches
        self.ranks = num_stages // stages_per_rank
        self.initial_plan = initial_plan
        self.detector = Detector(self.ranks - 1, rule)
        self.policy = policy or AdaptPolicy()
        self.times = MeasuredTimes(num_stages, fallback_times, stages_per_rank=stages_per_rank)
        self.initial_planner = initial_planner
        self.plan_for = plan_for
        self.profile_steps = profile_steps
        self.profiles: list[StepProfile] = []
        self.estimates: list[LinkEstimate] = []
        # a count and the latest, not every change: each holds a whole plan and a run may last days
        self.decisions = 0
        self.replans = 0  # decisions that changed the running plan
        self.last_change: Change | None = None
        self._held: deque[int] = deque(maxlen=8)  # how many steps each recent plan condition held
        self.step = 0
        self.partitioner: Partitioner | None = None  # partition = "auto": set by the runtime's assembly
        self.probes = RateProbes(self.ranks - 1)

    def tolerances(self, *plans: Plan) -> list[list[float]]:
        """Eq. 1 tolerance of every link under each of ``plans``, with the measured stage times."""
        model = self.times.model(self.microbatches)
        return [[tolerance_ms(model, plan.warmup, link) for link in range(self.ranks - 1)] for plan in plans]

    def observe(self, step: int, profiles: list[StepProfile], active: Plan) -> Change | None:
        """Take step ``step``'s profiles (one per rank, ordered by rank); the change to make, if any."""
        self.step, self.profiles = step, profiles
        self.times.add(profiles)
        self.estimates = estimate_links(profiles, self.ranks, per_byte_ms=self.probes.per_byte_ms())
        self.probes.take(step, self.estimates)
        capacity = wire_capacity_ms(self.times.model(self.microbatches))
        tolerance, initial = self.tolerances(active, self.initial_plan)
        decision = self.detector.update(step, self.estimates, tolerance, initial, capacity, self._judge(active))
        self.probes.settle(self.estimates, self.detector.links, self.detector.rule.floor_ms)
        change = None
        if decision is not None and self.policy.enabled:
            change = self._adapt(decision)
        elif decision is not None:
            logger.warning("titan_morph: step %d: %s (adaptation off)", step, "; ".join(decision.reasons))
        if change is None and step == self.profile_steps and self.initial_planner is not None:
            change = self._profiled_initial_plan(active, self.initial_planner)
        if self.partitioner is not None:
            change = self._compute_change(step, profiles, change)
        if change is not None:
            self._made(change, active)
        return change

    def estimated_links(self) -> StaticDelays:
        """The link model of the last step as the monitor measured it: per link and direction the
        latency and transmit time of its pipeline messages (:meth:`LinkEstimate.direction_wire_ms`);
        a direction without exact samples takes the other's, a link without any its delay bound.
        What the running plan's own traffic adds (the reverse direction's share) is in them."""
        fwd, bwd, tf, tb = [], [], [], []
        for est in self.estimates:
            wire = est.direction_wire_ms()
            bound = (est.upper_ms or 0.0, 0.0)
            f = wire.get("fwd") or wire.get("bwd") or bound
            b = wire.get("bwd") or f
            fwd.append(f[0])
            bwd.append(b[0])
            tf.append(f[1])
            tb.append(b[1])
        return StaticDelays(tuple(fwd), tuple(bwd), tuple(tf), tuple(tb))

    def floor_links(self) -> StaticDelays:
        """Links no schedule can beat, for a lower bound: per link the least latency measured in
        either direction (or by its probe), and the wire's own transmit time (not what a queue met
        under the running plan's traffic)."""
        latency, transmit = [], []
        for est in self.estimates:
            wire = est.direction_wire_ms()
            found = [lat for lat, _ in wire.values()]
            if est.probed is not None and est.probed.latency_ms is not None:
                found.append(est.probed.latency_ms)
            latency.append(min(found, default=est.upper_ms or 0.0))
            transmit.append(est.transmit_ms or 0.0)
        return StaticDelays(tuple(latency), transmit=tuple(transmit))

    def modelled_ms(self, plan: Plan, depth: int | None) -> float | None:
        """The simulator's makespan of ``plan`` under :meth:`estimated_links` with the measured
        stage times and each rank's host time between ops (:func:`host_gaps_ms`): the link model
        checked against the step it was measured in, every parameter from this run's op and message
        stamps (None before the first step, or when the plan cannot complete)."""
        if not self.estimates:
            return None
        model = self.times.model(self.microbatches)
        gaps = host_gaps_ms(self.profiles)
        if len(gaps) == self.ranks:  # each op also costs its rank's host time between ops
            rank_of = [s if s < self.ranks else 2 * self.ranks - 1 - s for s in range(model.stages)]
            model = replace(
                model,
                fwd=tuple(t + gaps[rank_of[s]] for s, t in enumerate(model.fwd)),
                bwd=tuple(t + gaps[rank_of[s]] for s, t in enumerate(model.bwd)),
                wgt=tuple(t + gaps[rank_of[s]] for s, t in enumerate(model.wgt)),
            )
        try:
            return simulate(model, plan.orders, links=self.estimated_links(), depth=depth).makespan
        except (RuntimeError, ValueError):
            return None

    def probes_due(self) -> tuple[int, ...]:
        """Links whose rate a probe train should measure before the next step (:mod:`.rate_probes`);
        the same on every rank. The runtime probes those on a path it can probe."""
        return self.probes.due(self.step, self.estimates, self.detector.links, self.detector.rule.floor_ms)

    def _compute_change(self, step: int, profiles: list[StepProfile], change: Change | None) -> Change | None:
        """The partitioner's re-plan for measured speeds, merged into the link side's ``change``
        (whose link moves stand)."""
        assert self.partitioner is not None
        t0 = time.monotonic()
        out = self.partitioner.observe(step, profiles, self.detector.planned_ms)
        for note in self.partitioner.notes:
            logger.warning("titan_morph: %s", note)
        self.partitioner.notes.clear()
        if out is None:
            return change
        plan, reason = out
        if not self.policy.enabled:
            logger.warning("titan_morph: step %d: %s (adaptation off)", step, reason)
            return change
        replan_ms = (time.monotonic() - t0) * 1e3
        if change is None:
            return Change(step, plan, (reason,), self.detector.planned_ms, replan_ms=replan_ms)
        reasons = (*change.reasons, reason)
        return replace(change, plan=plan, reasons=reasons, replan_ms=change.replan_ms + replan_ms)

    def resize(self, microbatches: int) -> Plan:
        """Plan for N = ``microbatches`` from now on (a rebalance across DP replicas,
        :mod:`.rebalance`), in the state the monitor is in: the initial plan for N when every link is
        healthy, else Alg. 2 for the planned delays; the partitioner's plan for its measured speeds
        when it has them. Every rank of the pipeline makes the same plan."""
        if self.plan_for is None and self.initial_planner is None:
            raise ValueError(f"this monitor plans for N = {self.microbatches} only, not {microbatches}")
        self.microbatches = microbatches
        profiled = self.initial_planner is not None and self.step >= self.profile_steps
        if profiled or self.plan_for is None:
            assert self.initial_planner is not None
            self.initial_plan = self.initial_planner(self.times.model(microbatches))
        else:
            self.initial_plan = self.plan_for(microbatches)
        plan, policy = self.initial_plan, self.policy
        if policy.enabled and (any(self.detector.planned_ms) or any(self.detector.planned_transmit_ms)):
            delays, transmit = self.detector.planned_ms, self.detector.planned_transmit_ms
            model = self.times.model(microbatches, delays, policy.memory, transmit)
            iterations = search_iterations(model, policy.search_iterations, policy.search_budget_ms)
            plan = adapted_plan(model, search=policy.search, depth=policy.depth, iterations=iterations)
        part = self.partitioner
        if part is not None:
            part.microbatches = microbatches
            if part.costs is not None and policy.enabled:
                problem = part.problem(part.detector.speeds, self.detector.planned_ms)
                plan = evaluate_split(problem, part.split).plan
        return plan

    def _made(self, change: Change, active: Plan | None = None) -> None:
        self.decisions += 1
        if active is None or change.plan.orders != active.orders:
            self.replans += 1
        if self.last_change is not None:
            self._held.append(change.step - self.last_change.step)
        self.last_change = change

    def _judge(self, active: Plan) -> Judge:
        """The detector's judge of a moved condition while ``active`` runs (:meth:`verdict`)."""

        def judge(delays_ms: Sequence[float], transmit_ms: Sequence[float], age_steps: int) -> Verdict:
            return self.verdict(active, delays_ms, transmit_ms, age_steps)

        return judge

    def verdict(
        self, active: Plan, delays_ms: Sequence[float], transmit_ms: Sequence[float], age_steps: int
    ) -> Verdict:
        """Does a plan for the moved condition pay for the switch (paper §6's re-plan, both ways)?

        Under the condition (the measured stage times, ``delays_ms`` and ``transmit_ms`` per link)
        the simulator times the running plan and the one Alg. 2 makes for it (the plan the change
        would install, before any search): the gain per step, when at least :data:`MIN_GAIN` of it,
        must repay the switch over the steps the condition is expected to last (as long again as it
        has held, or the recent conditions' mean, whichever is longer). The switch costs the
        search's budget when searching (every rank spends it before the next step); the plan itself
        is installed between steps, and Alg. 2 takes about a millisecond. The budget, not a measured
        time, so that every rank reaches the same verdict. Adaptation off: every condition is taken
        (reported, never installed)."""
        policy = self.policy
        if not policy.enabled:
            return Verdict(True, "")
        model = self.times.model(self.microbatches, delays_ms, policy.memory, transmit_ms)
        healthy = not any(delays_ms) and not any(transmit_ms)
        candidate = (
            self.initial_plan if healthy else adapted_plan(model, search=False, depth=policy.depth, iterations=0)
        )
        plan_ms = policy.search_budget_ms if policy.search and not healthy else 0.0
        try:
            now = makespan(model, active.orders, depth=policy.depth)
        except (RuntimeError, ValueError):
            return Verdict(True, "the running plan cannot complete under it")
        try:
            new = makespan(model, candidate.orders, depth=policy.depth)
        except (RuntimeError, ValueError):
            return Verdict(False, "")
        horizon = max(age_steps, round(statistics.fmean(self._held)) if self._held else 0)
        gain = now - new
        why = f"simulated step {now:.0f} -> {new:.0f} ms" + (
            f": {gain:.0f} ms x {horizon} steps against {plan_ms:.0f} ms to search" if plan_ms else ""
        )
        return Verdict(gain >= MIN_GAIN * now and gain * horizon > plan_ms, why)

    def assume_slow(self, delays_ms: Sequence[float], reason: str) -> Change | None:
        """Links known to be slow before the first step, at ``delays_ms`` per link (0 = healthy): the
        orchestrator moved a measured slow pair of ranks onto them and tells the scheduler (§6,
        Fig. 13 step 5). They are marked slow as if detected, and the change plans for them (None
        when nothing is slow or adaptation is off). Call before the first :meth:`observe`."""
        slow = tuple(i for i, d in enumerate(delays_ms) if d > 0)
        if not slow or not self.policy.enabled:
            return None
        for i in slow:
            self.detector.links[i].slow, self.detector.links[i].planned_ms = True, float(delays_ms[i])
        reasons = tuple(f"link {i} slow: {reason}; planning for {delays_ms[i]:g} ms" for i in slow)
        change = self._adapt(Decision(0, self.detector.planned_ms, slow, slow, (), reasons))
        self._made(change)
        return change

    def _profiled_initial_plan(self, active: Plan, planner: Callable[[CostModel], Plan]) -> Change | None:
        t0 = time.monotonic()
        plan = planner(self.times.model(self.microbatches))
        self.initial_plan = plan
        if self.detector.slow_links or plan.orders == active.orders:
            return None  # an adapted plan is running, or the measured times change nothing
        reason = f"stage times measured over {self.profile_steps} steps: initial plan from F,B,W {self.times.times()}"
        return Change(self.step, plan, (reason,), plan.model.delays, replan_ms=(time.monotonic() - t0) * 1e3)

    def _adapt(self, decision: Decision) -> Change:
        t0 = time.monotonic()
        policy = self.policy
        if not any(decision.delays_ms) and not any(decision.transmit_ms):
            plan = self.initial_plan  # every link healthy, or planned as healthy (:mod:`.detect`)
        else:
            model = self.times.model(self.microbatches, decision.delays_ms, policy.memory, decision.transmit_ms)
            samples = self.delay_samples(decision)
            plan = adapted_plan(
                model,
                search=policy.search,
                depth=policy.depth,
                iterations=search_iterations(model, policy.search_iterations, policy.search_budget_ms, samples),
                samples=samples,
            )
        moving = policy.delegate_slow_links
        return Change(
            decision.step,
            plan,
            decision.reasons,
            decision.delays_ms,
            switch=decision.newly_slow if moving else (),
            restore=decision.recovered if moving else (),
            replan_ms=(time.monotonic() - t0) * 1e3,
            decision=decision,
            transmit_ms=decision.transmit_ms,
        )

    def delay_samples(self, decision: Decision) -> list[tuple[float, ...]] | None:
        """``policy.samples`` per-link latency vectors from the slow links' recent measurements, when
        one of them varies from step to step (spread above the detector's rounding quantum); None:
        plan for the one vector ``decision.delays_ms``. A link planned with a transmit time has it
        taken off its samples (they measure latency + transmit).

        Vector j holds, for each slow link, the ((j + 0.5) / K)-quantile of its recent samples, the
        links' quantiles paired by a fixed shuffle per link (the same on every rank), so the vectors
        cover each link's spread without assuming the links move together; healthy links get 0.
        """
        k, windows = self.policy.samples, decision.windows_ms
        if k <= 0 or not windows:
            return None
        spread = [statistics.pstdev(w) if len(w) > 1 else 0.0 for w in windows]
        if not any(s > self.detector.rule.quantum_ms for s in spread):
            return None
        columns = []
        for link, window in enumerate(windows):
            if not window:
                columns.append([decision.delays_ms[link]] * k)
                continue
            tau = decision.transmit_ms[link] if decision.transmit_ms else 0.0
            values = [max(0.0, quantile(window, (j + 0.5) / k) - tau) for j in range(k)]
            random.Random(link).shuffle(values)
            columns.append(values)
        return [tuple(col[j] for col in columns) for j in range(k)]

    def metrics(self, delegated: frozenset[int]) -> dict[str, float]:
        """TensorBoard scalars of the last step (identical on every rank)."""
        out: dict[str, float] = {"morph/decisions": float(self.decisions), "morph/replans": float(self.replans)}
        for link, state in enumerate(self.detector.links):
            out[f"morph/straggling/link{link}"] = float(state.slow)
            out[f"morph/planned_delay_ms/link{link}"] = state.planned_ms
            out[f"morph/planned_transmit_ms/link{link}"] = state.planned_transmit_ms
            out[f"morph/delegated/link{link}"] = float(link in delegated)
        for est in self.estimates:
            figures = {
                "delay_ms": est.upper_ms,  # latency + transmit (queueing left out), or a bound
                "bandwidth_mbps": est.bandwidth_mbps,  # only where some message queued (else unknown)
                "transmit_ms": est.transmit_ms,
                "link_latency_ms": est.latency_ms,  # the latency alone, where the transmit time is known
            }
            for name, value in figures.items():
                if value is not None and math.isfinite(value):
                    out[f"morph/{name}/link{est.link}"] = value
            for direction, value in est.direction_latency_ms().items():  # the link model's latency per direction
                out[f"morph/link_latency_ms/link{est.link}/{direction}"] = value
        if self.partitioner is not None:
            out.update(self.partitioner.metrics())
        return out


def host_gaps_ms(profiles: Sequence[StepProfile]) -> list[float]:
    """Per rank (profiles ordered by rank), the host's time per op in one step that was neither an
    op nor a wait for a message: the step's span less its ops, its receive waits (their union)
    and its blocked sends, over its op count (>= 0; 0 for a rank without ops)."""
    out = []
    for prof in profiles:
        ops = sum(n for _, n in prof.compute.values())
        spans = sorted(
            (m.t2, m.t3)
            for m in prof.messages
            if m.side == "recv" and m.path != PROBE_PATH and math.isfinite(m.t2) and math.isfinite(m.t3)
        )
        waited, until = 0.0, -math.inf
        for lo, hi in spans:  # the union of the waits
            lo = max(lo, until)
            if hi > lo:
                waited += hi - lo
                until = hi
        free = prof.end_ms - prof.start_ms - prof.busy_ms - waited - prof.blocked_ms
        out.append(max(0.0, free / ops) if ops else 0.0)
    return out
