"""Run titan_morph plans in torch's pipeline runtime, re-plannable between steps.

``MorphSchedule`` is a ``_PipelineScheduleRuntime`` (the ``PipelineScheduleMulti`` family) with
one stage per rank, or two in a V (rank r runs stages r and 2R-1-r, as torch's ZB-V and DualPipeV
place them). It takes a :class:`~titan_morph.pipelining.core.model.Plan` (per-rank F/I/W orders from the
generator, Alg. 3/4), lowers it with torch's own passes (``_prepare_schedule_with_comms``, which
also validates it and derives the stage-to-rank mapping), and routes every pipeline send/recv of a
step through a transport (:mod:`titan_morph.comm`), which names traffic by the physical link
between adjacent ranks: in the V both legs share those links.

After every step the ranks run the one per-step exchange (:mod:`.exchange`): it checks that they
ran the same plan, feeds the monitor (:class:`~titan_morph.monitor.adapt.Monitor`, whose decision
is the same on every rank) and gives every rank the figures of all stages. A plan change (the
monitor's, or :meth:`MorphSchedule.set_plan` called on every rank) takes effect at the next step:
the iteration boundary of §6.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from titan_morph.comm.clock import sync_clock
from titan_morph.comm.recorded import probe_train
from titan_morph.comm.scope import use_transport
from titan_morph.comm.transport import Handle, RateProbeable, TorchTransport, Transport
from titan_morph.monitor.adapt import Change, Monitor
from titan_morph.monitor.attribution import Attribution, Measured, StragglerCosts
from titan_morph.monitor.profile import PROBE_PATH, MessageStamp, StepProfile
from titan_morph.pipelining.core.model import Plan, validate_orders
from titan_morph.pipelining.timing.simulate import simulate
from titan_morph.runtime.actions import to_actions
from titan_morph.runtime.exchange import PlanMismatchError, StepExchange, probe_stamps, step_profile
from titan_morph.runtime.metrics import (
    MetricsSource,
    TimelineRenderer,
    bound_ms,
    pipeline_metrics,
    pipeline_ms,
    predicted_ms,
    record_metrics,
)
from titan_morph.runtime.optime import CLOCK_CODES, OpSpan, OpTimer
from titan_morph.runtime.optime import op_timer as make_op_timer
from titan_morph.runtime.records import StepRecord
from titan_morph.runtime.replicas import ReplicaSplit
from titan_morph.runtime.stage_hooks import wrap_ops
from titan_morph.runtime.summary import StepHistory, StepPoint
from titan_morph.runtime.testbed import DeviceClock

__all__ = ["MorphSchedule", "PlanMismatchError"]

logger = logging.getLogger(__name__)

RECORDS_KEPT = 4  # per-step records a schedule holds (the newest)
SETTLE_S = 60.0  # how long a step's end waits for the device to run its ops, without an exchange's [comm] bound

_PRE_SPLIT = {"arg_mbs", "kwarg_mbs", "target_mbs"}
_STEP_OPTIONS = ("losses", "return_outputs", "loss_kwargs", *sorted(_PRE_SPLIT))
_TIMED_METHODS = {"forward_one_chunk": "F", "backward_one_chunk": "B", "backward_weight_one_chunk": "W"}


class _TimedSends:
    """The step's P2P entry point: times how late each send leaves after the op that produced it
    and, on the testbed, tells the transport when that op ended on the device."""

    def __init__(self, schedule: MorphSchedule) -> None:
        self.schedule = schedule

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        sched = self.schedule
        produced, record = sched._produced_at, sched._current
        if produced is not None and record is not None and any(op.op is dist.isend for op in ops):
            record.send_late_ms.append((time.monotonic() - produced) * 1e3)
            if sched.device_clock is not None:
                # the send leaves when the producing op ends on the device (as a send queued behind
                # a GPU kernel does), within the clock's host-gap bound
                sched.transport.hint_issue(produced, sched.device_clock.hide_s * 1e3)
            sched._produced_at = None
        return sched.transport.batch_p2p(ops, desc)


class MorphSchedule(_PipelineScheduleRuntime):
    """Per-rank orders from ``titan_morph.pipelining`` in torch's runtime (one or two stages per rank).

    Args:
        stages: this rank's ``PipelineStage``s: one (stage index = pp rank), or the two of the V
            (stages r and 2R-1-r on pp rank r) when the plan places two per rank.
        n_microbatches: N; must equal ``plan.model.microbatches``.
        loss_fn: as for any torch schedule.
        plan: the initial plan (same on every rank).
        transport: the transport of every send/recv of a step (None: torch.distributed, on the
            pipeline's common clock).
        scale_grads: as for torch schedules (TorchTitan passes ``False``).
        planned_depth: link-queue depth the plan's makespan is predicted with (the transport's
            model: ``link_queue_depth`` for the blocking default transport, None = non-blocking).
        predict: also report the simulator's prediction of each step under the transport's
            actual link model (meaningful when the plan's stage times are the real ones).
        monitor: detection and re-planning, fed by the per-step exchange (None: measure only).
        device_clock: the testbed's clock of this stage, when its ops are padded (op times are then
            device times, as CUDA events would measure them).
        op_timer: the clock of the op times (:mod:`.optime`; None: the testbed's device clock when
            given, CUDA events on a GPU stage, else host times).
        exchange: the per-step exchange (None: a :class:`StepExchange` over the pipeline's ranks;
            DP x PP passes one over the whole world, :class:`~titan_morph.runtime.hybrid.HybridExchange`).
        summary_window: the injected straggler's first and last step, which the end-of-run summary's
            phases follow (None: the steps the monitor holds a link slow; :class:`StepHistory`).
        replicas: DP x PP with microbatches moved between replicas (:mod:`.replicas`): this replica's
            count follows it from step to step, its plan re-made by the monitor (None: N stays).
        max_microbatches: the most microbatches a step may run here (the stages' per-microbatch
            buffers are made for that many; None: ``n_microbatches``).
        profiles_file: where pipeline rank 0 (with TP, its first lane) appends each step's exchanged
            profiles (JSON lines; "": nowhere).
    """

    def __init__(
        self,
        stages: list[Any],
        n_microbatches: int,
        loss_fn: Callable[..., torch.Tensor] | None = None,
        *,
        plan: Plan,
        transport: Transport | None = None,
        scale_grads: bool = True,
        planned_depth: int | None = None,
        predict: bool = False,
        monitor: Monitor | None = None,
        device_clock: DeviceClock | None = None,
        exchange: StepExchange | None = None,
        op_timer: OpTimer | None = None,
        summary_window: tuple[int, int] | None = None,
        replicas: ReplicaSplit | None = None,
        max_microbatches: int | None = None,
        profiles_file: str = "",
        **kwargs: Any,
    ) -> None:
        per_rank = plan.model.stages_per_rank
        if len(stages) != per_rank:
            raise ValueError(
                f"MorphSchedule: the plan places {per_rank} stage(s) per rank, got {len(stages)} stages on this rank"
            )
        # torch's _PipelineScheduleRuntime.__init__(*args, **kwargs) carries no annotations
        super().__init__(stages, n_microbatches, loss_fn=loss_fn, scale_grads=scale_grads, **kwargs)  # type: ignore[no-untyped-call]
        if self._num_stages != self.pp_group_size * per_rank:
            raise ValueError(
                f"MorphSchedule needs {per_rank} stage(s) per pipeline rank, got {self._num_stages} stages"
                f" on {self.pp_group_size} ranks"
            )
        stage = stages[0]
        mine = sorted(st.stage_index for st in stages)
        if mine != sorted(plan.model.rank_stages(stage.group_rank)):
            raise ValueError(
                f"MorphSchedule: pp rank {stage.group_rank} holds stages {mine}, but the plan places"
                f" {list(plan.model.rank_stages(stage.group_rank))} there"
                + (" (the V: stages r and 2R-1-r on rank r)" if per_rank > 1 else "")
            )
        group = stage.group if stage.group is not None else dist.group.WORLD
        distributed = dist.is_initialized() and self.pp_group_size > 1
        if transport is None:
            transport = TorchTransport(sync_clock(group).epoch if distributed else None)
        self.transport: Transport = transport
        self.monitor = monitor
        self.replicas = replicas
        self.max_microbatches = max(max_microbatches or n_microbatches, n_microbatches)
        self.device_clock = device_clock
        self.op_timer: OpTimer = op_timer if op_timer is not None else make_op_timer(device_clock, stage.device)
        self._per_stage = per_rank > 1
        self.plan: Plan = plan
        self.planned_depth = planned_depth
        self.predict = predict
        self.planned_makespan_ms: float | None = None
        self.planned_bubble_rate = 0.0
        self.plan_changes = 0
        # the last steps' records: each holds every op and message of its step (kilobytes), so a
        # long run keeps only a few (their figures are in TensorBoard and the history below)
        self.records: deque[StepRecord] = deque(maxlen=RECORDS_KEPT)
        self.profiles: list[StepProfile] = []  # every stage's view of the last step (the exchange)
        self.history = StepHistory(summary_window)  # every step, by phase, for the end-of-run summary
        self.monitor_ms = 0.0  # the exchange and the monitor's work after the last step
        self._steps = 0
        self._current: StepRecord | None = None
        self._blocked_seen: dict[int, float] = {}
        self._produced_at: float | None = None
        self._planned_ops: Counter[tuple[int, str, int]] = Counter()  # this rank's ops in a step of the plan
        self._ran_ops: Counter[tuple[int, str, int]] = Counter()  # and those the step ran
        self._stage_index = stage.group_rank  # this rank's row in the exchange
        self._is_last = any(st.is_last for st in stages)  # in the V the last stage runs on rank 0
        if exchange is None and distributed:
            if group is None:  # torch types WORLD as optional: it is None before init_process_group
                raise RuntimeError("MorphSchedule: torch.distributed has no default process group")
            exchange = StepExchange(group, self.max_microbatches, per_rank)
        self._exchange = exchange
        self._group = group
        self._profiles_file = profiles_file
        self._rate_probes: list[MessageStamp] = []  # this rank's side of the last rate probes
        self._timeline = TimelineRenderer()
        # what each straggler costs: measured on the logging (last) stage only, simulated after the
        # step's grad-norm all-reduce, in the slack before the last stage's first input arrives
        self.attribution: StragglerCosts | None = None
        if monitor is not None and self._is_last:
            profiled = max(monitor.profile_steps, 2)
            self.attribution = StragglerCosts(
                self._num_stages, monitor.detector.rule, profile_steps=profiled, stages_per_rank=per_rank
            )
        self.last_attribution: Attribution | None = None
        self.last_charged: dict[str, float] = {}  # the costs of the last attribution's step above the noise
        self._costs_due: tuple[Measured, Plan, int | None, float | None] | None = None
        for st in stages:
            self._instrument(st, per_stage=per_rank > 1)
        self.set_plan(plan)

    # ----------------------------------------------------------------- plans
    def set_plan(self, plan: Plan, *, check: bool = True) -> None:
        """Install ``plan`` for the following steps; call it between steps on every rank.

        With ``check`` (default), all ranks of the pipeline exchange the plan id now and a
        :class:`PlanMismatchError` is raised everywhere if they differ. Without it the next per-step
        exchange still checks which plan every stage ran.
        """
        model = plan.model
        if (
            model.stages != self._num_stages
            or model.microbatches != self._n_microbatches
            or model.ranks != self.pp_group_size
        ):
            raise ValueError(
                f"plan is for S={model.stages} stages on {model.ranks} ranks, N={model.microbatches}; this"
                f" schedule runs S={self._num_stages} on {self.pp_group_size} ranks, N={self._n_microbatches}"
            )
        # Before anything runs: every op of every stage once, in an order torch's runtime executes
        # correctly (ValueError), and orders the ranks can complete together (DeadlockError).
        validate_orders(model, plan.orders)
        planned = simulate(model, plan.orders, depth=self.planned_depth)
        if check and self._exchange is not None:
            self._exchange.agree(plan.plan_id)
        actions = to_actions(plan)
        self.pipeline_order = {rank: list(acts) for rank, acts in actions.items()}
        self._prepare_schedule_with_comms({rank: list(acts) for rank, acts in actions.items()})
        me = self.rank
        self._planned_ops = Counter((me if op.stage is None else op.stage, op.kind, op.mb) for op in plan.orders[me])
        self.planned_makespan_ms, self.planned_bubble_rate = planned.makespan, planned.mean_bubble_rate
        previous, self.plan = self.plan, plan
        if previous is not plan and previous.plan_id != plan.plan_id:
            self.plan_changes += 1
            logger.info("pipeline plan %s -> %s (x=%s)", previous.plan_id, plan.plan_id, list(plan.warmup))

    def set_microbatches(self, n: int, plan: Plan) -> None:
        """Run ``n`` microbatches per step from the next step on, with ``plan`` (made for ``n``): this
        DP replica's share of the global batch changed. Call it between steps on every rank of the
        pipeline; the next per-step exchange checks that they run one plan."""
        if not 1 <= n <= self.max_microbatches:
            raise ValueError(f"{n} microbatches: this schedule runs 1..{self.max_microbatches}")
        previous, self._n_microbatches = self._n_microbatches, n
        try:
            self.set_plan(plan, check=False)
        except Exception:
            self._n_microbatches = previous
            raise

    def step(self, *args: Any, target: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """torch's step on the whole local batch; with DP replicas of uneven counts, first this
        replica's share of the global batch (:meth:`ReplicaSplit.reshare`, a collective per stage)."""
        if self.replicas is not None:
            own: dict[str, Any] = {k: kwargs.pop(k) for k in _STEP_OPTIONS if k in kwargs}
            if own.keys() & _PRE_SPLIT:  # torch's pre-split form (TorchTitan 0.3.0)
                own = self.replicas.reshare_split(own)
            else:
                args, kwargs, target = self.replicas.reshare(args, kwargs, target)
            kwargs.update(own)  # the schedule's own options, not model inputs
        return super().step(*args, target=target, **kwargs)

    def _initialize_stages(self, *args: Any, **kwargs: Any) -> Any:
        """torch's set-up of the stages at the first step, their per-microbatch receive buffers made
        for :attr:`max_microbatches` (the count may change between steps; :meth:`set_microbatches`)."""
        n, self._n_microbatches = self._n_microbatches, self.max_microbatches
        try:
            return super()._initialize_stages(*args, **kwargs)
        finally:
            self._n_microbatches = n

    @property
    def is_last_stage(self) -> bool:
        """Whether this rank runs the last stage (the one TorchTitan logs the loss from; rank 0 in the V)."""
        return self._is_last

    @property
    def exchange(self) -> StepExchange | None:
        """The per-step exchange (None on a single rank)."""
        return self._exchange

    def set_step(self, step: int) -> None:
        """The next ``step()`` is training step ``step`` (TorchTitan's count, from 1). A run resumed
        from a checkpoint calls it so that step-keyed injection windows and records keep counting."""
        self._steps = step - 1

    # ------------------------------------------------------------- figures
    def tensorboard_metrics(self, step: int) -> dict[str, float]:
        """Scalars about the last step for TorchTitan's metrics processor (the README lists them)."""
        if not self.records:
            return {}
        rec = self.records[-1]
        out = record_metrics(rec, self.plan, self.plan_changes, self.planned_bubble_rate)
        out.update(pipeline_metrics(self.profiles, self.pp_group_size))
        out["morph/monitor_ms"] = self.monitor_ms
        out["morph/op_clock"] = CLOCK_CODES[self.op_timer.clock]
        if isinstance(self._exchange, MetricsSource):  # e.g. the DP x PP exchange's topology figures
            out.update(self._exchange.tensorboard_metrics(step))
        if self.monitor is not None:
            out.update(self.monitor.metrics(self.transport.delegated()))
        self.settle_costs()
        att = self.last_attribution
        if att is not None and att.step == rec.step + 1:  # the costs charged (above the noise), 0 for the others
            out.update({f"morph/straggler_cost_ms/{cause}": self.last_charged.get(cause, 0.0) for cause in att.costs})
            out["morph/attribution_ms"] = att.took_ms
        if self.monitor is not None and self._is_last and self.transport.links is None and self.profiles:
            # the real links as the monitor measured them: the running plan simulated on them, and
            # the least any schedule could take there
            modelled = self.monitor.modelled_ms(self.plan, self._predicted_depth())
            if modelled is not None:
                out["morph/modelled_ms"] = modelled
            bound = bound_ms(self.plan, self.monitor.floor_links(), rec.step + 1, self.profiles[0].start_ms)
            if bound is not None:
                out["morph/bound_ms"] = bound
        if self.predict and self._is_last and self.profiles:
            predicted = predicted_ms(
                self.plan, self.transport.links, self._predicted_depth(), rec.step + 1, self.profiles[0].start_ms
            )
            if predicted is not None:
                out["morph/predicted_ms"] = predicted
            bound = bound_ms(self.plan, self.transport.links, rec.step + 1, self.profiles[0].start_ms)
            if bound is not None:
                out.setdefault("morph/bound_ms", bound)  # real links: the measured ones' bound (above)
        return out

    def _predicted_depth(self) -> int | None:
        if self.transport.links is None:
            return self.planned_depth
        if self.transport.delegated():  # slow links run on the non-blocking delegates
            return None
        return self.transport.depth

    def settle_costs(self) -> None:
        """Simulate the last step's straggler costs if still due (:mod:`titan_morph.monitor.attribution`)
        and file them in :attr:`history`. Called where the last stage has time: before its next step,
        when its figures are logged, before the run summary."""
        due, self._costs_due = self._costs_due, None
        if due is None or self.attribution is None:
            return
        measured, plan, depth, step_ms = due
        n = plan.model.microbatches
        initial = self.monitor.initial_plan if self.monitor is not None else None  # the plan when nothing is slow
        orders = initial.orders if initial is not None and initial.model.microbatches == n else None
        att = self.attribution.attribute(measured, plan.orders, n, depth=depth, initial=orders)
        if att is None:
            return
        self.last_attribution = att
        step_ms = step_ms if step_ms is not None else att.makespan_ms
        assert self.monitor is not None  # the attribution runs only with a monitor
        held = {f"link{link}" for link in self.monitor.detector.slow_links}
        charged = self.attribution.gate.admit(att, step_ms, held)
        self.last_charged = {cause: ms for step, cause, ms, _ in charged if step == att.step}
        for step, cause, ms, total in charged:
            self.history.costs.add(step, {cause: ms}, total)

    def close(self, timeout_s: float) -> None:
        """End the schedule's background work (the plan timeline being drawn), within ``timeout_s``."""
        self._timeline.close(timeout_s)

    def tensorboard_images(self, step: int) -> dict[str, Any]:
        """``morph/plan_timeline``: the active plan's simulated timeline (HWC RGB), after a plan change."""
        if self.monitor is None or self.monitor.last_change is None or not self._is_last:
            return {}
        title = f"step {self.monitor.last_change.step}: plan {self.plan.plan_id} x={list(self.plan.warmup)}"
        img = self._timeline.image(self.plan, title)
        return {} if img is None else {"morph/plan_timeline": img}

    # --------------------------------------------------------------- timing
    def _instrument(self, stage: Any, *, per_stage: bool = False) -> None:
        """Time one of this rank's stages' compute calls on the op clock (per-op records; ``per_stage``:
        also per stage, for a rank that runs several)."""
        timer = self.op_timer

        def wrap(name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
            kind = _TIMED_METHODS[name]

            def timed(mb_index: int, *args: Any, **kwargs: Any) -> Any:
                rec = self._current
                if rec is None:
                    return inner(mb_index, *args, **kwargs)
                token = timer.begin()
                out = inner(mb_index, *args, **kwargs)
                op_kind = kind
                if name == "backward_one_chunk" and not kwargs.get("full_backward", True):
                    op_kind = "I"
                self._ran_ops[(stage.stage_index, op_kind, mb_index)] += 1
                span = timer.end(token, op_kind, mb_index, stage.stage_index)
                if span is not None:
                    self._add_span(rec, span)
                # a send leaves after its producing op: its device end where known now, else the launch
                self._produced_at = span.end_s if span is not None else time.monotonic()
                return out

            return timed

        wrap_ops(stage, "timing", wrap, "timed by a MorphSchedule")

    def _add_span(self, rec: StepRecord, span: OpSpan) -> None:
        took = span.ms
        rec.compute_ms[span.kind] = rec.compute_ms.get(span.kind, 0.0) + took
        rec.op_ms.append((span.kind, span.mb, span.start_s, span.end_s))
        if self._per_stage:
            kinds = rec.stage_compute.setdefault(span.stage, {})
            total, count = kinds.get(span.kind, (0.0, 0))
            kinds[span.kind] = (total + took, count + 1)

    def _step_microbatches(self, *args: Any, **kwargs: Any) -> Any:
        self.settle_costs()
        record = StepRecord(self._steps, self.plan.plan_id, 0.0, self.planned_makespan_ms)
        self.transport.set_step(self._steps + 1)  # TorchTitan counts steps from 1
        self._current = record
        record.op_clock = self.op_timer.clock
        self.op_timer.start_step()
        self._ran_ops.clear()
        start = time.monotonic()
        try:
            with use_transport(_TimedSends(self)):
                out = super()._step_microbatches(*args, **kwargs)
        finally:
            self._current = None
        end = time.monotonic()
        self._check_ran(record.step + 1)
        bound = self._exchange.timeouts.for_step(record.step + 1) if self._exchange is not None else SETTLE_S
        for span in self.op_timer.settle(bound):  # a device clock's spans (CUDA: once the device ran the step)
            self._add_span(record, span)
        record.start_s = start
        record.iteration_ms = (end - start) * 1e3
        record.op_ms = [(k, mb, (s - start) * 1e3, (e - start) * 1e3) for k, mb, s, e in record.op_ms]
        record.blocked_ms = self._blocked_delta()
        record.failovers = self.transport.failovers
        record.messages = self.transport.take_records()
        self.records.append(record)
        self._steps += 1
        if self._exchange is not None:  # exchange, check, detect, maybe re-plan: before the next step
            self._after_step(record)
        record.messages = []  # consumed: keep the step records small
        return out

    def _check_ran(self, step: int) -> None:
        """Stop the step, before its gradients are used, unless this rank ran exactly the ops of the
        plan: each F, I/B and W of its stages once per microbatch."""
        ran, planned = self._ran_ops, self._planned_ops
        if ran == planned:
            return
        wrong = sorted(op for op in planned.keys() | ran.keys() if ran[op] != planned[op])
        stage, kind, mb = wrong[0]
        more = f" (and {len(wrong) - 1} more op(s) differ)" if len(wrong) > 1 else ""
        raise RuntimeError(
            f"titan_morph: pipeline rank {self.rank}, step {step}, plan {self.plan.plan_id}: stage {stage} ran"
            f" {stage}{kind}{mb} {ran[(stage, kind, mb)]} time(s), the plan {planned[(stage, kind, mb)]}{more}:"
            " the step's gradients are not those of the plan"
        )

    def _after_step(self, record: StepRecord) -> None:
        assert self._exchange is not None
        t0 = time.monotonic()
        epoch = self.transport.epoch
        prof = step_profile(record, self._stage_index, epoch)
        prof.messages += self._rate_probes  # the trains run after the last step (they describe its links)
        self._rate_probes = []
        t_sent = time.monotonic()
        prof.sent_ms = (t_sent - epoch) * 1e3
        self.profiles = self._exchange.gather(prof)
        t_gathered = time.monotonic()
        if self._profiles_file and dist.get_rank() == self._exchange.row_ranks[0]:  # stage 0 (its first lane)
            with open(self._profiles_file, "a") as out:
                out.write(json.dumps([dataclasses.asdict(p) for p in self.profiles]) + "\n")
        # Waiting for the last stage to finish its step is not this work's cost (TorchTitan's
        # grad-norm all-reduce waits for it anyway): count the exchange from the last arrival.
        last_in = max(p.sent_ms for p in self.profiles)
        exchange_ms = max(0.0, (t_gathered - epoch) * 1e3 - max(last_in, prof.sent_ms))
        ran, depth = self.plan, self._predicted_depth()  # before a change: what this step ran
        if self.monitor is not None:
            change = self.monitor.observe(record.step + 1, self.profiles, self.plan)
            if change is not None:
                self._apply(change)
        if self.replicas is not None and self.replicas.last is not None:
            self._rebalance(self.replicas)
        if self.monitor is not None:
            self._rate_probes = self._probe_rates(self.monitor.probes_due(), record.step)
        slow = self.monitor.detector.slow_links if self.monitor is not None else ()
        self.history.append(
            StepPoint(
                record.step + 1,
                pipeline_ms(self.profiles, self.pp_group_size),
                slow,
                tuple(sorted(self.transport.delegated())),
                record.plan_id,
                self.profiles[0].start_ms if self.profiles else 0.0,
            )
        )
        if self.attribution is not None and self.monitor is not None:
            measured = self.attribution.observe(
                record.step + 1, self.profiles, self.monitor.estimates, self.monitor.partitioner
            )
            if measured is not None:
                self._costs_due = (measured, ran, depth, pipeline_ms(self.profiles, self.pp_group_size))
        self.monitor_ms = (t_sent - t0 + time.monotonic() - t_gathered) * 1e3 + exchange_ms

    def _probe_rates(self, due: tuple[int, ...], step: int) -> list[MessageStamp]:
        """Run this rank's side of the rate probes the monitor asked for
        (:func:`~titan_morph.comm.recorded.probe_train`), links in order, each forward then backward,
        with messages of the link's median size this step; their stamps go into the next step's profile."""
        transport, exchange, me, group = self.transport, self._exchange, self._stage_index, self._group
        if not due or exchange is None or group is None or not isinstance(transport, RateProbeable):
            return []
        out: list[MessageStamp] = []
        for link in due:
            path = transport.rate_probe_path(link) if me in (link, link + 1) else None
            if path is None:
                continue
            for direction, sender in (("fwd", link), ("bwd", link + 1)):
                sizes = [
                    m.nbytes
                    for p in self.profiles
                    for m in p.messages
                    if m.link == link and m.direction == direction and m.nbytes > 0 and m.path != PROBE_PATH
                ]
                if not sizes:
                    continue
                peer = link + 1 if me == link else link
                times = probe_train(
                    path,
                    group,
                    link=link,
                    direction=direction,
                    peer=dist.get_global_rank(group, peer),
                    send=me == sender,
                    nbytes=int(statistics.median(sizes)),
                    timeout_s=exchange.timeouts.for_step(step + 1),
                    now_ms=transport.now_ms,
                )
                out += probe_stamps(times)
        return out

    def _apply(self, change: Change) -> None:
        """Install a monitor decision on this rank (every rank makes the same one)."""
        if change.plan.orders != self.plan.orders:  # else nothing to re-deploy
            self.set_plan(change.plan, check=False)  # the next exchange checks what every stage ran
        self.transport.switch(change.switch)
        self.transport.restore(change.restore)
        assert self.monitor is not None
        logger.warning(
            "titan_morph: %s",
            change.describe(self.plan, self.monitor.times.times(), sorted(self.transport.delegated())),
        )

    def _rebalance(self, replicas: ReplicaSplit) -> None:
        """Install a rebalance across DP replicas on this rank (every rank decided the same): this
        replica's new count, with the monitor's plan for it."""
        decision, k, n = replicas.last, replicas.replica, replicas.mine
        assert decision is not None
        tail = f"replica {k} keeps {n} microbatches"
        if n != self._n_microbatches:
            if self.monitor is None:
                raise RuntimeError("MorphSchedule: microbatch counts change only with a monitor")
            self.set_microbatches(n, self.monitor.resize(n))
            tail = f"replica {k} runs {n} microbatches: plan {self.plan.plan_id} x={list(self.plan.warmup)}"
        logger.warning("titan_morph: %s -> %s", decision.describe(), tail)

    def _blocked_delta(self) -> dict[int, float]:
        """Per-link ms this rank was blocked in sends during the step (the transport's totals, differenced)."""
        blocked = self.transport.blocked_ms()
        delta = {link: ms - self._blocked_seen.get(link, 0.0) for link, ms in blocked.items()}
        self._blocked_seen = dict(blocked)
        return delta
