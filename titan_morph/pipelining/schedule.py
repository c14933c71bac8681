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
from collections.abc import Callable, Iterator
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

    @property
    def busy_ms(self) -> float:
        return sum(self.compute_ms.values())

    @property
    def idle_ms(self) -> float:
        """Time this stage was not computing during the step (bubbles + blocking + comm waits)."""
        return max(0.0, self.iteration_ms - self.busy_ms)


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
        self.planned_makespan_ms: float | None = None
        self.plan_changes = 0
        self.records: list[StepRecord] = []
        self._steps = 0
        self._current: StepRecord | None = None
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
        from titan_morph.pipelining.simulate import makespan

        self.planned_makespan_ms = makespan(model, plan.orders)
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
        """Scalars for TorchTitan's metrics processor (this rank's view of the last step)."""
        if not self.records:
            return {}
        rec = self.records[-1]
        out = {
            "morph/iteration_ms": rec.iteration_ms,
            "morph/compute_ms": rec.busy_ms,
            "morph/idle_ms": rec.idle_ms,
            "morph/plan_changes": float(self.plan_changes),
        }
        if rec.planned_makespan_ms is not None:
            out["morph/planned_makespan_ms"] = rec.planned_makespan_ms
        for link, delta in enumerate(self.plan.slackness):
            out[f"morph/slackness/link{link}"] = float(delta)
        blocked = getattr(self.transport, "blocked_ms", None)
        if callable(blocked):
            for link, ms in blocked().items():
                out[f"morph/blocked_ms_total/link{link}"] = ms  # cumulative since start
        return out

    # ------------------------------------------------------------ transport
    @contextlib.contextmanager
    def _transport_scope(self) -> Iterator[None]:
        if self.transport is None:
            yield
            return
        from titan_morph.comm.scope import use_transport

        with use_transport(self.transport):
            yield

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
                rec.compute_ms[op_kind] = rec.compute_ms.get(op_kind, 0.0) + (end - start) * 1e3
                rec.op_ms.append((op_kind, mb_index, start, end))
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
        record.iteration_ms = (end - start) * 1e3
        record.op_ms = [(k, mb, (s - start) * 1e3, (e - start) * 1e3) for k, mb, s, e in record.op_ms]
        self.records.append(record)
        self._steps += 1
        return out
