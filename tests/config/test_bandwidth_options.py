"""[morph.inject] rates (bandwidth_mbit, random_bandwidth_mbit, a trace's column) and [morph.synthetic]
message_kb: their checks, and the one link model they build for the emulator, the plan and the predictor."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.launch import REPO
from titan_morph.config import ConfigError, Inject, Morph, MorphSettings, Synthetic, resolve_morph
from titan_morph.config.fields import Layout
from titan_morph.config.links import link_model, plan_transmit

SYNTHETIC = REPO / "train_configs" / "synthetic_cpu.toml"
KIB64 = 65536  # bytes: at 50 Mbit/s one message takes 65536 x 8 / 50000 = 10.49 ms


def _resolved(morph: Morph, stages: int = 4, limit: float | None = 12_500) -> MorphSettings:
    return resolve_morph(morph, Layout(stages, limit))


def _fails(morph: Morph, key: str, words: str, limit: float | None = 12_500) -> None:
    with pytest.raises(ConfigError) as err:
        _resolved(morph, limit=limit)
    message = str(err.value)
    assert message.startswith(key + ": ") and words in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("inject", "key", "words"),
    [
        (dict(mode="random", random_bandwidth_mbit=[10]), "morph.inject.random_bandwidth_mbit", "[low, high]"),
        (dict(mode="random", random_bandwidth_mbit=[40, 10]), "morph.inject.random_bandwidth_mbit", "low <= high"),
        (dict(mode="random", random_bandwidth_mbit=[0, 10]), "morph.inject.random_bandwidth_mbit", "> 0"),
        (
            dict(mode="static", delays_ms=[0], random_bandwidth_mbit=[5, 10]),
            "morph.inject.random_bandwidth_mbit",
            "needs mode = random",
        ),
        (dict(mode="none", bandwidth_mbit=[50]), "morph.inject.bandwidth_mbit", "needs mode = static, random or trace"),
        (dict(mode="break", bandwidth_mbit=[50]), "morph.inject.bandwidth_mbit", "a link that fails has no rate"),
        (dict(mode="static", delays_ms=[0], bandwidth_mbit=[50, 50]), "morph.inject.bandwidth_mbit", "3 values"),
        (dict(mode="static", delays_ms=[0], bandwidth_mbit=[-1]), "morph.inject.bandwidth_mbit", ">= 0"),
        (
            dict(mode="static", delays_ms=[5], rank_links="0-1", bandwidth_mbit=[50]),
            "morph.inject.bandwidth_mbit",
            "rank_links",
        ),
    ],
)
def test_bad_rates_fail_with_one_line_naming_the_key(inject, key, words):
    transport = "auto" if inject["mode"] == "break" else "default"
    _fails(Morph(transport=transport, inject=Inject(**inject)), key, words)


def test_message_kb_checks_and_a_message_longer_than_the_delay_limit():
    _fails(Morph(synthetic=Synthetic(message_kb=0.1)), "morph.synthetic.message_kb", "1/256 KiB")
    _resolved(Morph(synthetic=Synthetic(message_kb=0.5)))
    slow = Morph(
        synthetic=Synthetic(enabled=True, message_kb=64),
        inject=Inject(mode="static", delays_ms=[0], bandwidth_mbit=[0, 0, 1]),
    )
    _fails(slow, "morph.inject.bandwidth_mbit", "524.288 ms at 1 Mbit/s", limit=500)
    _resolved(slow, limit=600)


def test_trace_rate_column_is_checked_with_the_trace(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("step,link,delay_ms,bandwidth_mbit\n1,0,5,fast\n")
    _fails(Morph(inject=Inject(mode="trace", trace_file=str(bad))), "morph.inject.trace_file", "fast")
    bad.write_text("step,link,delay_ms,bandwidth_mbit\n1,0,5,-3\n")
    _fails(Morph(inject=Inject(mode="trace", trace_file=str(bad))), "morph.inject.trace_file", "bandwidth_mbit")


def test_each_mode_builds_transmit_times_from_rate_and_message_size(tmp_path):
    static = _resolved(Morph(inject=Inject(mode="static", delays_ms=[0, 0, 20], bandwidth_mbit=[0, 0, 50]))).inject
    links = link_model(static, 3, message_bytes=KIB64)
    assert links is not None
    assert links.transmit_snapshot(step=1) == pytest.approx((0.0, 0.0, KIB64 * 8 / 50_000))
    assert links.delay_ms(2, "bwd", step=1) == 20.0
    sized = link_model(static, 3, message_bytes=[(1000, 1000), (1000, 1000), (KIB64, 1000)])
    assert sized is not None and sized.transmit_ms(2, "bwd", step=1) == pytest.approx(1000 * 8 / 50_000)
    with pytest.raises(ValueError, match=r"^morph.inject.bandwidth_mbit: .*message"):
        link_model(static, 3)
    windowed = replace(static, start_step=3, direction="fwd")
    wl = link_model(windowed, 3, message_bytes=KIB64)
    assert wl is not None and (wl.transmit_ms(2, "fwd", step=2), wl.transmit_ms(2, "bwd", step=3)) == (0.0, 0.0)

    random_inj = _resolved(
        Morph(inject=Inject(mode="random", random_mean_ms=10, links=[1], random_bandwidth_mbit=[10, 20], seed=3))
    ).inject
    rl = link_model(random_inj, 3, message_bytes=KIB64)
    again = link_model(random_inj, 3, message_bytes=KIB64)
    assert rl is not None and again is not None
    spans = [rl.transmit_ms(1, "fwd", t, step=1) for t in range(0, 5000, 50)]
    assert spans == [again.transmit_ms(1, "fwd", t, step=1) for t in range(0, 5000, 50)]  # same seed, same rates
    assert all(KIB64 * 8 / 20_000 <= s <= KIB64 * 8 / 10_000 for s in spans) and len(set(spans)) > 5
    assert rl.transmit_ms(0, "fwd", 100.0, step=1) == 0.0  # not straggling, no bandwidth_mbit: unlimited

    trace = tmp_path / "rates.csv"
    trace.write_text("step,link,delay_ms,bandwidth_mbit\n2,0,0,25\n5,0,0,\n")
    tl = link_model(_resolved(Morph(inject=Inject(mode="trace", trace_file=str(trace)))).inject, 3, message_bytes=KIB64)
    assert tl is not None
    assert [tl.transmit_ms(0, "fwd", step=s) for s in (1, 2, 5)] == pytest.approx([0.0, KIB64 * 8 / 25_000, 0.0])
    with pytest.raises(ValueError, match=r"^morph.inject.trace_file: .*message"):
        link_model(_resolved(Morph(inject=Inject(mode="trace", trace_file=str(trace)))).inject, 3)


def test_pipemorph_plans_for_the_injected_rates_with_plan_delays():
    """plan_transmit: the initial plan's transmit times are the emulated links' (Eq. 1 with c + tau)."""
    from titan_morph.integration.plans import initial_plan

    inject = Inject(mode="static", delays_ms=[0], bandwidth_mbit=[0, 0, 50])
    syn = Synthetic(enabled=True, message_kb=64)
    without = _resolved(Morph(memory_budget=7, inject=inject, synthetic=syn))
    morph = _resolved(Morph(memory_budget=7, inject=inject, synthetic=syn, plan_delays_ms=[0]))
    links = link_model(morph.inject, 3, message_bytes=KIB64)
    assert plan_transmit(without, links) is None  # no plan for known link conditions: Alg. 1 stands
    transmit = plan_transmit(morph, links)
    assert transmit == pytest.approx((0.0, 0.0, 10.48576))
    plan = initial_plan("pipemorph", morph, 4, 24, transmit=transmit)
    assert plan.model.transmit == transmit
    assert plan.warmup != initial_plan("pipemorph", morph, 4, 24).warmup  # slackness for c + tau on link 2


def test_plan_transmit_ms_gives_real_links_a_transmit_time_to_plan_for():
    """plan_transmit_ms: a real link's measured transmit time (no emulated rate to take it from)
    enters the initial plan beside plan_delays_ms, and overrides the injected rates' where both are."""
    from titan_morph.integration.plans import initial_plan

    delays = _resolved(Morph(memory_budget=7, plan_delays_ms=[0]))
    given = _resolved(Morph(memory_budget=7, plan_delays_ms=[0], plan_transmit_ms=[0, 0, 27.3]))
    assert given.plan_transmit(3) == (0.0, 0.0, 27.3)
    plan = initial_plan("pipemorph", given, 4, 24)
    assert plan.model.transmit == (0.0, 0.0, 27.3)
    assert plan.warmup != initial_plan("pipemorph", delays, 4, 24).warmup
    injected = _resolved(
        Morph(
            memory_budget=7,
            plan_delays_ms=[0],
            plan_transmit_ms=[0, 0, 5],
            inject=Inject(mode="static", delays_ms=[0], bandwidth_mbit=[0, 0, 50]),
        )
    )
    assert initial_plan("pipemorph", injected, 4, 24, transmit=(0.0, 0.0, 10.5)).model.transmit == (0.0, 0.0, 5.0)
    _fails(Morph(plan_transmit_ms=[0, 0, 27.3]), "morph.plan_transmit_ms", "needs plan_delays_ms")
    _fails(Morph(plan_delays_ms=[0], plan_transmit_ms=[0, 0, -1]), "morph.plan_transmit_ms", ">= 0")


