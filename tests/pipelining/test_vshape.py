"""Two stages per rank (the V of ZB-V and DualPipeV): model, generator, timing, baselines, search,
slackness (Eq. 1-V, Alg. 1/2), the CLI's figures re-timed independently, torch's validation and
lowering of the plans, and the gap to the CP-SAT optimum on small instances."""

from __future__ import annotations

import json
import math
import random
import types
from pathlib import Path

import pytest

from tests.torch_release import loaded_runtime
from titan_morph.pipelining.cli import plan as cli
from titan_morph.pipelining.core.model import CostModel, Op, in_flight_peak, validate_orders
from titan_morph.pipelining.output.export import read_csv, write_csv
from titan_morph.pipelining.schedules.baselines import zbv_memory
from titan_morph.pipelining.schedules.event_loop import ALL_POLICY_BITS, REFILL, run_generator
from titan_morph.pipelining.schedules.generate import generate
from titan_morph.pipelining.schedules.slackness import (
    adapted_warmup,
    initial_warmup,
    required_slackness,
    tolerance_ms,
    uniform_warmup,
)
from titan_morph.pipelining.search.builders import build
from titan_morph.pipelining.search.driver import search_detailed
from titan_morph.pipelining.timing.simulate import makespan, simulate
from titan_morph.pipelining.timing.timeline import time_codes, to_codes


def v_model(ranks: int, n: int, t: float = 5.0, **kw) -> CostModel:
    return CostModel.uniform(2 * ranks, n, t, t, t, stages_per_rank=2, **kw)


def scenarios(ranks: int) -> list[list[float]]:
    """No delay, 60 ms on the last link, 60 ms on the first, 30 ms everywhere."""
    last = [0.0] * (ranks - 2) + [60.0]
    return [[0.0] * (ranks - 1), last, last[::-1], [30.0] * (ranks - 1)]


# ---------------------------------------------------------------------------------------------
# Placement and model


