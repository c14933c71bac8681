"""Run titan_morph plans in torch's pipeline runtime, re-plannable between steps.

``MorphSchedule`` is a ``_PipelineScheduleRuntime`` (the ``PipelineScheduleMulti`` family) with
one stage per rank. It takes a :class:`~titan_morph.pipelining.model.Plan` (per-rank F/I/W
orders from the generator, Alg. 3/4), lowers it with torch's own passes (``_add_send_recv``), and
routes every pipeline send/recv of a step through a pluggable transport
(``titan_morph.comm``). ``set_plan`` swaps the orders at an iteration boundary and checks that
every rank of the pipeline group installed the same plan (§6: the updated schedule is deployed
on the whole cluster before the next iteration).

This is the torch-facing end of the scheduler: the planning core stays torch-free.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from titan_morph.pipelining.model import Plan, validate_orders

logger = logging.getLogger(__name__)

_TIMED_METHODS = {"forward_one_chunk": "F", "backward_one_chunk": "B", "backward_weight_one_chunk": "W"}


@dataclass
class StepRecord:
    """What one ``step()`` did on this rank: the per-step record of the runtime."""

    step: int
    plan_id: str
    iteration_ms: float
    planned_makespan_ms: float | None
    compute_ms: dict[str, float] = field(default_factory=dict)  # per op kind (F, I, W, B)
    op_ms: list[tuple[str, int, float, float]] = field(default_factory=list)  # (kind, mb, start, end) ms
    start_s: float = 0.0  # time.monotonic() when the step began on this rank
    blocked_ms: dict[int, float] = field(default_factory=dict)  # per link: this rank blocked in sends (step)
    # Emulated messages of the step (ms since the link epoch), keyed "link/direction/seq":
    # sends -> planned delivery; receives -> (this rank began waiting for it, data observed).
    sent: dict[str, float] = field(default_factory=dict)
    received: dict[str, tuple[float, float]] = field(default_factory=dict)
    # Per send: ms from the producing op's end (its device end on the testbed) to the send's issue.
    send_late_ms: list[float] = field(default_factory=list)
    failovers: int = 0  # links this rank has moved to the delegated path so far (``auto`` transport)
    # The transport's raw MessageRecords of the step and, per (path, link, direction, seq), when the
    # training thread began waiting for a receive (time.monotonic()): the monitor's inputs.
    messages: list[Any] = field(default_factory=list)
    waits: dict[tuple[str, int, str, int], float] = field(default_factory=dict)

    @property
    def busy_ms(self) -> float:
        return sum(self.compute_ms.values())

    @property
    def idle_ms(self) -> float:
        """Time this stage was not computing during the step (bubbles + blocking + comm waits)."""
        return max(0.0, self.iteration_ms - self.busy_ms)

    @property
    def end_s(self) -> float:
        return self.start_s + self.iteration_ms / 1e3

    def summary(self) -> dict[str, float]:
        """What this stage publishes to the logging (last) stage each step."""
        return {
            "step": float(self.step),
            "start_s": self.start_s,
            "end_s": self.end_s,
            "iteration_ms": self.iteration_ms,
            "idle_ms": self.idle_ms,
            "blocked_ms": sum(self.blocked_ms.values()),
            "sent": self.sent,
            "received": self.received,
            "send_late_ms": sum(self.send_late_ms),
            "sends": float(len(self.send_late_ms)),
            "failovers": float(self.failovers),
        }


def message_latencies(summaries: Iterable[dict[str, Any]]) -> dict[int, list[float]]:
    """Host latency of emulated messages per link: observed arrival − the link model's delivery time.

    Counted only for messages whose receiver was already waiting when they were due, so a busy
    receiver does not count as latency.
    This is what the CPU emulation adds to every message (gloo over TCP, thread wake-ups); the
    link model and the simulator assume 0.
    """
    sent: dict[str, float] = {}
    received: dict[str, tuple[float, float]] = {}
    for summ in summaries:
        sent.update(summ.get("sent", {}))
        received.update(summ.get("received", {}))
    out: dict[int, list[float]] = {}
    for key, (waiting, completed) in received.items():
        planned = sent.get(key)
        if planned is not None and waiting <= planned:
            out.setdefault(int(key.split("/", 1)[0]), []).append(completed - planned)
    return out


def plan_number(plan_id: str) -> float:
    """A plan id as a TensorBoard scalar: its first 6 hex digits as an integer (exact in float32)."""
    return float(int(plan_id[:6], 16))


class StageExchange:
    """Per-step stage summaries, gathered on the last stage without a collective.

    TorchTitan writes TensorBoard on the last stage only. Every other stage hands its summary of a
    step to a background thread that writes it to the c10d store (``titan_morph/steps/...``, a ring
    of ``slots`` keys per stage), so the training thread never waits for it. The last stage reads
    the summaries when it logs; TorchTitan's grad-norm all-reduce over the pipeline group has by
    then made every stage finish the step, so they are normally there already (``collect`` waits
    at most ``timeout_s`` for a late one, and leaves out what is still missing).
    """

    _instances: dict[str, int] = {}

    def __init__(self, group: dist.ProcessGroup, stage: int, num_stages: int, slots: int = 8) -> None:
        import queue
        import threading

        self.stage, self.num_stages, self.slots = stage, num_stages, slots
        base = dist.distributed_c10d._get_default_store()
        name = group.group_name
        n = StageExchange._instances[name] = StageExchange._instances.get(name, -1) + 1
        self._ns = f"titan_morph/steps/{name}/{n}"
        self._base = base
        self._reader: Any = None
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        if stage != num_stages - 1:
            self._thread = threading.Thread(target=self._run, name="titan_morph-stage-stats", daemon=True)
            self._thread.start()
            import atexit

            atexit.register(self.close)

    def _key(self, stage: int, step: int) -> str:
        return f"{stage}/{step % self.slots}"

    def _run(self) -> None:
        import json

        store = dist.PrefixStore(self._ns, self._base.clone())
        while (item := self._queue.get()) is not None:
            step, payload = item
            try:
                store.set(self._key(self.stage, step), json.dumps(payload))
            except Exception as err:  # statistics only: never break training
                logger.warning("titan_morph: could not publish step %d stage stats: %s", step, err)

    def publish(self, step: int, payload: dict[str, float]) -> None:
        """Hand this stage's summary of ``step`` to the background writer (returns at once)."""
        if self._thread is not None:
            self._queue.put((step, payload))

    def collect(self, step: int, timeout_s: float = 0.2) -> dict[int, dict[str, float]]:
        """Summaries of ``step`` from the other stages (last stage only); missing ones are left out."""
        import datetime
        import json

        if self._reader is None:
            self._reader = dist.PrefixStore(self._ns, self._base.clone())
            self._reader.set_timeout(datetime.timedelta(seconds=timeout_s))
        out: dict[int, dict[str, float]] = {}
        deadline = time.monotonic() + timeout_s
        pending = set(range(self.num_stages - 1))
        while pending:
            for stage in sorted(pending):
                key = self._key(stage, step)
                try:
                    if not self._reader.check([key]):
                        continue
                    value = json.loads(self._reader.get(key))
                except Exception:
                    continue
                if int(value.get("step", -1)) == step:
                    out[stage] = value
                    pending.discard(stage)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(0.001)
        return out

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(1.0)


