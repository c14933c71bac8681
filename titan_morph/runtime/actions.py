"""Plans as torch's schedule IR: the lowering from the planner's orders to ``_Action`` lists.

The planner (:mod:`titan_morph.pipelining`) keeps plans as data without torch; this is the one
place they become what ``_PipelineScheduleRuntime`` executes (``pipeline_order``): one stage per
rank, or several (the V: rank r runs stages r and 2R-1-r), each action naming its stage. torch's own
passes (``_prepare_schedule_with_comms``) then derive the stage-to-rank mapping from the actions and
insert the sends and receives (none between two stages on one rank).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch.distributed.pipelining.schedules import _Action, _ComputationType

from titan_morph.pipelining.core.model import Op, Plan

__all__ = ["to_actions"]

_KINDS = {
    "F": _ComputationType.FORWARD,
    "I": _ComputationType.BACKWARD_INPUT,
    "W": _ComputationType.BACKWARD_WEIGHT,
    "B": _ComputationType.FULL_BACKWARD,
}


def to_actions(plan: Plan | Sequence[Sequence[Op | str]]) -> dict[int, list[_Action]]:
    """Rank ``r`` gets ``_Action(stage, kind, mb)`` per op of its order: the op's stage, or ``r``
    when the op names none (one stage per rank).

    Kinds map to ``_ComputationType``: F → FORWARD, I → BACKWARD_INPUT, W → BACKWARD_WEIGHT,
    B → FULL_BACKWARD. ``plan`` is a :class:`Plan` or per-rank orders (``Op`` or ``"F3"``/``"5F3"``
    strings).
    """
    orders = plan.orders if isinstance(plan, Plan) else plan
    out: dict[int, list[_Action]] = {}
    for rank, order in enumerate(orders):
        ops = [op if isinstance(op, Op) else Op.parse(op) for op in order]
        out[rank] = [_Action(rank if op.stage is None else op.stage, _KINDS[op.kind], op.mb) for op in ops]
    return out