def test_predictor_uses_the_rates_and_the_same_plan_as_the_runtime():
    from titan_morph.compare.predict import simulated_ms
    from titan_morph.compare.variants import VARIANTS
    from titan_morph.integration.titan022.jobconfig import load

    base = ["--morph.inject.mode", "static", "--morph.inject.delays_ms", "0", "--training.steps", "4"]
    rated = [*base, "--morph.inject.bandwidth_mbit", "0,0,10", "--morph.synthetic.message_kb", "64"]
    variant = VARIANTS["ZBH2"]
    plain_ms, _ = simulated_ms(load(SYNTHETIC, [*base, *variant.overrides])[1], variant, 1)
    rated_ms, note = simulated_ms(load(SYNTHETIC, [*rated, *variant.overrides])[1], variant, 1)
    assert plain_ms is not None and rated_ms is not None, note
    assert rated_ms > plain_ms and rated_ms > 24 * 52.4288  # link 2 carries 24 messages each way of 52.4 ms
    no_size = load(SYNTHETIC, [*base, "--morph.inject.bandwidth_mbit", "0,0,10", *variant.overrides])[1]
    assert simulated_ms(no_size, variant, 1)[0] is None
    assert simulated_ms(no_size, variant, 1, message_bytes=KIB64)[0] == rated_ms