class _SendTimer:
    """The schedule's transport, timing how late each send leaves after the op that produced it."""

    def __init__(self, inner: Any, schedule: MorphSchedule) -> None:
        self.inner, self.schedule = inner, schedule

    def batch_p2p(self, ops: list, desc: str | None = None) -> list:
        sched = self.schedule
        if sched._produced_at is not None and sched._current is not None and any(op.op is dist.isend for op in ops):
            sched._current.send_late_ms.append((time.monotonic() - sched._produced_at) * 1e3)
            hint = getattr(self.inner, "hint_issue", None)
            if sched._device_clock is not None and callable(hint):
                # testbed: the send leaves when the producing op ends on the device (as a send
                # queued behind a GPU kernel does), within the clock's host-gap bound
                hint(sched._produced_at, sched._device_clock.hide_s * 1e3)
            sched._produced_at = None
        return self.inner.batch_p2p(ops, desc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class PlanMismatchError(RuntimeError):
    """Ranks of one pipeline installed different plans: running on would deadlock."""


class MorphSchedule(_PipelineScheduleRuntime):
    """Per-rank orders from ``titan_morph.pipelining`` in torch's runtime (one stage per rank).

    Args:
        stages: a one-element list with this rank's ``PipelineStage`` (stage index = pp rank).
        n_microbatches: N; must equal ``plan.model.microbatches``.
        loss_fn: as for any torch schedule.
        plan: the initial plan (same on every rank).
        transport: ``titan_morph.comm`` transport used for every send/recv of a step
            (``None`` = torch.distributed, i.e. torch's own ``_batch_p2p``).
        check_group: process group used to check plan consistency in ``set_plan``
            (default: the stage's pipeline group).
        scale_grads: as for torch schedules (TorchTitan passes ``False``).
        planned_depth: link-queue depth the plan's makespan is predicted with (the transport's
            model: ``link_queue_depth`` for the blocking default transport, None = non-blocking).
        predict: also report the simulator's prediction of each step under the transport's
            actual link model (meaningful when the plan's stage times are the real ones).
    """

    def __init__(
        self,
        stages: list[Any],
        n_microbatches: int,
        loss_fn: Callable | None = None,
        *,
        plan: Plan,
        transport: Any | None = None,
        check_group: dist.ProcessGroup | None = None,
        scale_grads: bool = True,
        planned_depth: int | None = None,
        predict: bool = False,
        **kwargs: Any,
    ) -> None:
        if len(stages) != 1:
            raise ValueError(f"MorphSchedule runs one stage per rank, got {len(stages)} stages on this rank")
        super().__init__(stages, n_microbatches, loss_fn=loss_fn, scale_grads=scale_grads, **kwargs)
        if self._num_stages != self.pp_group_size:
            raise ValueError(
                f"MorphSchedule needs as many stages as pipeline ranks, got {self._num_stages} stages"
                f" on {self.pp_group_size} ranks"
            )
        self.transport = transport
        self._check_group = check_group if check_group is not None else stages[0].group
        self.plan: Plan = plan
        self.planned_depth = planned_depth
        self.predict = predict
        self.planned_makespan_ms: float | None = None
        self.planned_bubble_rate: float | None = None
        self.plan_changes = 0
        self.records: list[StepRecord] = []
        self.max_records = 1000
        self._steps = 0
        self._current: StepRecord | None = None
        self._blocked_seen: dict[int, float] = {}
        self._wait_started: dict[tuple[int, str, int], float] = {}
        self._produced_at: float | None = None
        self._device_clock: Any = None  # the testbed's DeviceClock of this stage, if padded
        self.monitor: Any = None  # titan_morph.monitor.live.LiveMonitor, attached by the builder
        stage = stages[0]
        self._is_last = stage.stage_index == stage.num_stages - 1
        self._exchange: StageExchange | None = None
        if dist.is_initialized() and self.pp_group_size > 1:
            group = stage.group if stage.group is not None else dist.group.WORLD
            self._exchange = StageExchange(group, stage.stage_index, stage.num_stages)
        self._instrument(stages[0])
        self.set_plan(plan)

    # ----------------------------------------------------------------- plans
    def set_plan(self, plan: Plan, *, check: bool = True) -> None:
        """Install ``plan`` for the following steps; call it between steps on every rank.

        With ``check`` (default), all ranks of the pipeline group exchange the plan id and a
        :class:`PlanMismatchError` is raised everywhere if they differ.
        """
        from titan_morph.pipelining.export import to_actions

        model = plan.model
        if model.stages != self._num_stages or model.microbatches != self._n_microbatches:
            raise ValueError(
                f"plan is for S={model.stages}, N={model.microbatches}; this schedule runs"
                f" S={self._num_stages}, N={self._n_microbatches}"
            )
        validate_orders(model, plan.orders)
        if check and dist.is_initialized() and self.pp_group_size > 1:
            self._check_consistent(plan)
        actions = to_actions(plan)
        self.pipeline_order = {rank: list(acts) for rank, acts in actions.items()}
        self._prepare_schedule_with_comms({rank: list(acts) for rank, acts in actions.items()})
        from titan_morph.pipelining.simulate import simulate

        planned = simulate(model, plan.orders, depth=self.planned_depth)
        self.planned_makespan_ms, self.planned_bubble_rate = planned.makespan, planned.mean_bubble_rate
        previous, self.plan = self.plan, plan
        if previous is not plan and previous.plan_id != plan.plan_id:
            self.plan_changes += 1
            logger.info("pipeline plan %s -> %s (x=%s)", previous.plan_id, plan.plan_id, list(plan.warmup))

    def _check_consistent(self, plan: Plan) -> None:
        device = torch.device("cpu")
        if dist.get_backend(self._check_group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        mine = torch.tensor([int(plan.plan_id, 16)], dtype=torch.int64, device=device)
        gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size(self._check_group))]
        dist.all_gather(gathered, mine, group=self._check_group)
        ids = [f"{int(t.item()):012x}" for t in gathered]
        if len(set(ids)) != 1:
            raise PlanMismatchError(f"pipeline ranks installed different plans: {ids} (this rank: {plan.plan_id})")

    def tensorboard_metrics(self, step: int) -> dict[str, float]:
        """Scalars for TorchTitan's metrics processor about the last step (written by the last stage).

        ``morph/iteration_ms``: this stage's step (schedule start to end); ``morph/pipeline_ms``:
        stage 0's start to the latest end of any stage (one host: a shared clock), i.e. what the
        simulator's makespan measures;
        ``morph/planned_makespan_ms``: the plan's own prediction; ``morph/predicted_ms``: the
        simulator under the transport's actual links (``predict``); ``morph/plan_id``: see
        :func:`plan_number`; ``morph/latency_ms[/link{i}]``: mean host latency of emulated
        messages (:func:`message_latencies`); ``morph/send_latency_ms``: mean time from a producing
        op's (device) end to its send's issue; ``morph/idle_ms``, ``morph/compute_ms``, ``morph/blocked_ms``: this
        stage; ``morph/stage{i}/idle_ms`` and ``morph/stage{i}/blocked_ms``: every stage, gathered by
        :class:`StageExchange` (absent for a stage whose summary did not arrive in time).
        """
        if not self.records:
            return {}
        rec = self.records[-1]
        out = {
            "morph/iteration_ms": rec.iteration_ms,
            "morph/compute_ms": rec.busy_ms,
            "morph/idle_ms": rec.idle_ms,
            "morph/blocked_ms": sum(rec.blocked_ms.values()),
            "morph/plan_id": plan_number(rec.plan_id),
            "morph/plan_changes": float(self.plan_changes),
        }
        if rec.planned_makespan_ms is not None:
            out["morph/planned_makespan_ms"] = rec.planned_makespan_ms
        if self.planned_bubble_rate is not None:
            out["morph/planned_bubble_rate"] = self.planned_bubble_rate
        for link, delta in enumerate(self.plan.slackness):
            out[f"morph/slackness/link{link}"] = float(delta)
        for link, ms in sorted(rec.blocked_ms.items()):
            out[f"morph/blocked_ms/link{link}"] = ms
        if self.monitor is not None:
            out.update(self.monitor.metrics(self))
        if not self._is_last:
            return out
        summaries = {self._stages[0].stage_index: rec.summary()}
        if self._exchange is not None:
            summaries.update(self._exchange.collect(rec.step))
        # failovers: (link, direction) switches to the delegates, counted on both ends of a link
        out["morph/failovers"] = sum(summ.get("failovers", 0.0) for summ in summaries.values())
        for stage, summ in sorted(summaries.items()):
            out[f"morph/stage{stage}/idle_ms"] = summ["idle_ms"]
            out[f"morph/stage{stage}/blocked_ms"] = summ["blocked_ms"]
        first = summaries[0]["start_s"] if 0 in summaries else None  # the pipeline starts with stage 0
        if len(summaries) == self._num_stages and first is not None:
            out["morph/pipeline_ms"] = (max(summ["end_s"] for summ in summaries.values()) - first) * 1e3
        latencies = message_latencies(summaries.values())
        if latencies:
            import statistics

            # the mean, not the median: latencies add up along the critical path, tail included
            out["morph/latency_ms"] = statistics.fmean(v for vs in latencies.values() for v in vs)
            for link, values in sorted(latencies.items()):
                out[f"morph/latency_ms/link{link}"] = statistics.fmean(values)
        sends = sum(summ.get("sends", 0.0) for summ in summaries.values())
        if sends:
            out["morph/send_latency_ms"] = sum(summ.get("send_late_ms", 0.0) for summ in summaries.values()) / sends
        if self.predict:
            predicted = self._predict(rec, first)
            if predicted is not None:
                out["morph/predicted_ms"] = predicted
        return out

    def tensorboard_images(self, step: int) -> dict[str, Any]:
        """``morph/plan_timeline``: the active plan's simulated timeline (HWC RGB), once per plan change."""
        if self.monitor is None or not self._is_last:
            return {}
        img = self.monitor.timeline_image(self.plan)
        return {} if img is None else {"morph/plan_timeline": img}

    def _predict(self, rec: StepRecord, first_start_s: float | None) -> float | None:
        """Simulated makespan of this step's plan under the transport's link model and depth."""
        from titan_morph.pipelining.links import LinkDownError
        from titan_morph.pipelining.simulate import simulate

        model = self.plan.model.with_delays((0.0,) * (self._num_stages - 1))
        links = getattr(self.transport, "links", None)
        depth = getattr(self.transport, "depth", self.planned_depth) if links is not None else self.planned_depth
        if getattr(self.transport, "delegated", None):  # auto: slow links run on the non-blocking delegates
            depth = None
        epoch = getattr(self.transport, "epoch", None)
        t0 = 0.0
        if epoch is not None:
            t0 = ((first_start_s if first_start_s is not None else rec.start_s) - epoch) * 1e3
        try:
            return simulate(model, self.plan.orders, links=links, depth=depth, step=rec.step + 1, t0=t0).makespan
        except (LinkDownError, RuntimeError, ValueError):
            return None

    # ------------------------------------------------------------ transport
    @contextlib.contextmanager
    def _transport_scope(self) -> Iterator[None]:
        from torch.distributed.pipelining import schedules

        from titan_morph.comm.scope import use_transport

        inner_wait = schedules._wait_batch_p2p
        started = self._wait_started
        if self.transport is None:
            from titan_morph.comm.transport import TorchTransport

            transport = _SendTimer(TorchTransport(), self)  # exactly torch's _batch_p2p, timed
        else:
            transport = _SendTimer(self.transport, self)

        def _wait_batch_p2p(work: Any) -> Any:
            # When this rank began waiting for each emulated receive (its latency is only
            # measurable if it was already waiting when the message was due).
            now = time.monotonic()
            for handle in work:
                rec = getattr(handle, "record", None)
                if rec is not None and getattr(rec, "side", None) == "recv":
                    started[(getattr(rec, "path", "") or "", rec.link, rec.direction, rec.seq)] = now
            return inner_wait(work)

        schedules._wait_batch_p2p = _wait_batch_p2p
        try:
            with use_transport(transport):
                yield
        finally:
            schedules._wait_batch_p2p = inner_wait

    # --------------------------------------------------------------- timing
    def _instrument(self, stage: Any) -> None:
        """Wrap this rank's stage compute calls with a monotonic clock (per-op records)."""

        def wrap(name: str, kind: str) -> None:
            inner = getattr(stage, name)

            def timed(mb_index: int, *args: Any, **kwargs: Any) -> Any:
                rec = self._current
                if rec is None:
                    return inner(mb_index, *args, **kwargs)
                start = time.monotonic()
                out = inner(mb_index, *args, **kwargs)
                end = time.monotonic()
                op_kind = kind
                if name == "backward_one_chunk" and not kwargs.get("full_backward", True):
                    op_kind = "I"
                clock = getattr(stage, "_titan_morph_clock", None)  # testbed: the op's device time
                if clock is not None:  # what a CUDA event pair around the op would measure
                    start, end = clock.last_begin, clock.device_end
                rec.compute_ms[op_kind] = rec.compute_ms.get(op_kind, 0.0) + (end - start) * 1e3
                rec.op_ms.append((op_kind, mb_index, start, end))
                self._device_clock = clock
                self._produced_at = clock.device_end if clock is not None else end
                return out

            setattr(stage, name, timed)

        for name, kind in _TIMED_METHODS.items():
            wrap(name, kind)

    def _step_microbatches(self, *args: Any, **kwargs: Any) -> Any:
        record = StepRecord(self._steps, self.plan.plan_id, 0.0, self.planned_makespan_ms)
        if self.transport is not None and hasattr(self.transport, "set_step"):
            self.transport.set_step(self._steps + 1)  # TorchTitan counts steps from 1
        self._current = record
        start = time.monotonic()
        try:
            with self._transport_scope():
                out = super()._step_microbatches(*args, **kwargs)
        finally:
            self._current = None
        end = time.monotonic()
        record.start_s = start
        record.iteration_ms = (end - start) * 1e3
        record.op_ms = [(k, mb, (s - start) * 1e3, (e - start) * 1e3) for k, mb, s, e in record.op_ms]
        record.blocked_ms = self._blocked_delta()
        record.failovers = int(getattr(self.transport, "failovers", 0))
        self._take_messages(record)
        self.records.append(record)
        if len(self.records) > self.max_records:
            del self.records[: len(self.records) - self.max_records]
        self._steps += 1
        if self._exchange is not None:
            self._exchange.publish(record.step, record.summary())
        if self.monitor is not None:  # exchange, detect, maybe re-plan: before the next step starts
            self.monitor.after_step(self, record)
        record.messages = []  # consumed: keep the step records small
        return out

    def _take_messages(self, record: StepRecord) -> None:
        """Move the emulated transport's message records of this step into ``record``."""
        take = getattr(self.transport, "take_records", None)
        epoch = getattr(self.transport, "epoch", None)
        started, self._wait_started = self._wait_started, {}
        if not callable(take) or epoch is None:
            return
        record.messages, record.waits = list(take()), started
        for msg in record.messages:
            path = getattr(msg, "path", "") or ""
            key = f"{msg.link}/{msg.direction}/{msg.seq}" + (f"/{path}" if path else "")
            if msg.side == "send" and msg.planned is not None:
                record.sent[key] = msg.planned
            elif msg.side == "recv" and msg.completed is not None:
                waited = started.get((path, msg.link, msg.direction, msg.seq))
                if waited is not None:
                    record.received[key] = ((waited - epoch) * 1e3, msg.completed)

    def _blocked_delta(self) -> dict[int, float]:
        """Per-link ms this rank was blocked in sends during the step (the transport's totals, differenced)."""
        blocked = getattr(self.transport, "blocked_ms", None)
        if callable(blocked):
            blocked = blocked()
        if not isinstance(blocked, dict):
            return {}
        delta = {link: ms - self._blocked_seen.get(link, 0.0) for link, ms in blocked.items()}
        self._blocked_seen = dict(blocked)
        return delta
