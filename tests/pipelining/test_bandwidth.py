"""The bandwidth link model: latency plus a per-message transmit time, one message at a time per
(link, direction) in issue order. Timing by hand, an independent executor written here, the
generator's own timeline, the zero-transmit identity, and PipeMorph against the CP-SAT optimum."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from titan_morph.pipelining.core.links import LinkQueue, StaticDelays, WithTransmit
from titan_morph.pipelining.core.model import CostModel, Op
from titan_morph.pipelining.core.stragglers import RandomDelays
from titan_morph.pipelining.reference.instances import random_instance
from titan_morph.pipelining.schedules.event_loop import run_generator
from titan_morph.pipelining.schedules.generate import generate
from titan_morph.pipelining.search.builders import build
from titan_morph.pipelining.search.driver import search_detailed
from titan_morph.pipelining.timing.simulate import makespan, simulate
from titan_morph.pipelining.timing.timeline import time_codes, to_codes


def _ops(text: str) -> tuple[Op, ...]:
    return tuple(Op.parse(t) for t in text.split())


def execute(model: CostModel, orders: Sequence[Sequence[Op]]) -> float:
    """An independent executor of the issue's model (one stage per rank): repeatedly run, on every
    stage, the next op of its order whose input has arrived; a message issued at t on a (link,
    direction) arrives at max(t, end of the wire's previous transmission) + transmit + latency."""
    s_count = model.stages
    pos = [0] * s_count
    free = [0.0] * s_count
    done: dict[tuple[int, str, int], float] = {}
    arrive: dict[tuple[int, str, int], float] = {}  # (receiving stage, kind of input, mb) -> arrival
    wire: dict[tuple[int, int], float] = {}

    def send(link: int, direction: int, t: float) -> float:
        start = max(t, wire.get((link, direction), -math.inf))
        wire[(link, direction)] = start + model.transmit[link]
        return start + model.transmit[link] + model.delays[link]

    progress = True
    while progress:
        progress = False
        for s in range(s_count):
            while pos[s] < len(orders[s]):
                op = orders[s][pos[s]]
                if op.kind == "F":
                    ready = 0.0 if s == 0 else arrive.get((s, "F", op.mb))
                elif op.kind == "W":
                    ready = done[(s, "I", op.mb)]
                else:
                    ready = done[(s, "F", op.mb)] if s == s_count - 1 else arrive.get((s, "I", op.mb))
                if ready is None:
                    break
                start = max(free[s], ready)
                end = start + model.duration(s, op.kind)
                free[s] = end
                done[(s, "I" if op.kind == "B" else op.kind, op.mb)] = end
                if op.kind == "F" and s < s_count - 1:
                    arrive[(s + 1, "F", op.mb)] = send(s, 0, end)
                if op.kind in ("I", "B") and s > 0:
                    arrive[(s - 1, "I", op.mb)] = send(s - 1, 1, end)
                pos[s] += 1
                progress = True
    assert all(p == len(o) for p, o in zip(pos, orders)), "the orders deadlock"
    return max(free)


HAND_ORDERS = (_ops("F0 F1 I0 W0 I1 W1"), _ops("F0 F1 I0 I1 W0 W1"))


def test_hand_worked_two_stages() -> None:
    """S = 2, N = 2, F = I = W = 10, link 0: latency 5, transmit 15. Stage 0 sends F0 at 10 (wire
    10–25, arrives 30) and F1 at 20 (queued: wire 25–40, arrives 45). Stage 1 runs F0 30–40, F1
    45–55, I0 55–65 (wire 65–80, arrives 85), I1 65–75 (queued: wire 80–95, arrives 100), W0, W1
    to 95. Stage 0: I0 85–95, W0 95–105, I1 105–115, W1 115–125."""
    model = CostModel.uniform(2, 2, 10, 10, 10, delays=5, transmit=15)
    result = simulate(model, HAND_ORDERS)
    starts = {(t.stage, str(t.op)): t.start for ts in result.timings for t in ts}
    assert starts[(1, "F1")] == 45.0 and starts[(1, "I1")] == 65.0
    assert starts[(0, "I0")] == 85.0 and starts[(0, "I1")] == 105.0
    assert result.makespan == 125.0
    # The delay-only model with the same per-message cost (c = 20) does not queue: 120 ms.
    assert makespan(CostModel.uniform(2, 2, 10, 10, 10, delays=20), HAND_ORDERS) == 120.0
    assert execute(model, HAND_ORDERS) == 125.0


def test_link_queue_transmits_one_message_at_a_time() -> None:
    links = StaticDelays((5.0,), transmit=(15.0,), transmit_bwd=(2.0,))
    fwd = LinkQueue(links, 0, "fwd")
    first, second, later = fwd.send(10.0), fwd.send(20.0), fwd.send(100.0)
    assert (first.delivered, second.delivered, later.delivered) == (30.0, 45.0, 120.0)
    assert second.on_wire == (25.0, 40.0) and later.on_wire == (100.0, 115.0)
    bwd = LinkQueue(links, 0, "bwd")
    assert bwd.send(0.0).delivered == 7.0 and bwd.send(1.0).delivered == 9.0
    # Latency from any delay model, bandwidth on top: the same per-link description.
    wrapped = WithTransmit(RandomDelays(1, 10.0, 0.0, (5.0, 5.0)), (15.0,))
    q = LinkQueue(wrapped, 0, "fwd")
    assert q.send(0.0).delivered == 25.0 and q.send(0.0).delivered == 40.0
    assert wrapped.transmit_snapshot() == (15.0,) and wrapped.snapshot() == (10.0,)
    with pytest.raises(ValueError, match="transmit"):
        StaticDelays((0.0,), transmit=(-1.0,))
    with pytest.raises(ValueError, match="transmit"):
        CostModel.uniform(3, 4, 1, 1, 1, transmit=(1.0,))


def _random_case(seed: int) -> tuple[CostModel, tuple[tuple[Op, ...], ...]]:
    rng = random.Random(seed)
    model = random_instance(rng, s_range=(2, 5), memory="mixed")
    transmit = tuple(rng.choice((0.0, 0.0, float(rng.randint(5, 30)))) for _ in range(model.num_links))
    model = model.with_transmit(transmit)
    k = rng.randrange(3)
    x = [min(model.microbatches, 1 + k * (model.stages - 1 - s)) for s in range(model.stages)]
    orders = generate(model.with_memory(None), x, policy=rng.randrange(16))
    return model, orders


@pytest.mark.parametrize("seed", range(12))
def test_every_timing_path_agrees(seed: int) -> None:
    """The arithmetic branch, the link-queue branch, the generator's own timeline and the
    independent executor give the same makespan, exactly."""
    model, orders = _random_case(seed)
    tf = model.transmit
    arithmetic = makespan(model, orders)
    queued = makespan(model, orders, links=WithTransmit(StaticDelays(model.delays), tf))
    assert arithmetic == queued == execute(model, orders)
    codes = to_codes(orders)
    assert time_codes(model, codes, delays=(model.delays, model.delays)).makespan == arithmetic
    free = model.with_memory(None)
    for x in ((1,) * model.stages, tuple(range(model.stages, 0, -1))):
        x = tuple(min(v, model.microbatches) for v in x)
        span, got = run_generator(free, x, x, (seed % 16,) * model.ranks)
        assert got is not None and span == makespan(model, _from(got)) == execute(model, _from(got))


def _from(codes: list[list[tuple[int, int]]]) -> list[list[Op]]:
    return [[Op("FIW"[c], m) for c, m in order] for order in codes]


@pytest.mark.parametrize("seed", range(6))
def test_zero_transmit_is_the_delay_only_model(seed: int) -> None:
    """Transmit 0 on every link is the paper's model bit for bit, on every path."""
    model, orders = _random_case(seed)
    plain = model.with_transmit(0.0)
    again = CostModel(plain.stages, plain.microbatches, plain.fwd, plain.bwd, plain.wgt, plain.delays, plain.memory)
    assert plain == again
    ref = simulate(plain, orders)
    assert simulate(plain, orders, links=WithTransmit(StaticDelays(plain.delays), (0.0,) * plain.num_links)) == ref
    assert simulate(plain, orders, links=StaticDelays(plain.delays, transmit=(0.0,) * plain.num_links)) == ref
    assert generate(plain, (1,) * plain.stages) == generate(
        plain, (1,) * plain.stages, links=StaticDelays(plain.delays)
    )


def test_transmit_never_speeds_a_plan_up() -> None:
    for seed in range(8):
        model, orders = _random_case(seed)
        assert makespan(model, orders) >= makespan(model.with_transmit(0.0), orders)


# The table: S = 4, N = 24, F = B = W = 10 ms, transmit tau on the last link; the CP-SAT
# optimum under the bandwidth model (memory unbounded), from the issue.
OPTIMUM = {15.0: 765.0, 20.0: 770.0, 25.0: 775.0, 30.0: 840.0}


@pytest.mark.parametrize("tau", sorted(OPTIMUM))
def test_pipemorph_within_two_percent_of_the_optimum(tau: float) -> None:
    model = CostModel.uniform(4, 24, 10, 10, 10, transmit=(0.0, 0.0, tau))
    result = search_detailed(model)
    assert result.makespan == makespan(model, result.plan.orders) == execute(model, result.plan.orders)
    assert result.makespan <= 1.02 * OPTIMUM[tau]
    # ZB-H2 (planned for no delay) is far off: the table's last column.
    zb = build("zb-h2", model.with_transmit(0.0))
    assert makespan(model, zb.orders) == {15.0: 840.0, 20.0: 920.0, 25.0: 1010.0, 30.0: 1100.0}[tau]


def _stage_orders(n: int, cap: int) -> list[tuple[Op, ...]]:
    """Every order of one stage's ops (F < I < W per microbatch, at most ``cap`` in flight)."""
    out: list[tuple[Op, ...]] = []

    def extend(prefix: tuple[Op, ...], done: list[int], live: int) -> None:
        if len(prefix) == 3 * n:
            out.append(prefix)
            return
        for m in range(n):
            k = done[m]
            if k == 3 or (k == 0 and live >= cap):
                continue
            done[m] += 1
            extend((*prefix, Op("FIW"[k], m)), done, live + (k == 0) - (k == 1))
            done[m] -= 1

    extend((), [0] * n, 0)
    return out


def brute_force(model: CostModel) -> float:
    """The best makespan over every combination of valid stage orders, by the executor above."""
    per_stage = [_stage_orders(model.microbatches, model.budget(s)) for s in range(model.stages)]
    best = math.inf
    for orders in itertools.product(*per_stage):
        try:
            best = min(best, execute(model, orders))
        except AssertionError:  # deadlock
            continue
    return best


def _tiny() -> list[CostModel]:
    rng = random.Random(7)
    out = [CostModel.uniform(2, 2, 1, 1, 1, transmit=10)]  # the wire's load is the whole story: 35
    for stages, memory in ((2, None), (2, (1, 1)), (3, None), (3, (2, 1, 1)), (2, None), (3, None)):

        def times(k: int = stages) -> tuple[float, ...]:
            return tuple(float(rng.randint(1, 8)) for _ in range(k))

        delays = tuple(float(rng.choice((0, rng.randint(1, 10)))) for _ in range(stages - 1))
        transmit = tuple(float(rng.randint(3, 12)) for _ in range(stages - 1))
        out.append(CostModel(stages, 2, times(), times(), times(), delays, memory, transmit=transmit))
    return out


TINY = _tiny()


def test_the_wire_load_bound_is_attained_by_hand() -> None:
    """S = 2, N = 2, F = I = W = 1, transmit 10: the forward wire sends at 1 and 11 (last arrival
    21), then F, I, a 10 ms gradient and I, W on stage 0: 35 = 1 + 2·10 + 14, the bound; the
    per-stage bounds alone (the wire's cost once per hop) give less."""
    from titan_morph.pipelining.timing.bounds import lower_bound_ms

    assert brute_force(TINY[0]) == 35.0 == lower_bound_ms(TINY[0])


@pytest.mark.parametrize("idx", range(len(TINY)))
def test_exact_no_overlap_model_equals_the_brute_force(idx: int) -> None:
    """CP-SAT with each wire a no-overlap resource in issue order finds the brute force's optimum,
    without the closed-form bounds and with them; the bounds stay below it."""
    pytest.importorskip("ortools", reason="reference/exact.py needs OR-Tools (dev dependency)")
    from titan_morph.pipelining.reference.exact import optimal_makespan
    from titan_morph.pipelining.timing.bounds import lower_bound_ms

    model = TINY[idx]
    best = brute_force(model)
    free = optimal_makespan(model, time_limit_s=20, use_bound=False, use_default_hint=False)
    assert free.optimal and free.makespan == best, (free, best)
    assert execute(model, free.orders) == best
    assert lower_bound_ms(model) <= best
    bounded = optimal_makespan(model, time_limit_s=20)
    assert bounded.optimal and bounded.makespan == best


def _cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    from titan_morph.pipelining.plan import main

    assert main([*argv, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


@pytest.mark.parametrize("schedule", ["pipemorph", "zb-h2"])
def test_cli_json_makespan_equals_an_independent_execution(capsys: pytest.CaptureFixture[str], schedule: str) -> None:
    """The CLI plans under --delays/--transmit-ms and runs under --run-delays/--run-transmit-ms; its
    makespans equal the executor above on its own orders under each model."""
    from titan_morph.pipelining.output.export import load_orders_json

    argv = ["--stages", "4", "--microbatches", "8", "--schedule", schedule, "--search-iterations", "30"]
    argv = argv[:-2] if schedule != "pipemorph" else argv
    out = _cli_json(
        capsys,
        *argv,
        *("--delays", "0,5,0", "--transmit-ms", "0,0,15", "--run-delays", "3,0,2", "--run-transmit-ms", "0,20,10"),
    )
    assert out["transmit_ms"] == [0.0, 0.0, 15.0] and out["run_transmit_ms"] == [0.0, 20.0, 10.0]
    orders = load_orders_json(out["orders"])  # type: ignore[arg-type]
    base = CostModel.uniform(4, 8, 10, 10, 10)
    planned = base.with_delays((0.0, 5.0, 0.0)).with_transmit((0.0, 0.0, 15.0))
    ran = base.with_delays((3.0, 0.0, 2.0)).with_transmit((0.0, 20.0, 10.0))
    assert out["planned_makespan_ms"] == execute(planned, orders)
    assert out["makespan_ms"] == execute(ran, orders)
    assert out["makespan_ms"] != execute(ran.with_transmit(0.0), orders)  # the transmit time counts
    assert float(out["lower_bound_ms"]) <= float(out["makespan_ms"])  # type: ignore[arg-type]


def test_cli_transmit_flags(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from titan_morph.pipelining.plan import main

    trace = tmp_path / "t.json"
    argv = ["--stages", "3", "--microbatches", "4", "--schedule", "zb-h1", "--transmit-ms", "12"]
    assert main([*argv, "--chrome-trace", str(trace)]) == 0
    text = capsys.readouterr().out
    assert "transmit [12, 12] ms per message" in text
    wires = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "wire"]
    assert len(wires) == 2 * 2 * 4 and all(e["dur"] == 12000.0 for e in wires)  # 2 links x 2 directions x N
    assert main([*argv[:-1], "inf"]) == 2
    assert "--transmit-ms" in capsys.readouterr().err
    assert main([*argv, "--run-transmit-ms", "1,2,3"]) == 2
    assert "--run-transmit-ms needs 2 values" in capsys.readouterr().err
    # A time-varying latency model gets the run transmit times on top.
    out = _cli_json(capsys, *argv, "--run-random", "5,0,10,10")
    assert "transmit [12, 12] ms per message" in str(out["run_links"])


def test_alg2_takes_latency_plus_transmit_and_the_generator_queues() -> None:
    """Alg. 2 under bandwidth: Eq. 1 with c + tau; the generator then times the warm-up bursts on
    the wire, which the delay-only plan for a delay tau misjudges (the issue's 890 and 1010 ms)."""
    from titan_morph.pipelining.schedules.slackness import adapted_warmup, required_slackness, tolerates

    for tau in OPTIMUM:
        model = CostModel.uniform(4, 24, 10, 10, 10, delays=(0.0, 3.0, 2.0), transmit=(0.0, 0.0, tau))
        as_delay = model.with_delays((0.0, 3.0, 2.0 + tau)).with_transmit(0.0)
        assert adapted_warmup(model) == adapted_warmup(as_delay)
        assert (
            required_slackness(model, 2) == required_slackness(as_delay, 2) == math.ceil((20 + 2 * (2 + tau)) / 20)
        )  # Eq. 1
        x = adapted_warmup(model)
        assert tolerates(model, x, 2) and not tolerates(model, (x[0], x[1], x[2] - 1, 1), 2)
    spans = {}
    for tau in OPTIMUM:
        model = CostModel.uniform(4, 24, 10, 10, 10, transmit=(0.0, 0.0, tau))
        plan = build("pipemorph", model)  # no search
        spans[tau] = makespan(model, plan.orders)
        old = build("pipemorph", model.with_delays((0.0, 0.0, tau)).with_transmit(0.0))
        assert makespan(model, old.orders) == {15.0: 765.0, 20.0: 770.0, 25.0: 890.0, 30.0: 1010.0}[tau]
    assert spans == OPTIMUM


def test_the_v_placement_shares_each_wire_between_its_two_hops() -> None:
    """In the V a link carries two hops per direction; both queue on the same wire. The arithmetic
    branch, the link queues and the generator's timeline agree, and the search scores what the
    simulator times."""
    from titan_morph.pipelining.output.export import messages

    model = CostModel.uniform(6, 6, 10, 12, 8, delays=(0.0, 4.0), stages_per_rank=2, transmit=(15.0, 0.0))
    plan = build("pipemorph-v", model)
    span = makespan(model, plan.orders)
    assert span == makespan(model, plan.orders, links=WithTransmit(StaticDelays(model.delays), model.transmit))
    assert span > makespan(model.with_transmit(0.0), plan.orders)
    for direction in ("fwd", "bwd"):  # 2 hops x N messages on link 0's wire, one at a time
        sent = sorted(m.wire for m in messages(simulate(model, plan.orders)) if (m.link, m.direction) == (0, direction))
        assert len(sent) == 2 * model.microbatches and all(end - start == 15.0 for start, end in sent)
        assert all(a[1] <= b[0] for a, b in zip(sent, sent[1:]))
    found = search_detailed(model, iterations=40)
    assert found.makespan == makespan(model, found.plan.orders) <= span


# ---- rates instead of times: links.Bandwidth (bytes x 8 / rate), random rate draws, a trace's rate column


def test_bandwidth_turns_a_rate_into_the_transmit_time_of_each_message_size():
    from titan_morph.pipelining.core.links import Bandwidth, transmit_ms_of

    # 64 KiB at 50 Mbit/s = 524288 bits / 50000 bits per ms; the gradients of link 1 are 16 KiB
    model = Bandwidth(StaticDelays((0.0, 5.0)), (50.0, 10.0), ((65536, 65536), (65536, 16384)))
    assert model.transmit_ms(0, "fwd") == pytest.approx(65536 * 8 / 50_000)
    assert model.transmit_ms(1, "bwd") == pytest.approx(16384 * 8 / 10_000)
    assert (model.delay_ms(1, "fwd"), model.rate_mbit(0, "bwd")) == (5.0, 50.0)
    assert Bandwidth(StaticDelays((0.0,)), (0.0,), ((10**9, 10**9),)).transmit_ms(0, "fwd") == 0.0  # unlimited
    assert transmit_ms_of(125_000, 1.0) == 1000.0  # 1 Mbit at 1 Mbit/s: one second
    # back-to-back messages leave the wire one transmit time apart, the latency on top
    queue = LinkQueue(model, 1, "fwd", depth=None)
    tau = 65536 * 8 / 10_000
    delivered = [queue.send(0.1 * i).delivered for i in range(4)]
    assert delivered == pytest.approx([(i + 1) * tau + 5.0 for i in range(4)])
    for bad in (dict(rates=(1.0,)), dict(rates=(-1.0, 1.0)), dict(sizes=((1, -1), (1, 1)))):
        with pytest.raises(ValueError):
            Bandwidth(StaticDelays((0.0, 0.0)), bad.get("rates", (1.0, 1.0)), bad.get("sizes", ((1, 1), (1, 1))))


def test_random_rates_are_redrawn_with_the_delays_and_leave_the_delays_unchanged():
    plain = RandomDelays(3, 20.0, 10.0, (100.0, 200.0), seed=5, links=(0, 2))
    rated = RandomDelays(3, 20.0, 10.0, (100.0, 200.0), seed=5, links=(0, 2), rates=(10.0, 40.0))
    again = RandomDelays(3, 20.0, 10.0, (100.0, 200.0), seed=5, links=(0, 2), rates=(10.0, 40.0))
    times = [t * 7.0 for t in range(1500)]
    for link in (0, 2):
        assert [rated.delay_ms(link, "fwd", t) for t in times] == [plain.delay_ms(link, "fwd", t) for t in times]
        rates = [rated.rate_mbit(link, "fwd", t) for t in times]
        assert rates == [again.rate_mbit(link, "bwd", t) for t in times]  # deterministic, both directions
        assert all(10.0 <= r <= 40.0 for r in rates)
        delays = [rated.delay_ms(link, "fwd", t) for t in times]
        changes = {i for i in range(1, len(times)) if delays[i] != delays[i - 1]}
        assert {i for i in range(1, len(times)) if rates[i] != rates[i - 1]} == changes and len(changes) > 20
    assert rated.rate_mbit(1, "fwd", 500.0) is None and plain.rate_mbit(0, "fwd") is None  # not straggling: unset
    fresh = RandomDelays(3, 20.0, 10.0, (100.0, 200.0), seed=5, links=(0, 2), rates=(10.0, 40.0))
    fresh.delay_ms(0, "fwd", 60_000.0)  # the cache moved on: an early time is replayed from the seed
    assert fresh.rate_mbit(0, "fwd", 150.0) == again.rate_mbit(0, "fwd", 150.0)
    with pytest.raises(ValueError, match="rates"):
        RandomDelays(3, 20.0, 10.0, (100.0, 200.0), rates=(40.0, 10.0))
    # through Bandwidth: the transmit time follows the drawn rate; the quiet link keeps the configured one
    from titan_morph.pipelining.core.links import Bandwidth

    model = Bandwidth(rated, (100.0, 100.0, 100.0), ((12_500, 12_500),) * 3)
    assert model.transmit_ms(0, "fwd", 900.0) == pytest.approx(100.0 / rated.rate_mbit(0, "fwd", 900.0))
    assert model.transmit_ms(1, "fwd", 900.0) == pytest.approx(1.0)


def test_trace_rate_column_sets_rates_per_event_empty_is_unlimited(tmp_path):
    from titan_morph.pipelining.core.links import Bandwidth
    from titan_morph.pipelining.core.stragglers import TraceDelays

    path = tmp_path / "trace.csv"
    path.write_text("step,link,delay_ms,bandwidth_mbit\n2,0,10,50\n4,0,0,\n3,1,5,20\n")
    trace = TraceDelays.from_csv(path, 2)
    assert trace.has_rates
    assert [trace.rate_mbit(0, "fwd", step=s) for s in (1, 2, 3, 4)] == [None, 50.0, 50.0, 0.0]
    model = Bandwidth(trace, (100.0, 100.0), ((62_500, 62_500),) * 2)  # 0.5 Mbit per message
    assert [model.transmit_ms(0, "bwd", step=s) for s in (1, 2, 4)] == pytest.approx([5.0, 10.0, 0.0])
    assert model.transmit_ms(1, "fwd", step=3) == pytest.approx(25.0)
    trace.to_csv(tmp_path / "again.csv")
    back = TraceDelays.from_csv(tmp_path / "again.csv", 2)
    assert [back.rate_mbit(0, "fwd", step=s) for s in (1, 2, 4)] == [None, 50.0, 0.0]
    assert not TraceDelays.from_csv(_plain_trace(tmp_path), 2).has_rates
    path.write_text("step,link,delay_ms,bandwidth_mbit\n2,0,10,-5\n")
    with pytest.raises(ValueError, match="bandwidth_mbit"):
        TraceDelays.from_csv(path, 2)


def _plain_trace(tmp_path: Path) -> Path:
    path = tmp_path / "plain.csv"
    path.write_text("step,link,delay_ms\n2,0,10\n")
    return path
