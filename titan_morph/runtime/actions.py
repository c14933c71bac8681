"""Plans as torch's schedule IR: the lowering from the planner's orders to ``_Action`` lists.

The planner (:mod:`titan_morph.pipelining`) keeps plans as data without torch; this is the one
place they become what ``_PipelineScheduleRuntime`` executes (``pipeline_order``), one stage per
rank. torch's own passes (``_prepare_schedule_with_comms``) then insert the sends and receives.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.distributed.pipelining.schedules import _Action, _ComputationType

from titan_morph.pipelining.model import Op, Plan

__all__ = ["to_actions"]

_KINDS = {
    "F": _ComputationType.FORWARD,
    "I": _ComputationType.BACKWARD_INPUT,
    "W": _ComputationType.BACKWARD_WEIGHT,
    "B": _ComputationType.FULL_BACKWARD,
}


def to_actions(plan: Plan | Sequence[Sequence[Op | str]]) -> dict[int, list[_Action]]:
    """Rank ``r`` runs stage ``r`` and gets ``_Action(r, kind, mb)`` per op of its order.

    Kinds map to ``_ComputationType``: F → FORWARD, I → BACKWARD_INPUT, W → BACKWARD_WEIGHT,
    B → FULL_BACKWARD. ``plan`` is a :class:`Plan` or per-stage orders (``Op`` or ``"F3"`` strings).
    """
    orders = plan.orders if isinstance(plan, Plan) else plan
    out: dict[int, list[_Action]] = {}
    for rank, order in enumerate(orders):
        ops = [op if isinstance(op, Op) else Op.parse(op) for op in order]
        out[rank] = [_Action(rank, _KINDS[op.kind], op.mb) for op in ops]
    return out
