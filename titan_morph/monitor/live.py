"""The live monitor: profile each step, decide on all ranks, re-plan and re-route at the boundary.

After every step of a :class:`~titan_morph.pipelining.schedule.MorphSchedule` each stage packs its
profile (:mod:`.profile`), the stages all-gather the rows over a CPU (gloo) group — one small
collective, no external service — and every rank runs the same :class:`~.detect.Detector` on the
same data. On a decision every rank builds the same plan (:mod:`.replan`), installs it with
``set_plan`` (which all-gathers the plan id as a check) and, with ``[morph] transport = "auto"``,
moves the slow links to the delegates (back on recovery). All of it happens before the next step
starts: the iteration boundary of §6.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from titan_morph.monitor.clock import ClockOffsets, estimate_offsets
from titan_morph.monitor.delays import LinkEstimate, estimate_links
from titan_morph.monitor.detect import Decision, Detector, DetectRule
from titan_morph.monitor.profile import MessageStamp, StepProfile, decode, encode, row_width
from titan_morph.monitor.replan import StageTimes, adapted_plan
from titan_morph.pipelining.model import Plan
from titan_morph.pipelining.slackness import tolerance_ms

__all__ = ["AdaptPolicy", "LiveMonitor", "cpu_group"]

logger = logging.getLogger(__name__)
NAN = float("nan")


@dataclass(frozen=True)
class AdaptPolicy:
    """What a decision may change (from ``[morph]``)."""

    enabled: bool = True  # re-plan (PipeMorph with ``adapt = true``); False = measure and report only
    memory: int | None = None  # cap on in-flight microbatches of adapted plans (None = none, §4.2)
    search: bool = False
    search_budget_ms: float = 200.0
    depth: int | None = None  # link-queue depth adapted plans are evaluated with (None = delegated)
    delegate_slow_links: bool = False  # ``auto`` transport: slow links go to the delegates


def cpu_group(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """``group`` itself when it runs on gloo, else a gloo group over the same ranks (members only)."""
    if dist.get_backend(group) == "gloo":
        return group
    ranks = dist.get_process_group_ranks(group)
    return dist.new_group(ranks=ranks, backend="gloo", use_local_synchronization=True)


@dataclass
class Change:
    """A plan change made by the monitor (for logs, TensorBoard and tests)."""

    step: int
    decision: Decision
    plan: Plan
    delegated: tuple[int, ...]
    replan_ms: float


class LiveMonitor:
    """Per-step profile exchange, detection and adaptation for one pipeline stage.

    Construct it on every rank of the pipeline at the same point (it estimates clock offsets,
    a collective), then call :meth:`after_step` after every schedule step on every rank.
    """

    def __init__(
        self,
        *,
        stage: int,
        num_stages: int,
        microbatches: int,
        group: dist.ProcessGroup,
        initial_plan: Plan,
        fallback_times: tuple[tuple[float, float, float], ...],
        rule: DetectRule | None = None,
        policy: AdaptPolicy | None = None,
        clock_rounds: int = 8,
    ) -> None:
        self.stage, self.num_stages, self.microbatches = stage, num_stages, microbatches
        self.group = cpu_group(group)
        self.offsets: ClockOffsets = estimate_offsets(self.group, clock_rounds)
        self.offset_ms = self.offsets.offset_ms[dist.get_rank(self.group)]
        base = torch.tensor([time.monotonic()], dtype=torch.float64)
        dist.broadcast(base, group=self.group, group_src=0)  # rank 0's clock: t = 0 of the common clock
        self.base_s = float(base.item()) + self.offset_ms / 1e3  # the same instant on this rank's clock
        self.initial_plan = initial_plan
        self.detector = Detector(num_stages - 1, rule)
        self.policy = policy or AdaptPolicy()
        self.times = StageTimes(num_stages, fallback_times)
        self.width = row_width(microbatches)
        self.profiles: list[StepProfile] = []
        self.estimates: list[LinkEstimate] = []
        self.changes: list[Change] = []
        self.monitor_ms = 0.0
        self.step = 0
        self._image_for: str | None = None  # plan id whose timeline was last rendered
        self._render: tuple[Any, dict[str, Any]] | None = None  # (thread, result) of a timeline in progress

    # ------------------------------------------------------------------ profile
    def _common_ms(self, monotonic_s: float) -> float:
        return (monotonic_s - self.base_s) * 1e3

    def profile(self, record: Any, epoch: float | None) -> StepProfile:
        """This stage's :class:`StepProfile` of ``record`` (a ``StepRecord``)."""
        counts = Counter(kind for kind, *_ in record.op_ms)
        compute = {kind: (total, counts[kind]) for kind, total in record.compute_ms.items()}
        prof = StepProfile(
            self.stage, record.step, self._common_ms(record.start_s), self._common_ms(record.end_s), compute
        )
        if epoch is None:
            return prof

        def common(ms: float | None) -> float:
            return NAN if ms is None else self._common_ms(epoch + ms / 1e3)

        for msg in record.messages:
            if getattr(msg, "status", "done") in ("down", "error"):  # refused or failed: no delivery to time
                continue
            path = getattr(msg, "path", "") or ""
            if msg.side == "send":
                accepted = msg.accepted if msg.accepted is not None else msg.issued
                stamp = MessageStamp("send", path, msg.link, msg.direction, msg.seq, common(accepted))
            else:
                waited = record.waits.get((path, msg.link, msg.direction, msg.seq))
                stamp = MessageStamp(
                    "recv",
                    path,
                    msg.link,
                    msg.direction,
                    msg.seq,
                    common(getattr(msg, "arrived", None)),
                    NAN if waited is None else self._common_ms(waited),
                    common(msg.completed),
                )
            prof.messages.append(stamp)
        return prof

    def exchange(self, prof: StepProfile) -> list[StepProfile]:
        """All stages' profiles of this step (one all-gather of fixed-size float64 rows)."""
        prof.sent_ms = self._common_ms(time.monotonic())
        mine = torch.tensor(encode(prof, self.microbatches), dtype=torch.float64)
        if prof.dropped:
            logger.warning(
                "titan_morph: stage %d step %d: %d message stamps did not fit the monitor's row",
                prof.stage,
                self.step,
                prof.dropped,
            )
        rows = [torch.empty(self.width, dtype=torch.float64) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(rows, mine, group=self.group)
        return sorted((decode(r.tolist()) for r in rows), key=lambda p: p.stage)

    # ------------------------------------------------------------------ decide
    def tolerances(self, *plans: Plan) -> list[list[float]]:
        """Eq. 1 tolerance of every link under each of ``plans``, with the measured stage times."""
        model = self.times.model(self.microbatches)
        return [[tolerance_ms(model, plan.warmup, link) for link in range(self.num_stages - 1)] for plan in plans]

    def after_step(self, schedule: Any, record: Any) -> Change | None:
        """Exchange, detect and (if a decision) apply the new plan before the next step."""
        t0 = time.monotonic()
        self.step = record.step + 1  # TorchTitan counts steps from 1
        epoch = getattr(schedule.transport, "epoch", None)
        prof = self.profile(record, epoch)
        t_sent = time.monotonic()
        self.profiles = self.exchange(prof)
        t_gathered = time.monotonic()
        # Waiting for the last stage to finish its step is not the monitor's cost (TorchTitan's
        # grad-norm all-reduce waits for it anyway): count the exchange from the last arrival.
        last_in = max(p.sent_ms for p in self.profiles)
        exchange_ms = max(0.0, self._common_ms(t_gathered) - max(last_in, self._common_ms(t_sent)))
        self.times.add(self.profiles)
        self.estimates = estimate_links(self.profiles, self.num_stages)
        decision = self.detector.update(self.step, self.estimates, *self.tolerances(schedule.plan, self.initial_plan))
        change = None
        if decision is not None and self.policy.enabled:
            change = self._apply(schedule, decision)
        elif decision is not None:
            logger.warning("titan_morph: step %d: %s (adaptation off)", self.step, "; ".join(decision.reasons))
        self.monitor_ms = (t_sent - t0 + time.monotonic() - t_gathered) * 1e3 + exchange_ms
        return change

    def _apply(self, schedule: Any, decision: Decision) -> Change:
        t0 = time.monotonic()
        if decision.all_healthy:
            plan = self.initial_plan
        else:
            model = self.times.model(self.microbatches, decision.delays_ms, self.policy.memory)
            plan = adapted_plan(
                model, search=self.policy.search, depth=self.policy.depth, budget_ms=self.policy.search_budget_ms
            )
        replan_ms = (time.monotonic() - t0) * 1e3
        if plan.orders == schedule.plan.orders:  # e.g. warm-ups already capped at N: nothing to re-deploy
            plan = schedule.plan
        else:
            schedule.set_plan(plan)
        transport = schedule.transport
        if self.policy.delegate_slow_links:
            if decision.newly_slow and callable(getattr(transport, "switch", None)):
                transport.switch(decision.newly_slow)
            if decision.recovered and callable(getattr(transport, "restore", None)):
                transport.restore(decision.recovered)
        delegated = self.delegated_links(transport)
        logger.warning(
            "titan_morph: step %d: %s -> plan %s x=%s (planned delays %s ms, measured F,B,W %s ms, %.0f ms to plan), "
            "delegated links %s",
            self.step,
            "; ".join(decision.reasons),
            plan.plan_id,
            list(plan.warmup),
            [round(d, 1) for d in decision.delays_ms],
            [list(t) for t in self.times.times()],
            replan_ms,
            list(delegated),
        )
        change = Change(self.step, decision, plan, delegated, replan_ms)
        self.changes.append(change)
        return change

    def delegated_links(self, transport: Any) -> tuple[int, ...]:
        links = range(self.num_stages - 1)
        if getattr(transport, "name", "") == "delegate":
            return tuple(links)
        routed = getattr(transport, "delegated", None) or set()
        return tuple(link for link in links if any(k[0] == link for k in routed))

    # ------------------------------------------------------------------ report
    def metrics(self, schedule: Any) -> dict[str, float]:
        """TensorBoard scalars of the last step (identical on every rank)."""
        out: dict[str, float] = {"morph/monitor_ms": self.monitor_ms, "morph/decisions": float(len(self.changes))}
        if self.profiles and len(self.profiles) == self.num_stages:
            start = min(p.start_ms for p in self.profiles)
            span = max(p.end_ms for p in self.profiles) - start
            if span > 0:
                busy = sum(p.busy_ms for p in self.profiles)
                out["morph/measured_makespan_ms"] = span
                out["morph/bubble_rate"] = max(0.0, 1.0 - busy / (self.num_stages * span))
        delegated = set(self.delegated_links(schedule.transport))
        for link, state in enumerate(self.detector.links):
            out[f"morph/straggling/link{link}"] = float(state.slow)
            out[f"morph/planned_delay_ms/link{link}"] = state.planned_ms
            out[f"morph/delegated/link{link}"] = float(link in delegated)
        for est in self.estimates:
            value = est.upper_ms
            if value is not None and math.isfinite(value):
                out[f"morph/delay_ms/link{est.link}"] = value
        return out

    def timeline_image(self, plan: Plan) -> Any | None:
        """An RGB array of the active plan's simulated timeline after a plan change, else None.

        Rendering takes ~1 s of matplotlib, far too long to spend between two steps on the logging
        rank (it would stall the whole pipeline), so it runs in a background thread; the image is
        returned by the first call after it is ready (and logged at that step).
        """
        import threading

        job = self._render
        if job is not None and not job[0].is_alive():
            self._render = None
            return job[1].get("img")
        if job is None and self.changes and self._image_for != plan.plan_id:
            self._image_for = plan.plan_id
            out: dict[str, Any] = {}
            title = f"step {self.changes[-1].step}: plan {plan.plan_id} x={list(plan.warmup)}"
            thread = threading.Thread(
                target=_render_timeline, args=(plan, title, out), name="titan_morph-timeline", daemon=True
            )
            thread.start()
            self._render = (thread, out)
        return None


def _render_timeline(plan: Plan, title: str, out: dict[str, Any]) -> None:
    try:
        import tempfile

        import matplotlib.image

        from titan_morph.pipelining.export import timeline_png
        from titan_morph.pipelining.simulate import simulate

        with tempfile.TemporaryDirectory(prefix="titan_morph_tl") as tmp:
            path = timeline_png(simulate(plan.model, plan.orders), f"{tmp}/plan.png", title, dpi=80)
            out["img"] = matplotlib.image.imread(str(path))[..., :3]
    except Exception as err:  # a picture must never break training
        logger.warning("titan_morph: could not render the plan timeline: %s", err)
