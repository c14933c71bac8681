"""export.py: compute-only CSV round trip (incl. torch's own loader and the runtime's _Action
lowering), ASCII view, Chrome trace and timeline PNG. Run: ``.venv/bin/pytest tests/pipelining/test_export.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.torch_release import loaded_runtime
from titan_morph.pipelining.core.model import CostModel, Op, Plan
from titan_morph.pipelining.output.export import csv_rows, format_orders, load_orders_json, read_csv, write_csv
from titan_morph.runtime.actions import to_actions


def _orders(text: str) -> tuple[tuple[Op, ...], ...]:
    return tuple(tuple(Op.parse(t) for t in line.split()) for line in text.strip().splitlines())


# Hand-written plans for S=2, N=4 (the builders are tested elsewhere).
ZB_H1 = _orders("F0 F1 I0 F2 I1 F3 I2 W0 I3 W1 W2 W3\nF0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3")
ONE_F_ONE_B = _orders("F0 F1 B0 F2 B1 F3 B2 B3\nF0 B0 F1 B1 F2 B2 F3 B3")
MODEL = CostModel.uniform(2, 4, 10.0, 10.0, 10.0)


def test_csv_round_trip_and_format(tmp_path: Path) -> None:
    path = write_csv(ZB_H1, tmp_path / "zb.csv")
    lines = path.read_text().splitlines()
    assert lines[0] == "0F0,0F1,0I0,0F2,0I1,0F3,0I2,0W0,0I3,0W1,0W2,0W3"
    assert lines[1].startswith("1F0,1I0,1F1,")
    assert len(lines) == 2
    assert read_csv(path) == ZB_H1
    plan = Plan("zb-h1", (2, 1), ZB_H1, MODEL)
    assert read_csv(write_csv(plan, tmp_path / "plan.csv")) == ZB_H1
    assert read_csv(write_csv(ONE_F_ONE_B, tmp_path / "b.csv")) == ONE_F_ONE_B
    assert csv_rows([["F0", "B0"]]) == [["0F0", "0B0"]]
    assert load_orders_json(plan.orders_json()) == ZB_H1


def test_to_actions_uses_torch_types() -> None:
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    actions = to_actions(ZB_H1)
    assert sorted(actions) == [0, 1]
    assert actions[0][:3] == [
        _Action(0, _ComputationType.FORWARD, 0),
        _Action(0, _ComputationType.FORWARD, 1),
        _Action(0, _ComputationType.BACKWARD_INPUT, 0),
    ]
    assert actions[1][-1] == _Action(1, _ComputationType.BACKWARD_WEIGHT, 3)
    assert to_actions(ONE_F_ONE_B)[0][2] == _Action(0, _ComputationType.FULL_BACKWARD, 0)
    assert [str(a) for a in actions[0]] == csv_rows(ZB_H1)[0]


@pytest.mark.parametrize("orders", [ZB_H1, ONE_F_ONE_B], ids=["zb-h1", "1f1b"])
def test_torch_load_csv_accepts_our_csv(orders, tmp_path: Path) -> None:
    from torch.distributed.pipelining.schedules import _simulate_comms_compute

    rt = loaded_runtime(write_csv(orders, tmp_path / "s.csv"), 2, 2, 4)
    assert rt.pipeline_order == to_actions(orders)
    assert rt.stage_index_to_group_rank == {0: 0, 1: 1}
    lowered = {r: [str(a) for a in acts] for r, acts in rt.pipeline_order_with_comms.items()}
    assert "0SEND_F0" in lowered[0] and "1RECV_F0" in lowered[1]
    assert "1SEND_B0" in lowered[1] and "0RECV_B0" in lowered[0]
    # torch's own comms simulator completes the lowered schedule (no send/recv deadlock).
    # (its simulator knows compute and SEND/RECV only, so drop the FSDP/grad-reduce bookkeeping actions)
    kept = {"F", "I", "W", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B"}
    comms = {
        r: [a for a in acts if a.computation_type.value in kept] for r, acts in rt.pipeline_order_with_comms.items()
    }
    _simulate_comms_compute(comms, lambda s: rt.stage_index_to_group_rank[s], 2)


@pytest.mark.parametrize(
    ("schedule", "kw"),
    [
        ("1f1b", {}),
        ("1f1b-iw", {}),
        ("gpipe", {}),
        ("zb-h1", {}),
        ("zb-h2", {}),
        ("pipemorph", {"delays": (0.0, 25.0, 0.0)}),
        ("pipemorph", {"delays": (40.0, 0.0, 10.0), "memory": 5}),
    ],
)
def test_torch_load_csv_accepts_every_builder(schedule: str, kw: dict, tmp_path: Path) -> None:
    """Every named schedule (S=4, N=8) exports to a CSV torch validates and lowers to SEND/RECV."""
    from titan_morph.pipelining.search.builders import build

    plan = build(schedule, CostModel.uniform(4, 8, 10.0, 12.0, 8.0, **kw))
    rt = loaded_runtime(write_csv(plan, tmp_path / "s.csv"), 4, 4, 8)
    assert rt.pipeline_order == to_actions(plan)
    assert read_csv(tmp_path / "s.csv") == plan.orders


def test_torch_dump_csv_reads_back(tmp_path: Path) -> None:
    """A CSV written by torch's own ``_dump_csv(..., "compute_only")`` parses to the same orders."""
    rt = loaded_runtime(write_csv(ZB_H1, tmp_path / "s.csv"), 2, 2, 4)
    rt._dump_csv(str(tmp_path / "torch.csv"), "compute_only")
    assert read_csv(tmp_path / "torch.csv") == ZB_H1


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("0F0,0X1\n", "line 1, token 2 '0X1': unknown action kind 'X'"),
        ("0F0,0B0\n1F0,0B0\n", "line 2, token 2 '0B0': stage 0 on rank 1"),
        ("0F0,0SEND_F0\n", "token 2 '0SEND_F0': SEND_F is not a compute action"),
        ("0F0,0F\n", "token 2 '0F': missing microbatch index"),
        ("0F0,F1\n", "token 2 'F1': expected <stage><kind><microbatch>"),
        ("0F0,0B0\n\n1F0,1B0\n", "line 2: rank 1 has no actions"),
        ("", "empty schedule CSV"),
    ],
)
def test_read_csv_errors_name_line_and_token(text: str, needle: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as exc:
        read_csv(path)
    assert needle in str(exc.value)
    assert str(path) in str(exc.value)


def test_read_csv_skips_empty_cells_and_trailing_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "gaps.csv"
    path.write_text("0F0, ,0B0\r\n1F0,,1B0\r\n\r\n")
    assert read_csv(path) == _orders("F0 B0\nF0 B0")


def test_format_orders_grid() -> None:
    text = format_orders(ONE_F_ONE_B, error_step=2)
    lines = text.splitlines()
    assert lines[0].split() == ["Rank", "0", "Rank", "1"]
    assert lines[1].split() == ["Step", "0:", "F0", "F0"]
    assert lines[3].endswith("<-- ERROR HERE") and "B0" in lines[3]
    assert len(lines) == 1 + 8


# --- pictures of simulated runs ------------------------------------------


def _simulated(orders, delays=(0.0,), depth=None):
    from titan_morph.pipelining.timing.simulate import simulate

    model = MODEL.with_delays(delays)
    return simulate(model, orders, depth=depth)


def test_chrome_trace_events(tmp_path: Path) -> None:
    from titan_morph.pipelining.output.export import chrome_trace

    result = _simulated(ZB_H1, delays=(15.0,))
    doc = json.loads(chrome_trace(result, tmp_path / "t.json").read_text())
    ops = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] in "FIWB"]
    assert len(ops) == 3 * 4 * 2
    by_name = {(e["pid"], e["name"]): e for e in ops}
    for stage, timings in enumerate(result.timings):
        for t in timings:
            ev = by_name[(stage, str(t.op))]
            assert ev["ts"] == pytest.approx(t.start * 1000) and ev["dur"] == pytest.approx((t.end - t.start) * 1000)
    flows = [e for e in doc["traceEvents"] if e["ph"] in ("s", "f")]
    assert len(flows) == 2 * 2 * 4  # one forward and one backward message per microbatch, s + f each
    assert doc["otherData"]["makespan_ms"] == pytest.approx(result.makespan)


