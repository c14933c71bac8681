"""The Monitor (pure): profiles in, plan changes out -- slow link, recovery, and the profiled initial plan."""

from __future__ import annotations

from dataclasses import replace

from titan_morph.monitor.adapt import AdaptPolicy, Monitor
from titan_morph.monitor.detect import DetectRule
from titan_morph.monitor.profile import MessageStamp, StepProfile
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.search.builders import build
from titan_morph.pipelining.timing.simulate import makespan

S, N, T = 4, 12, 10.0


def _profiles(step: int, delays: tuple[float, ...], t: float = T) -> list[StepProfile]:
    """One step of S stages: compute F/I/W of ``t`` ms each, one forward message per link whose
    arrival is stamped ``delays[link]`` after its acceptance."""
    out = []
    for stage in range(S):
        prof = StepProfile(stage, step, 0.0, 400.0, {"F": (t * N, N), "I": (t * N, N), "W": (t * N, N)})
        if stage < S - 1:
            prof.messages.append(MessageStamp("send", "emulated", stage, "fwd", step, 100.0))
        if stage > 0:
            link = stage - 1
            prof.messages.append(MessageStamp("recv", "emulated", link, "fwd", step, 100.0 + delays[link]))
        out.append(prof)
    return out


def _monitor(**kw) -> Monitor:
    initial = build("pipemorph", CostModel.uniform(S, N, T, T, T, memory=S))
    kw.setdefault("policy", AdaptPolicy(delegate_slow_links=True))
    return Monitor(
        num_stages=S,
        microbatches=N,
        initial_plan=initial,
        fallback_times=((T, T, T),) * S,
        rule=DetectRule(detect_steps=2, recover_steps=2),
        **kw,
    )


def test_a_slow_link_is_replanned_delegated_then_restored():
    mon = _monitor()
    active = mon.initial_plan
    changes = {}
    delays = [(0.0, 0.0, 0.0)] * 3 + [(0.0, 0.0, 60.0)] * 4 + [(0.0, 0.0, 0.0)] * 4
    for step, d in enumerate(delays, start=1):
        change = mon.observe(step, _profiles(step, d), active)
        if change is not None:
            changes[step] = change
            active = change.plan
    assert sorted(changes) == [5, 9], changes  # slow after k=2 slow steps, healthy after m=2
    slow, healthy = changes[5], changes[9]
    assert slow.switch == (2,) and slow.restore == () and slow.delays_ms == (0.0, 0.0, 60.0)
    assert slow.plan.warmup[2] - slow.plan.warmup[3] > mon.initial_plan.warmup[2] - mon.initial_plan.warmup[3]
    assert healthy.restore == (2,) and healthy.plan is mon.initial_plan
    assert "link 2 slow" in slow.describe(slow.plan, mon.times.times(), [2])
    metrics = mon.metrics(frozenset({2}))
    assert metrics["morph/decisions"] == 2.0 and metrics["morph/delegated/link2"] == 1.0
    assert metrics["morph/straggling/link2"] == 0.0


def test_without_auto_no_link_moves():
    mon = _monitor(policy=AdaptPolicy(delegate_slow_links=False))
    change = None
    for step in range(1, 4):
        change = mon.observe(step, _profiles(step, (0.0, 0.0, 60.0)), mon.initial_plan) or change
    assert change is not None and change.switch == () and change.restore == ()


def test_initial_plan_is_rebuilt_from_measured_times_after_profile_steps():
    """``profile_steps``: with unknown stage times the first plan came from unit times; after that
    many steps the initial plan is rebuilt from the measured ones (here Alg. 2 for a planned 40 ms)."""

    def planner(measured: CostModel):
        return build("pipemorph", measured.with_delays((0.0, 0.0, 40.0)))

    unit = build("pipemorph", CostModel.uniform(S, N, 1.0, 1.0, 1.0, delays=(0.0, 0.0, 40.0)))
    mon = Monitor(
        num_stages=S,
        microbatches=N,
        initial_plan=unit,
        fallback_times=((1.0, 1.0, 1.0),) * S,
        policy=AdaptPolicy(),
        initial_planner=planner,
        profile_steps=2,
    )
    assert mon.observe(1, _profiles(1, (0.0, 0.0, 0.0), t=20.0), unit) is None
    change = mon.observe(2, _profiles(2, (0.0, 0.0, 0.0), t=20.0), unit)
    assert change is not None and change.decision is None and "measured over 2 steps" in change.reasons[0]
    assert change.plan.model.fwd == (20.0,) * S and mon.initial_plan is change.plan
    assert change.plan.orders != unit.orders  # 40 ms is 2 op times at 20 ms, 20 at 1 ms: other warm-ups
    assert mon.observe(3, _profiles(3, (0.0, 0.0, 0.0), t=20.0), change.plan) is None  # once only


