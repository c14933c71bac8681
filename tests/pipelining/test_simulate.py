"""Executor-simulator: Fig. 5 numbers, blocking links, time-varying delays, deadlock messages."""

from __future__ import annotations

import pytest

from titan_morph.pipelining.core.links import LinkDownError, LinkModel, StaticDelays
from titan_morph.pipelining.core.model import CostModel, Op
from titan_morph.pipelining.core.stragglers import TraceDelays, TraceEvent
from titan_morph.pipelining.schedules.generate import generate
from titan_morph.pipelining.timing.simulate import DeadlockError, makespan, simulate


def _ops(text: str) -> tuple[Op, ...]:
    return tuple(Op.parse(t) for t in text.split())


@pytest.fixture
def fig4() -> tuple[CostModel, tuple]:
    model = CostModel.uniform(4, 12, 10, 10, 10)
    return model, generate(model, (7, 5, 3, 1))


@pytest.mark.parametrize(("c0", "expected"), [(0, 390.0), (10, 400.0), (20, 440.0)])
def test_fig5_fixed_orders(fig4: tuple[CostModel, tuple], c0: float, expected: float) -> None:
    model, orders = fig4
    delayed = model.with_delays([c0, 0, 0])
    result = simulate(delayed, orders)
    assert result.makespan == expected
    assert makespan(delayed, orders) == expected
    assert makespan(model, orders, links=StaticDelays((c0, 0.0, 0.0))) == expected


def test_timings_respect_dependencies(fig4: tuple[CostModel, tuple]) -> None:
    model, orders = fig4
    delayed = model.with_delays([20, 5, 0])
    result = simulate(delayed, orders)
    end = {(t.stage, t.op): t.end for ts in result.timings for t in ts}
    for ts in result.timings:
        for prev, cur in zip(ts, ts[1:]):
            assert cur.start >= prev.end
    for (s, op), t_end in end.items():
        start = t_end - model.duration(s, op.kind)
        if op.kind == "F" and s > 0:
            assert start >= end[(s - 1, op)] + delayed.delays[s - 1]
        if op.kind == "I" and s < 3:
            assert start >= end[(s + 1, op)] + delayed.delays[s]
        if op.kind == "W":
            assert start >= end[(s, Op("I", op.mb))]
    assert result.bubble_rate[0] == pytest.approx(1 - 360 / result.makespan)


def test_critical_path_explains_delay(fig4: tuple[CostModel, tuple]) -> None:
    model, orders = fig4
    result = simulate(model.with_delays([20, 0, 0]), orders)
    path = result.critical_path
    assert path[0].end == result.makespan
    assert path[-1].via == "start" and path[-1].start == 0.0
    assert any(step.via == "link" and step.wait_ms == 20.0 for step in path)
    text = result.explain()
    assert "makespan 440.0 ms" in text and "link 0" in text
    # No delay: the path is pure compute.
    clean = simulate(model, orders)
    assert sum(st.end - st.start for st in clean.critical_path) == pytest.approx(390.0)


def test_blocking_depth_adds_head_of_line_stalls(fig4: tuple[CostModel, tuple]) -> None:
    model, orders = fig4
    delayed = model.with_delays([30, 0, 0])
    free = simulate(delayed, orders)
    blocking = simulate(delayed, orders, depth=1)
    assert blocking.makespan >= free.makespan
    assert blocking.blocked_ms[0] > 0 and free.blocked_ms == (0.0, 0.0, 0.0, 0.0)
    assert any(st.via == "blocked" for st in blocking.critical_path) or blocking.makespan == free.makespan
    assert makespan(delayed, orders, depth=1) == blocking.makespan


def test_time_varying_trace_and_t0(fig4: tuple[CostModel, tuple]) -> None:
    model, orders = fig4
    trace = TraceDelays(3, (TraceEvent(1000.0, 0, 20.0),), key="time_ms")
    assert simulate(model, orders, links=trace).makespan == 390.0
    assert simulate(model, orders, links=trace, t0=1000.0).makespan == 440.0
    by_step = TraceDelays(3, (TraceEvent(5, 0, 10.0),), key="step")
    assert makespan(model, orders, links=by_step, step=4) == 390.0
    assert makespan(model, orders, links=by_step, step=5) == 400.0


def test_custom_durations(fig4: tuple[CostModel, tuple]) -> None:
    model, orders = fig4
    doubled = simulate(model, orders, durations=lambda s, op: 2 * model.duration(s, op.kind))
    assert doubled.makespan == 780.0
    with pytest.raises(ValueError, match=r"durations\(0, F0\) must be a finite time >= 0 ms"):
        simulate(model, orders, durations=lambda s, op: -1.0)