def test_v_placement_routes_and_memory() -> None:
    m = v_model(4, 8, memory=8)
    assert [m.rank_of(s) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [m.rank_stages(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert m.ranks == 4 and m.num_links == 3 and m.budget(0) == 8
    assert [m.hop_link(s) for s in range(7)] == [0, 1, 2, None, 2, 1, 0]  # the last rank's hop is local
    assert m.link_hops(2) == (2, 4)
    fwd, bwd = m.routes()
    assert fwd[2] == (2, 0) and fwd[4] == (2, 1) and fwd[3] is None and fwd[7] is None  # 2->3, 3->2
    assert bwd[5] == (2, 0) and bwd[3] == (2, 1) and bwd[4] is None and bwd[0] is None
    with pytest.raises(ValueError, match="memory must be >= 2"):
        v_model(2, 4, memory=1)
    with pytest.raises(ValueError, match="multiple of stages_per_rank"):
        CostModel.uniform(5, 4, 1, 1, 1, stages_per_rank=2)
    with pytest.raises(ValueError, match="delays needs 1 values"):
        CostModel.uniform(4, 4, 1, 1, 1, delays=[1, 2, 3], stages_per_rank=2)
    assert str(Op("F", 3, 5)) == "5F3" and Op.parse("5F3") == Op("F", 3, 5) and Op.parse("F3") == Op("F", 3)


def test_v_orders_must_name_their_stages() -> None:
    m = v_model(2, 1)
    good = ((Op("F", 0, 0), Op("F", 0, 3), Op("I", 0, 3), Op("I", 0, 0), Op("W", 0, 3), Op("W", 0, 0)),)
    good += ((Op("F", 0, 1), Op("F", 0, 2), Op("I", 0, 2), Op("B", 0, 1), Op("W", 0, 2)),)  # B and I/W mixed
    validate_orders(m, good)
    with pytest.raises(ValueError, match="rank 1: op F0 must name its stage"):
        validate_orders(m, (good[0], (Op("F", 0),)))
    with pytest.raises(ValueError, match=r"rank 1: op 0F0 must be on its stages \[1, 2\]"):
        validate_orders(m, (good[0], (Op("F", 0, 0),)))
    bad = (good[0], (Op("F", 0, 1), Op("F", 0, 2), Op("I", 0, 2), Op("B", 0, 2), Op("B", 0, 1), Op("W", 0, 2)))
    with pytest.raises(ValueError, match="stage 2: microbatch 0 has both a fused B and split I/W"):
        validate_orders(m, bad)


# ---------------------------------------------------------------------------------------------
# Baselines against torch's own schedules


def _torch_orders(cls_name: str, ranks: int, n: int) -> tuple[tuple[Op, ...], ...]:
    """torch's per-rank order of ScheduleZBVZeroBubble / ScheduleDualPipeV (no process group: the
    order generator only reads these attributes); overlapped F/B pairs are run one after the other."""
    from torch.distributed.pipelining import schedules

    fake = types.SimpleNamespace(pp_group_size=ranks, _n_microbatches=n, num_stages=2 * ranks)
    out = []
    for r in range(ranks):
        ops = []
        for action in getattr(schedules, cls_name)._calculate_single_rank_operations(fake, r):
            for a in action.sub_actions or (action,) if action is not None else ():
                ops.append(Op(a.computation_type.value, a.microbatch_index, a.stage_index))
        out.append(tuple(ops))
    return tuple(out)


def _without_last_w_run(order: tuple[Op, ...]) -> tuple[tuple[Op, ...], list[Op]]:
    k = len(order)
    while k and order[k - 1].kind == "W":
        k -= 1
    return order[:k], sorted(order[k:], key=lambda op: (op.stage, op.mb))


@pytest.mark.parametrize("ranks, n", [(2, 2), (2, 3), (2, 8), (3, 4), (3, 9), (4, 7), (4, 16), (5, 12), (8, 16)])
def test_zbv_is_torchs_schedule(ranks: int, n: int) -> None:
    """zb-v by the generator equals torch's ZB-V order (the final run of W's may interleave the two
    stages differently, which no dependency sees) and times the same under delays."""
    model = v_model(ranks, n)
    ours = build("zb-v", model).orders
    theirs = _torch_orders("ScheduleZBVZeroBubble", ranks, n)
    for r in range(ranks):
        assert _without_last_w_run(ours[r]) == _without_last_w_run(theirs[r]), f"rank {r}"
        for s in model.rank_stages(r):  # each stage's own W order is torch's
            assert [op for op in ours[r] if op.stage == s] == [op for op in theirs[r] if op.stage == s]
    for delays in scenarios(ranks):
        m = model.with_delays(delays)
        assert makespan(m, ours) == makespan(m, theirs)
    assert [in_flight_peak(o) for o in ours] == [in_flight_peak(o) for o in theirs]


@pytest.mark.parametrize("ranks, n", [(2, 4), (3, 6), (3, 9), (4, 8), (4, 16), (6, 12)])
def test_dualpipev_by_the_generator_times_like_torchs(ranks: int, n: int) -> None:
    """dualpipe-v: DualPipeV's warm-ups and memory in the generator; torch's order also overlaps F/B
    pairs and fuses backwards: the same time with no delay and within 2 % under delays."""
    model = v_model(ranks, n)
    ours = build("dualpipe-v", model)
    theirs = _torch_orders("ScheduleDualPipeV", ranks, n)
    for delays in scenarios(ranks):
        m = model.with_delays(delays)
        a, b = makespan(m, ours.orders), makespan(m, theirs)
        assert a == pytest.approx(b, rel=0.02), (delays, a, b)
        if not any(delays):
            assert a == b
    assert [in_flight_peak(o) for o in ours.orders] == [in_flight_peak(o) for o in theirs] == [2 * ranks + 1] * ranks
    with pytest.raises(ValueError, match="at least as many microbatches as stages"):
        build("dualpipe-v", v_model(ranks, 2 * ranks - 1))


def test_static_baselines_ignore_delays_and_placement_errors() -> None:
    model = v_model(4, 16)
    assert build("zb-v", model.with_delays([0, 0, 60])).orders == build("zb-v", model).orders
    assert build("ZBVZeroBubble", model).schedule == "zb-v" and build("DualPipeV", model).schedule == "dualpipe-v"
    with pytest.raises(ValueError, match="static"):
        build("zb-v", model, refill=True)
    with pytest.raises(ValueError, match="needs stages_per_rank = 2"):
        build("pipemorph-v", CostModel.uniform(4, 8, 1, 1, 1))
    with pytest.raises(ValueError, match="runs one stage per rank"):
        build("zb-h2", model)
    with pytest.raises(ValueError, match="rank 0 needs 8 microbatches in flight"):
        build("zb-v", model.with_memory(7))
    assert zbv_memory(model) == (8, 8, 8, 8)


# ---------------------------------------------------------------------------------------------
# The one generator and the one timing routine over ranks


def test_generator_over_random_v_knobs_never_stalls_and_agrees_with_the_timing() -> None:
    rng = random.Random(7)
    for _ in range(300):
        ranks, n = rng.randint(2, 4), rng.randint(1, 8)
        s_count = 2 * ranks
        x = sorted((rng.randint(1, n) for _ in range(s_count)), reverse=True)
        need = [x[r] + x[s_count - 1 - r] for r in range(ranks)]
        limit = [min(2 * n, v + rng.randint(0, 3)) for v in need]
        policy = [rng.randint(0, ALL_POLICY_BITS) for _ in range(ranks)]
        times = [tuple(float(rng.choice((0.5, 1, 2, 5))) for _ in range(s_count)) for _ in range(3)]
        delays = tuple(float(rng.choice((0, 0, 3, 20))) for _ in range(ranks - 1))
        model = CostModel(s_count, n, *times, delays, stages_per_rank=2)
        span, codes = run_generator(model, x, limit, policy)
        assert codes is not None, f"stalled: x={x} limit={limit} policy={policy} delays={delays}"
        orders = generate(model, x, limit=limit, policy=policy)
        validate_orders(model.with_memory(limit), orders)  # each op once, F < I < W, within the limits
        assert span == pytest.approx(time_codes(model, to_codes(orders, model)).makespan)
        assert span == pytest.approx(makespan(model, orders))


def test_both_legs_share_a_link_fifo() -> None:
    """One FIFO per link and direction, shared by the two hops of the V that cross it: rank 0 sends
    stage 3's gradient (delay 30 ms) and then stage 0's next activation (delay 0 by then) to rank 1;
    the activation cannot overtake the gradient."""
    from titan_morph.pipelining.core.stragglers import TraceDelays, TraceEvent

    model = CostModel.uniform(4, 2, 1.0, 1.0, 1.0, stages_per_rank=2)
    r0 = "0F0 3F0 3I0 0F1 0I0 3W0 3F1 3I1 0I1 3W1 0W0 0W1"
    r1 = "1F0 2F0 1F1 2F1 2I0 1I0 2I1 1I1 2W0 2W1 1W0 1W1"
    orders = tuple(tuple(Op.parse(t) for t in text.split()) for text in (r0, r1))
    links = TraceDelays(1, (TraceEvent(0.0, 0, 30.0), TraceEvent(65.5, 0, 0.0)), key="time_ms")
    result = simulate(model, orders, links=links)
    start = {str(t.op): t.start for t in result.timings[1]}
    assert {str(t.op): t.end for t in result.timings[0]}["3I0"] == 65.0  # its gradient arrives at 95
    assert start["1F1"] == 95.0  # 0F1, sent at 66 with no delay, waits behind it
    assert makespan(model, orders, links=links, depth=1) >= result.makespan


def test_deadlocking_v_orders_name_the_ranks() -> None:
    from titan_morph.pipelining.timing.simulate import DeadlockError

    model = v_model(2, 1)
    r0 = tuple(Op.parse(t) for t in "3F0 0F0 3I0 0I0 3W0 0W0".split())  # waits for stage 2 before feeding it
    r1 = tuple(Op.parse(t) for t in "1F0 2F0 2I0 1I0 2W0 1W0".split())
    with pytest.raises(DeadlockError) as info:
        makespan(model, (r0, r1))
    assert "rank 0 waits for 3F0 (needs 2F0 from rank 1, which is stuck behind 1F0" in str(info.value)
    assert "rank 1 waits for 1F0 (needs 0F0 from rank 0, which is stuck behind 3F0" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Slackness in the V: Eq. 1-V, Alg. 1 and Alg. 2


def test_eq1_v_tolerance_and_required_slackness() -> None:
    model = v_model(4, 16, t=10.0, delays=[0, 0, 50])
    x = uniform_warmup(8, 16, 2, stages_per_rank=2)
    assert x == (13, 11, 9, 7, 7, 5, 3, 1)  # no slackness across the last rank's local hop
    # P = F + B of the downstream rank's two stages = 40 ms: (2 * 40 - 20) / 2 = 30 ms on every link
    assert [tolerance_ms(model, x, link) for link in range(3)] == [30.0, 30.0, 30.0]
    need = required_slackness(model, 2)
    assert need == 3 and (need * 40 - 20) / 2 >= 50 > ((need - 1) * 40 - 20) / 2
    one = CostModel.uniform(4, 8, 10, 10, 10)
    assert tolerance_ms(one, (7, 5, 3, 1), 0) == 10.0  # one stage per rank: Eq. 1, (Δ - 1) t


@pytest.mark.parametrize("link", [0, 2])
def test_delays_within_the_v_tolerance_are_absorbed(link: int) -> None:
    """Plans generated for a delay c on a link with uniform slackness Δ add O(c) when c is within
    Eq. 1-V's tolerance: at most the link's four crossings on one microbatch's round trip."""
    for delta in (1, 2, 3):
        x = uniform_warmup(8, 32, delta, stages_per_rank=2)
        limit = [x[r] + x[7 - r] for r in range(4)]
        base = v_model(4, 32, t=10.0)
        none = makespan(base, generate(base, x, limit=limit, policy=REFILL))
        tol = tolerance_ms(base, x, link)
        for c in range(10, int(tol) + 1, 10):
            delays = [0.0] * 3
            delays[link] = float(c)
            m = base.with_delays(delays)
            extra = makespan(m, generate(m, x, limit=limit, policy=REFILL)) - none
            assert extra <= 4 * c + 1e-9, (delta, c, extra)


def test_v_alg1_and_alg2_respect_the_rank_budgets() -> None:
    # ZB-V's memory (2R per rank) buys slackness 1 on every hop that crosses a link
    assert initial_warmup(8, 16, 8, stages_per_rank=2) == (7, 6, 5, 4, 4, 3, 2, 1)
    assert initial_warmup(8, 16, 12, stages_per_rank=2) == (11, 9, 7, 5, 5, 3, 2, 1)
    with pytest.raises(ValueError, match="at least 2 microbatch"):
        initial_warmup(8, 16, 1, stages_per_rank=2)
    for delays in ([0, 0, 60], [60, 0, 0], [30, 30, 30]):
        model = v_model(4, 16, delays=delays, memory=8)
        x = adapted_warmup(model)
        assert all(x[r] + x[7 - r] <= 8 for r in range(4)) and list(x) == sorted(x, reverse=True)
        free = adapted_warmup(v_model(4, 64, delays=delays))  # no budget, enough microbatches
        for link, c in enumerate(delays):
            if c:
                assert tolerance_ms(model, free, link) >= c  # unconstrained Alg. 2 meets Eq. 1-V


# ---------------------------------------------------------------------------------------------
# The issue's figures, from the CLI, re-timed by an independent executor


def _retime(data: dict, run_delays: list[float]) -> float:
    """An independent list-scheduling executor over the CLI's JSON: ranks run their orders in
    sequence; an F waits for the previous stage's F plus the delay of the link between the ranks
    (none on one rank), an I (or B) for the next stage's I plus that delay, a W for its own I."""
    rank_of, times = data["stage_ranks"], {"F": data["fwd_ms"], "I": data["bwd_ms"], "W": data["wgt_ms"]}
    last = data["stages"] - 1
    orders = {int(r): [Op.parse(t) for t in ops] for r, ops in data["orders"].items()}
    done: dict[tuple[str, int, int], float] = {}
    pos, free = dict.fromkeys(orders, 0), dict.fromkeys(orders, 0.0)

    def hop(a: int, b: int) -> float:
        ra, rb = rank_of[a], rank_of[b]
        return 0.0 if ra == rb else run_delays[min(ra, rb)]

    moved = True
    while moved:
        moved = False
        for r, order in orders.items():
            while pos[r] < len(order):
                op = order[pos[r]]
                s = op.stage
                if op.kind == "F":
                    dep = None if s == 0 else ("F", s - 1, op.mb)
                elif op.kind in ("I", "B"):
                    dep = ("F", s, op.mb) if s == last else ("I", s + 1, op.mb)
                else:
                    dep = ("I", s, op.mb)
                if dep is not None and dep not in done:
                    break
                ready = 0.0 if dep is None else done[dep] + (hop(dep[1], s) if dep[1] != s else 0.0)
                took = times["I"][s] + times["W"][s] if op.kind == "B" else times[op.kind][s]
                end = max(free[r], ready) + took
                done[("I" if op.kind == "B" else op.kind, s, op.mb)] = end
                free[r], pos[r], moved = end, pos[r] + 1, True
    assert all(pos[r] == len(o) for r, o in orders.items()), "the orders deadlock"
    return max(free.values())


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    base = ["--stages", "4", "--microbatches", "16", "--fwd", "5", "--bwd", "5", "--wgt", "5", "--json"]
    assert cli.main([*base, *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_issue_figures_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """R=4, N=16, F=B=W=5 ms: ZB-V 495 ms, 1555 / 1455 ms with 60 ms on the last / first link;
    PipeMorph-V within 2 % of ZB-V with no delay and >= 1.5x faster at 60 ms, holding no more
    activations per rank than ZB-V (its default budget)."""
    zbv = {}
    for name, delays in (("none", "0,0,0"), ("last", "0,0,60"), ("first", "60,0,0")):
        data = _cli(capsys, "--schedule", "zb-v", "--run-delays", delays)
        assert data["stages_per_rank"] == 2 and data["ranks"] == 4 and data["stage_ranks"] == [0, 1, 2, 3, 3, 2, 1, 0]
        assert all(len(t) >= 3 and t[0].isdigit() for ops in data["orders"].values() for t in ops)  # "5F3"
        assert _retime(data, data["run_delays_ms"]) == data["makespan_ms"]
        zbv[name] = data
    assert [zbv[k]["makespan_ms"] for k in ("none", "last", "first")] == [495.0, 1555.0, 1455.0]
    for name, delays in (("none", "0,0,0"), ("last", "0,0,60"), ("first", "60,0,0")):
        data = _cli(capsys, "--schedule", "pipemorph-v", "--delays", delays)
        assert data["memory"] == [8, 8, 8, 8] and data["peak_in_flight"] == zbv[name]["peak_in_flight"]
        assert _retime(data, data["run_delays_ms"]) == data["makespan_ms"]
        if name == "none":
            assert data["makespan_ms"] <= 1.02 * zbv[name]["makespan_ms"]
        else:
            assert zbv[name]["makespan_ms"] >= 1.5 * data["makespan_ms"], (name, data["makespan_ms"])
    dual = _cli(capsys, "--schedule", "dualpipe-v", "--run-delays", "0,0,60")
    assert _retime(dual, dual["run_delays_ms"]) == dual["makespan_ms"]


def test_cli_v_errors(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--stages", "4", "--microbatches", "16"]
    for args, needle in (
        (["--schedule", "zb-v", "--stages-per-rank", "1"], "--stages-per-rank 1 disagrees with --schedule zb-v"),
        (["--schedule", "pipemorph-v", "--memory", "1"], "--memory: 1 is out of range"),
        (["--schedule", "zb-h2", "--stages-per-rank", "2"], "--stages-per-rank 2 disagrees"),
        (["--schedule", "pipemorph-v", "--fwd", "1,2,3"], "--fwd needs 1 or 8 values"),
        (["--stages-per-rank", "3"], "--stages-per-rank must be 1 or 2"),
    ):
        assert cli.main([*base, *args]) == 2, args
        assert needle in capsys.readouterr().err, args


# ---------------------------------------------------------------------------------------------
# torch's validation and lowering, CSV


def test_v_plans_pass_torch_validation_and_lowering(tmp_path: Path) -> None:
    """torch's _load_csv validates each V plan (_validate_schedule), maps stages to ranks as the V,
    lowers it with SEND/RECV (none across the last rank's local hop), and its comms dry run
    completes without a send/recv deadlock."""
    from torch.distributed.pipelining.schedules import _simulate_comms_compute

    from titan_morph.runtime.actions import to_actions

    model = v_model(3, 6, delays=[0, 40], memory=6)
    plans = [build("zb-v", model), build("dualpipe-v", model.with_memory(None)), build("pipemorph-v", model)]
    plans.append(build("pipemorph-v", model, search=True, iterations=80))
    for plan in plans:
        path = write_csv(plan, tmp_path / f"{plan.schedule}.csv")
        assert read_csv(path) == plan.orders
        rt = loaded_runtime(path, 3, 6, 6)
        assert rt.pipeline_order == to_actions(plan)
        assert rt.stage_index_to_group_rank == {0: 0, 1: 1, 2: 2, 3: 2, 4: 1, 5: 0}
        lowered = {r: [str(a) for a in acts] for r, acts in rt.pipeline_order_with_comms.items()}
        assert "2SEND_F0" not in lowered[2] and "3RECV_F0" not in lowered[2]  # local hop on rank 2
        assert "3SEND_F0" in lowered[2] and "4RECV_F0" in lowered[1]
        kept = {"F", "I", "W", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B"}
        comms = {
            r: [a for a in acts if a.computation_type.value in kept] for r, acts in rt.pipeline_order_with_comms.items()
        }
        _simulate_comms_compute(comms, rt.stage_index_to_group_rank.__getitem__, 6)


def test_csv_refuses_stages_off_the_v(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("0F0,3F0,3I0,0I0,3W0,0W0\n1F0,2F0,2I0,1I0,2W0,0W0\n")
    with pytest.raises(ValueError, match="line 2, token 6 '0W0': stage 0 on rank 1"):
        read_csv(path)


# ---------------------------------------------------------------------------------------------
# The search and the exact optimum


def test_search_in_the_v_is_deterministic_monotone_and_within_memory() -> None:
    model = v_model(3, 8, delays=[0, 40], memory=6)
    short = search_detailed(model, iterations=40)
    long = search_detailed(model, iterations=160)
    again = search_detailed(model, iterations=160)
    assert long.plan.plan_id == again.plan.plan_id and long.makespan <= short.makespan
    assert long.plan.schedule == "pipemorph-v"
    validate_orders(model, long.plan.orders)
    assert long.makespan == makespan(model, long.plan.orders)
    assert long.makespan <= min(v for k, v in long.seeds.items() if math.isfinite(v))
    assert long.makespan < makespan(model, build("zb-v", model).orders)


@pytest.mark.parametrize(
    ("ranks", "n", "delays"),
    [(2, 4, [20.0]), (2, 6, [30.0]), pytest.param(3, 6, [30.0, 0.0], marks=pytest.mark.slow)],
)
def test_search_within_5_percent_of_the_v_optimum(ranks: int, n: int, delays: list[float]) -> None:
    pytest.importorskip("ortools")
    from titan_morph.pipelining.reference.exact import optimal_makespan
    from titan_morph.pipelining.timing.bounds import lower_bound_ms

    model = v_model(ranks, n, delays=delays)
    model = model.with_memory(zbv_memory(model))
    exact = optimal_makespan(model, time_limit_s=30)
    assert exact.optimal or ranks > 2, exact.status  # 2 ranks: proven within seconds
    validate_orders(model, exact.orders)  # each op once, per-rank memory
    assert exact.makespan == makespan(model, exact.orders)
    assert exact.lower_bound <= exact.makespan
    if ranks == 2:  # the closed form against the optimum solved without it as a constraint
        free = optimal_makespan(model, time_limit_s=30, use_bound=False)
        assert free.optimal, free.status
        assert free.makespan == pytest.approx(exact.makespan)
        assert lower_bound_ms(model) <= free.makespan + 1e-9
    found = search_detailed(model).makespan
    assert exact.lower_bound <= found <= 1.05 * exact.makespan