def test_varying_slow_links_are_planned_for_their_samples():
    """Delays that vary from step to step: the re-plan is evaluated on K vectors built from the slow
    links' recent samples (their quantiles, shuffled per link); steady delays keep one vector."""
    from titan_morph.monitor.detect import Decision

    mon = _monitor(policy=AdaptPolicy(samples=8, search=True))
    varying = tuple(float(x) for x in range(20, 61, 2))  # 20..60 ms: spread > the 5 ms quantum
    decision = Decision(9, (0.0, 45.0, 55.0), (1, 2), (1, 2), (), ("slow",), ((), varying, (55.0,) * 12))
    samples = mon.delay_samples(decision)
    assert samples is not None and len(samples) == 8 and all(len(v) == S - 1 for v in samples)
    assert {v[0] for v in samples} == {0.0} and {v[2] for v in samples} == {55.0}  # healthy; steady
    link1 = sorted(v[1] for v in samples)
    assert link1[0] > 20.0 and link1[-1] < 60.0 and len(set(link1)) == 8  # spread over the quantiles
    assert samples == mon.delay_samples(decision)  # the same on every rank
    steady = Decision(9, (0.0, 0.0, 55.0), (2,), (2,), (), ("slow",), ((), (), (54.0, 55.0, 56.0) * 4))
    assert mon.delay_samples(steady) is None
    assert _monitor(policy=AdaptPolicy(samples=0)).delay_samples(decision) is None
    change = mon._adapt(decision)  # the robust search runs and returns a valid plan for the samples
    assert change.plan.model.stages == S and change.switch == ()


def _run(mon: Monitor, delays: list[tuple[float, ...]]) -> dict[int, object]:
    active, changes = mon.initial_plan, {}
    for step, d in enumerate(delays, start=1):
        change = mon.observe(step, _profiles(step, d), active)
        if change is not None:
            changes[step] = change
            active = change.plan
    return changes


CAPPED = AdaptPolicy(memory=5, depth=2)  # adapted plans under a memory cap, on a blocking link queue


def test_an_eased_link_is_replanned_when_the_simulator_says_it_pays():
    """60 ms, then 20 ms on link 2: under a memory cap the plan made for 60 ms spends its in-flight
    budget on slack the 20 ms does not need; the monitor moves to Alg. 2's plan for 20 ms after k
    steps of it, long before the link recovers."""
    mon = _monitor(policy=CAPPED)
    changes = _run(mon, [(0.0, 0.0, 60.0)] * 3 + [(0.0, 0.0, 20.0)] * 4)
    assert sorted(changes) == [2, 5], changes
    eased = changes[5]
    assert eased.delays_ms == (0.0, 0.0, 20.0) and eased.plan.orders != changes[2].plan.orders
    assert "link 2 eased" in eased.reasons[0] and "simulated step" in eased.reasons[0]
    # the simulator's figures behind it: the new plan is faster under 20 ms than the one for 60 ms
    model = mon.times.model(N, (0.0, 0.0, 20.0), memory=5)
    assert makespan(model, eased.plan.orders, depth=2) < 0.99 * makespan(model, changes[2].plan.orders, depth=2)
    assert mon.detector.slow_links == (2,) and mon.replans == 2


def test_a_move_that_gains_nothing_is_refused_and_not_asked_again():
    mon = _monitor()  # delegated links, no memory cap: the plan for 60 ms costs nothing under 20 ms
    asked = []
    verdict = mon.verdict

    def counting(*args):
        got = verdict(*args)
        asked.append(got)
        return got

    mon.verdict = counting  # type: ignore[method-assign]
    changes = _run(mon, [(0.0, 0.0, 60.0)] * 3 + [(0.0, 0.0, 20.0)] * 8)
    assert sorted(changes) == [2], changes
    assert len(asked) == 1 and not asked[0].pays and "simulated step 410 -> 410 ms" in asked[0].why
    assert mon.detector.links[2].planned_ms == 60.0  # the running plan's condition stands


def test_a_condition_that_clears_returns_the_initial_plan_before_the_link_recovers():
    mon = Monitor(
        num_stages=S,
        microbatches=N,
        initial_plan=build("pipemorph", CostModel.uniform(S, N, T, T, T, memory=S)),
        fallback_times=((T, T, T),) * S,
        rule=DetectRule(detect_steps=2, recover_steps=4),
        policy=replace(CAPPED, delegate_slow_links=True),
    )
    changes = _run(mon, [(0.0, 0.0, 60.0)] * 3 + [(0.0, 0.0, 0.5)] * 5)
    assert sorted(changes) == [2, 5, 7], changes
    assert changes[5].plan is mon.initial_plan and changes[5].restore == ()  # planned as healthy, still slow
    assert mon.detector.slow_links == () and changes[7].restore == (2,)  # recovered: back to the default path
    assert changes[7].plan is mon.initial_plan and mon.decisions == 3 and mon.replans == 2