def test_fused_backward_orders() -> None:
    model = CostModel.uniform(2, 2, 1, 2, 3)
    orders = (_ops("F0 F1 B0 B1"), _ops("F0 B0 F1 B1"))
    # stage 1: F0 1-2, B0 2-7, F1 7-8, B1 8-13; stage 0: B0 7-12, B1 13-18
    assert simulate(model, orders).makespan == 18.0
    assert makespan(model, orders) == 18.0


def test_deadlock_names_stuck_ops() -> None:
    model = CostModel.uniform(2, 4, 1, 1, 1)
    ok = _ops("F0 F1 F2 F3 I0 I1 I2 I3 W0 W1 W2 W3")
    bad = _ops("F0 I0 F1 I1 F2 I2 F3 I3 W0 W1 W2 W3")
    stage0 = _ops("F0 I0 F1 F2 F3 I1 I2 I3 W0 W1 W2 W3")  # waits for I0 before sending F1
    stage1 = _ops("F0 F1 I0 I1 F2 I2 F3 I3 W0 W1 W2 W3")  # wants F1 before giving I0
    assert makespan(model, (ok, bad)) > 0
    for fn in (simulate, makespan):
        with pytest.raises(DeadlockError) as info:
            fn(model, (stage0, stage1))
        msg = str(info.value)
        assert "stage 1 waits for F1 (needs F1 from stage 0, which is stuck behind I0" in msg
        assert "stage 0 waits for I0 (needs I0 from stage 1, which is stuck behind F1" in msg
        assert info.value.stuck == {0: Op("I", 0), 1: Op("F", 1)}


def test_invalid_orders_rejected() -> None:
    model = CostModel.uniform(2, 2, 1, 1, 1)
    with pytest.raises(ValueError, match="stage 1"):
        simulate(model, (_ops("F0 F1 I0 I1 W0 W1"), _ops("F0 F1 I0 W0 W1")))
    with pytest.raises(ValueError, match="expected 2 stage orders"):
        makespan(model, (_ops("F0 F1 I0 I1 W0 W1"),))


def test_link_down() -> None:
    model = CostModel.uniform(2, 2, 1, 1, 1, delays=[float("inf")])
    orders = generate(CostModel.uniform(2, 2, 1, 1, 1), (2, 1))
    with pytest.raises(LinkDownError):
        makespan(model, orders)


def test_deadlocked_csv_like_orders() -> None:
    """Orders as a user would hand-write them (one comma-separated line per rank)."""
    text = """
    F0,F1,F2,I0,F3,I1,I2,I3,W0,W1,W2,W3
    F0,F1,F2,F3,I0,I1,I2,I3,W0,W1,W2,W3
    F0,I0,F1,I1,F2,I2,F3,I3,W0,W1,W2,W3
    """
    orders = [tuple(Op.parse(tok) for tok in line.split(",")) for line in text.split()]
    model = CostModel.uniform(3, 4, 1, 1, 1)
    with pytest.raises(DeadlockError) as info:
        simulate(model, orders)
    msg = str(info.value)
    # stage 0 waits for I0, which stage 1 only runs after F3 — which stage 0 runs after I0.
    assert "stage 0 waits for I0 (needs I0 from stage 1, which is stuck behind F3" in msg
    assert "stage 1 waits for F3 (needs F3 from stage 0, which is stuck behind I0" in msg
    assert "stage 2" not in msg.split("deadlock:")[1].split(";")[0]


class _SameDelays(LinkModel):
    """Static delays behind the generic interface: forces the timing routine's link-queue branch."""

    def __init__(self, fwd: tuple[float, ...], bwd: tuple[float, ...]) -> None:
        self.num_links = len(fwd)
        self.fwd, self.bwd = fwd, bwd

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        return (self.fwd if direction == "fwd" else self.bwd)[link]


def test_static_branch_agrees_with_the_link_queue_branch() -> None:
    from titan_morph.pipelining.reference.instances import instance_set
    from titan_morph.pipelining.timing.timeline import time_codes, to_codes

    for model in instance_set(77, 12, s_range=(2, 6), n_mult=(1, 3), memory="mixed"):
        orders = generate(model, [1] * model.stages, limit=[model.budget(s) for s in range(model.stages)])
        fwd = tuple(c + 3.0 for c in model.delays)
        bwd = model.delays
        fast = time_codes(model, to_codes(orders), delays=(fwd, bwd), detail=True)
        slow = time_codes(model, to_codes(orders), links=_SameDelays(fwd, bwd), detail=True)
        assert fast.makespan == pytest.approx(slow.makespan)
        for name in ("start", "end", "ready", "blocked"):
            a, b = getattr(fast, name), getattr(slow, name)
            assert [v for row in a for v in row] == pytest.approx([v for row in b for v in row]), name
        assert simulate(model, orders, links=StaticDelays(fwd, bwd)).makespan == pytest.approx(fast.makespan)
