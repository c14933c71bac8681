"""Named schedules: warm-up counts, shapes, memory errors, PipeMorph planning."""

from __future__ import annotations

import pytest

from titan_morph.pipelining.core.links import StaticDelays
from titan_morph.pipelining.core.model import CostModel, Op, in_flight_peak, validate_orders, warmup_count
from titan_morph.pipelining.search.builders import SCHEDULES, build, split_fused, warmup_for
from titan_morph.pipelining.timing.simulate import makespan


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_is_valid(schedule: str) -> None:
    model = CostModel.uniform(4, 12, [9, 10, 11, 10], [10, 12, 9, 11], [7, 8, 6, 9], delays=[5, 0, 12])
    plan = build(schedule, model)
    validate_orders(model, plan.orders)
    assert plan.schedule == schedule and plan.model is model
    assert [warmup_count(o) for o in plan.orders] == list(plan.warmup)
    assert makespan(model, plan.orders) > 0


def test_warmup_vectors() -> None:
    model = CostModel.uniform(4, 12, 1, 1, 1)
    assert warmup_for("1f1b", model) == (4, 3, 2, 1)
    assert warmup_for("zb-h1", model) == (4, 3, 2, 1)
    assert warmup_for("zb-h2", model) == (7, 5, 3, 1)
    assert warmup_for("gpipe", model) == (12,) * 4
    assert warmup_for("zb-h2", CostModel.uniform(8, 6, 1, 1, 1)) == (6, 6, 6, 6, 6, 5, 3, 1)  # capped at N
    assert warmup_for("pipemorph", model.with_memory(7)) == (7, 5, 3, 1)  # Alg. 1
    assert warmup_for("pipemorph", model.with_delays([2, 0, 0])) == (8, 5, 3, 1)  # Alg. 2: (1+1+4)/2 = 3


def test_fig4_baseline_makespans() -> None:
    model = CostModel.uniform(4, 12, 10, 10, 10)
    spans = {s: makespan(model, build(s, model).orders) for s in SCHEDULES}
    assert spans["zb-h2"] == 390.0  # Fig. 4
    assert spans["1f1b"] == (3 + 12) * 30.0  # (S - 1 + N)(t_F + t_B + t_W)
    assert spans["gpipe"] == 450.0
    assert spans["zb-h1"] <= spans["1f1b-iw"] <= spans["1f1b"]


def test_shapes() -> None:
    model = CostModel.uniform(3, 4, 1, 1, 1)
    one = build("1f1b", model).orders
    assert {op.kind for o in one for op in o} == {"F", "B"}
    iw = build("1f1b-iw", model).orders
    assert iw == split_fused(one)
    assert iw[0][:6] == tuple(Op.parse(t) for t in "F0 F1 F2 I0 W0 F3".split())
    gpipe = build("gpipe", model).orders
    assert gpipe[1] == tuple(Op.parse(t) for t in "F0 F1 F2 F3 B0 B1 B2 B3".split())
    h1 = build("zb-h1", model).orders
    assert [in_flight_peak(o) for o in h1] == [3, 2, 1]


@pytest.mark.parametrize(("schedule", "stage", "need"), [("zb-h2", 0, 7), ("1f1b", 0, 4), ("gpipe", 0, 12)])
def test_warmup_over_memory_fails_clearly(schedule: str, stage: int, need: int) -> None:
    model = CostModel.uniform(4, 12, 1, 1, 1, memory=3)
    with pytest.raises(ValueError, match=rf"stage {stage} needs {need} microbatches .* M_{stage} = 3"):
        build(schedule, model)


def test_pipemorph_under_memory_and_links() -> None:
    model = CostModel.uniform(4, 12, 10, 10, 10, memory=5)
    plan = build("pipemorph", model)
    assert plan.warmup == (5, 4, 3, 1) or plan.warmup == (5, 3, 2, 1)
    validate_orders(model, plan.orders)
    via_links = build("pipemorph", CostModel.uniform(4, 12, 10, 10, 10), links=StaticDelays((20.0, 0.0, 0.0)))
    assert via_links.warmup == (8, 5, 3, 1)
    assert makespan(model.with_delays([20, 0, 0]), via_links.orders) == 410.0


def test_build_errors() -> None:
    model = CostModel.uniform(2, 4, 1, 1, 1)
    with pytest.raises(ValueError, match="unknown schedule 'zb-v3'"):
        build("zb-v3", model)
    with pytest.raises(ValueError, match="'zb-v' places two stages per rank in a V: it needs stages_per_rank = 2"):
        build("zb-v", model)
    with pytest.raises(ValueError, match="unknown option"):
        build("zb-h1", model, colour="red")
    with pytest.raises(ValueError, match="only meaningful for 'pipemorph'"):
        build("1f1b", model, search=True)
    with pytest.raises(ValueError, match="Lemma 1"):
        build("pipemorph", model, warmup=(1, 2))


@pytest.mark.parametrize(
    ("stages", "n", "match"),
    [(0, 4, "stages must be an integer >= 1"), (2, 0, "microbatches must be an integer >= 1")],
)
def test_bad_stage_or_microbatch_counts(stages: int, n: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build("zb-h2", CostModel.uniform(stages, n, 1, 1, 1))