def test_chrome_trace_blocked_sends(tmp_path: Path) -> None:
    from titan_morph.pipelining.output.export import chrome_trace

    result = _simulated(ZB_H1, delays=(40.0,), depth=1)
    doc = json.loads(chrome_trace(result, tmp_path / "t.json").read_text())
    blocked = [e for e in doc["traceEvents"] if e.get("cat") == "blocked"]
    total = sum(e["dur"] for e in blocked) / 1000
    assert total == pytest.approx(sum(result.blocked_ms))


def test_timeline_png_decodes(tmp_path: Path) -> None:
    from titan_morph.pipelining.output.export import timeline_png

    result = _simulated(ZB_H1, delays=(20.0,), depth=1)
    path = timeline_png(result, tmp_path / "t.png", title="zb-h1 S=2 N=4")
    import matplotlib.image

    img = matplotlib.image.imread(path)
    assert img.shape[0] > 200 and img.shape[1] > 600
    assert img[..., :3].std() > 0.05  # not a blank picture


@pytest.mark.parametrize("depth", [None, 1, 2])
def test_messages_match_the_simulator(depth) -> None:
    """Delivery times replayed from the link model agree with the simulator's ready times."""
    from titan_morph.pipelining.output.export import messages
    from titan_morph.pipelining.search.builders import build
    from titan_morph.pipelining.timing.simulate import simulate

    model = CostModel.uniform(4, 8, 10.0, 10.0, 10.0, delays=(25.0, 0.0, 7.0))
    plan = build("zb-h2", model.with_delays((0.0, 0.0, 0.0)))
    result = simulate(model, plan.orders, depth=depth)
    msgs = messages(result)
    assert len(msgs) == 2 * 3 * 8
    for m in msgs:
        assert m.delivered >= m.accepted + model.delays[m.link] - 1e-9
        if m.direction == "fwd":
            assert m.dst.ready == pytest.approx(m.delivered)
        else:
            own_f = next(t for t in result.timings[m.dst.stage] if t.op == Op("F", m.dst.op.mb))
            assert m.dst.ready == pytest.approx(max(m.delivered, own_f.end))


def test_chrome_trace_link_tracks(tmp_path: Path) -> None:
    from titan_morph.pipelining.output.export import chrome_trace

    result = _simulated(ZB_H1, delays=(15.0,))
    events = json.loads(chrome_trace(result, tmp_path / "t.json").read_text())["traceEvents"]
    begins = [e for e in events if e["ph"] == "b"]
    ends = {e["id"]: e for e in events if e["ph"] == "e"}
    assert len(begins) == 2 * 4 and all(e["pid"] == 2 for e in begins)
    for b in begins:
        assert ends[b["id"]]["ts"] - b["ts"] == pytest.approx(15000.0)
        assert b["args"]["delay_ms"] == pytest.approx(15.0)
