"""DP x PP options: ``[morph.inject] rank_links`` and ``[morph] orchestrator``, checked before any
rank starts (one error line naming the key), the per-pipeline link model they give, and the fig19
comparison scenario."""

from __future__ import annotations

import pytest

from tests.launch import REPO
from titan_morph.compare.scenarios import expand, get_scenario
from titan_morph.compare.variants import HYBRID_VARIANTS, parse_variants
from titan_morph.config import ConfigError, Inject, Morph, resolve_morph
from titan_morph.config.fields import parse_rank_pairs
from titan_morph.config.links import link_model, pair_delays
from titan_morph.integration.titan022.jobconfig import load

HYBRID = REPO / "train_configs" / "hybrid_cpu.toml"
SYNTHETIC = REPO / "train_configs" / "synthetic_cpu.toml"
STATIC = ("--morph.inject.mode", "static")


def test_rank_pairs_parse_in_every_spelling():
    assert parse_rank_pairs("0-1,2-3") == ((0, 1), (2, 3))
    assert parse_rank_pairs(["1-0", [2, 3]]) == ((1, 0), (2, 3))
    assert parse_rank_pairs("") == () and parse_rank_pairs([]) == ()
    assert Inject(rank_links="0-1, 3-2").rank_links == ["0-1", "3-2"]
    for bad, why in (("0-0", "to itself"), ("0-1,1-0", "listed twice"), ("0-1-2", "not a rank pair"), ("a-1", "not")):
        with pytest.raises(ValueError, match=why):
            parse_rank_pairs(bad)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            (*STATIC, "--morph.inject.rank_links", "0-4", "--morph.inject.delays_ms", "30"),
            "names rank 4: ranks are 0..3",
        ),
        (
            (*STATIC, "--morph.inject.rank_links", "0-1,2-3", "--morph.inject.delays_ms", "30,20,10"),
            "one per rank pair",
        ),
        ((*STATIC, "--morph.inject.rank_links", "0-1", "--morph.inject.delays_ms", "inf"), "cannot go down"),
        (("--morph.inject.mode", "random", "--morph.inject.rank_links", "0-1"), "needs mode = static"),
        (
            (
                *STATIC,
                "--morph.inject.rank_links",
                "0-1",
                "--morph.inject.delays_ms",
                "30",
                "--morph.inject.direction",
                "fwd",
            ),
            "both",
        ),
        (("--morph.orchestrator", "pp", "--checkpoint.no-enable"), r"needs \[checkpoint\] enable = true"),
        (("--morph.orchestrator", "pp", "--parallelism.pipeline_parallel_schedule", "1F1B"), "titan_morph schedule"),
        (("--morph.orchestrator", "any", "--morph.no-monitor", "--morph.no-adapt"), "needs morph.monitor = true"),
    ],
)
def test_bad_hybrid_options_are_one_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load(HYBRID, list(overrides))


def test_good_hybrid_options_resolve():
    _, settings = load(HYBRID, [*STATIC, "--morph.inject.rank_links", "0-1,2-3", "--morph.inject.delays_ms", "30,10"])
    assert settings.morph.inject.rank_links == ((0, 1), (2, 3)) and settings.morph.orchestrator == "pp"
    model = pair_delays(settings.morph.inject)
    assert model is not None and model.delays == {(0, 1): 30.0, (2, 3): 10.0}
    # the orchestrator has nothing to move without DP: accepted and inert on a PP-only config
    assert load(SYNTHETIC, ["--morph.orchestrator", "pp"])[1].morph.orchestrator == "pp"


def test_rank_links_give_each_pipeline_its_links():
    inj = resolve_morph(
        Morph(inject=Inject(mode="static", delays_ms=[30.0, 5.0], rank_links=["0-1", "2-5"], start_step=3))
    ).inject
    # a pipeline whose stages run on hosts 0, 1, 2, 5: links 0 (0-1) and 2 (2-5) are slow
    links = link_model(inj, 3, hosts=[0, 1, 2, 5])
    assert [links.delay_ms(i, "fwd", 0.0, 3) for i in range(3)] == [30.0, 0.0, 5.0]
    assert links.delay_ms(0, "bwd", 0.0, 2) == 0.0  # before start_step
    assert [links.delay_ms(i, "bwd", 0.0, 4) for i in range(3)] == [30.0, 0.0, 5.0]
    other = link_model(inj, 3, hosts=[4, 3, 6, 7])
    assert [other.delay_ms(i, "fwd", 0.0, 5) for i in range(3)] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="hosts of the pipeline"):
        link_model(inj, 3)


def test_fig19_scenario_and_its_variants():
    scenario = get_scenario("fig19")
    assert scenario.variants == HYBRID_VARIANTS
    cases = expand("fig19", 1)
    assert [c.x for c in cases] == [0.0, 10.0, 20.0, 30.0]
    assert cases[0].overrides == ("--morph.inject.mode", "none")
    assert "--morph.inject.rank_links" in cases[3].overrides and cases[3].delays_ms is None
    nomove, move, full = parse_variants(",".join(HYBRID_VARIANTS))
    assert nomove.overrides[-2:] == ("--morph.orchestrator", "off")
    assert move.schedule == "ZBH2" and move.overrides[-2:] == ("--morph.orchestrator", "pp")
    assert full.schedule == "PipeMorph" and full.transport == "auto" and full.adapt
    for case in cases:
        for variant in (nomove, move, full):
            _, cfg = load(HYBRID, ["--training.steps", "5", *variant.overrides, *case.overrides])
            assert cfg.morph.orchestrator == variant.overrides[-1]


def test_rank_links_over_tp_lanes_take_each_links_slowest_lane():
    from titan_morph.config.fields import Layout

    named = Inject(mode="static", rank_links="0-2,1-5", delays_ms="60,20")
    inject = resolve_morph(Morph(inject=named), Layout(3)).inject
    lane0, lane1 = [0, 2, 4], [1, 3, 5]  # TP 2 x PP 3: lane 0 crosses 0-2 on link 0, lane 1 nothing named
    assert link_model(inject, 2, hosts=lane0).inner == link_model(inject, 2, hosts=[lane0]).inner
    assert link_model(inject, 2, hosts=lane1).inner.fwd == (0.0, 0.0)
    assert link_model(inject, 2, hosts=[lane0, lane1]).inner.fwd == (60.0, 0.0)
    assert link_model(inject, 2, hosts=[[0, 2, 4], [1, 3, 1]]).inner.fwd == (60.0, 0.0)
    assert link_model(inject, 2, hosts=[[0, 2, 4], [5, 1, 3]]).inner.fwd == (60.0, 0.0)
    assert link_model(inject, 2, hosts=[[0, 2, 4], [1, 5, 3]]).inner.fwd == (60.0, 0.0)
    assert link_model(inject, 2, hosts=[[0, 2, 4], [3, 1, 5]]).inner.fwd == (60.0, 20.0)
    with pytest.raises(ValueError, match="rank_links: the hosts of the pipeline's 3 stages"):
        link_model(inject, 2, hosts=[lane0, [1, 3]])
