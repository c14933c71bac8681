"""What torch's runtime needs of a plan beyond its structure: the last stage's forwards in
microbatch order (torch files the last stage's losses by the order its forwards run).

The search's tabu moves may reorder them; its plan is then renamed (microbatches have equal
costs), so every plan it returns passes :func:`validate_orders` with the same makespan. A plan that
breaks the contract is refused in one line; timing it alone (``runnable=False``) is allowed.
"""

from __future__ import annotations

import random

import pytest

from titan_morph.pipelining.core.model import CostModel, Op, last_stage_forwards, relabel_microbatches, validate_orders
from titan_morph.pipelining.search.builders import build
from titan_morph.pipelining.search.driver import search_detailed
from titan_morph.pipelining.timing.simulate import makespan


def _model(rng: random.Random, per_rank: int) -> CostModel:
    stages, links = 4 * per_rank, 3
    return CostModel.uniform(
        stages,
        8,
        [rng.uniform(1, 20) for _ in range(stages)],
        [rng.uniform(0.1, 25) for _ in range(stages)],
        [rng.uniform(1, 25) for _ in range(stages)],
        delays=[rng.choice([0.0, 10.0, 40.0]) for _ in range(links)],
        stages_per_rank=per_rank,
    )


def _swap_last(model: CostModel, orders: tuple) -> tuple:
    """``orders`` with microbatches 0 and 1 swapped on the last stage only (structure intact)."""
    last = model.stages - 1
    r = model.rank_of(last)
    swapped = [list(o) for o in orders]
    swapped[r] = [
        Op(op.kind, {0: 1, 1: 0}.get(op.mb, op.mb), op.stage) if (r if op.stage is None else op.stage) == last else op
        for op in orders[r]
    ]
    return tuple(tuple(o) for o in swapped)


@pytest.mark.parametrize("per_rank", [1, 2])
def test_a_reordered_last_stage_is_refused_in_one_line_and_renamed_at_no_cost(per_rank: int) -> None:
    model = _model(random.Random(3), per_rank)
    plan = build("pipemorph" if per_rank == 1 else "pipemorph-v", model)
    validate_orders(model, plan.orders)
    bad = _swap_last(model, plan.orders)
    with pytest.raises(ValueError, match="torch's runtime needs the last stage's forwards in microbatch order") as exc:
        validate_orders(model, bad)
    assert "\n" not in str(exc.value)
    validate_orders(model, bad, runnable=False)  # the structure alone is fine: it can be timed
    renamed = relabel_microbatches(model, bad)
    validate_orders(model, renamed)
    assert last_stage_forwards(model, renamed) == list(range(model.microbatches))
    assert makespan(model, renamed) == pytest.approx(makespan(model, bad))
    assert relabel_microbatches(model, plan.orders) == plan.orders  # already in order: unchanged


@pytest.mark.parametrize("per_rank", [1, 2])
def test_every_searched_plan_keeps_the_contract(per_rank: int) -> None:
    rng = random.Random(11 + per_rank)
    for _ in range(12):
        model = _model(rng, per_rank)
        result = search_detailed(model, iterations=300)
        validate_orders(model, result.plan.orders)
        assert makespan(model, result.plan.orders) == pytest.approx(result.makespan)
