"""Test plug-in (``--experimental.custom_import replan_schedule``): a mid-run ``set_plan``.

Registers ``ReplanZBH1``: MorphSchedule starting with ZB-H1's plan and switching, between steps
``SWITCH_AT_STEP - 1`` and ``SWITCH_AT_STEP``, to a PipeMorph plan made by Alg. 2 for 20 ms on every
link (other warm-up counts and orders). ``set_plan`` runs at the top of ``step`` — i.e. between
two training steps, on every rank, with the same plan (it checks that across the pipeline).
"""

from __future__ import annotations

from typing import Any

from titan_morph.comm.clock import sync_clock
from titan_morph.integration.assembly import prepare_stage
from titan_morph.integration.plans import cost_model, initial_plan
from titan_morph.integration.request import ScheduleRequest
from titan_morph.integration.schedules import register_schedule
from titan_morph.integration.transports import make_transport
from titan_morph.pipelining.core.model import Plan
from titan_morph.pipelining.search.builders import build
from titan_morph.runtime.schedule import MorphSchedule

SWITCH_AT_STEP = 3  # TorchTitan steps are 1-based


class ReplanSchedule(MorphSchedule):
    """MorphSchedule that installs ``next_plan`` before its ``SWITCH_AT_STEP``-th step."""

    def __init__(self, *args: Any, next_plan: Plan, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.next_plan = next_plan

    def step(self, *args: Any, **kwargs: Any) -> Any:
        if self._steps + 1 == SWITCH_AT_STEP:
            self.set_plan(self.next_plan)
        return super().step(*args, **kwargs)


def _build(req: ScheduleRequest) -> ReplanSchedule:
    morph = req.settings.morph
    stages = req.stage.num_stages
    first = initial_plan("zb-h1", morph, stages, req.n_microbatches)
    delayed = cost_model(morph, stages, req.n_microbatches, memory=True).with_delays((20.0,) * (stages - 1))
    second = build("pipemorph", delayed.with_memory(2 * stages))
    if second.plan_id == first.plan_id:
        raise AssertionError("the replacement plan must differ from the first one")
    clock = prepare_stage(req)
    return ReplanSchedule(
        [req.stage],
        req.n_microbatches,
        req.loss_fn,
        plan=first,
        next_plan=second,
        transport=make_transport(req, sync_clock(req.stage.group)),
        device_clock=clock,
        scale_grads=False,
        planned_depth=morph.depth,
    )


register_schedule("ReplanZBH1", _build, replace=True)
