"""[morph] section: TOML/CLI parsing through TorchTitan's ConfigManager and fail-fast validation."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import pytest

from tests.launch import DEFAULT_CONFIG, REPO
from titan_morph.integration.config import (
    Inject,
    Morph,
    MorphConfigError,
    Synthetic,
    check_unknown_keys,
    link_model_from_config,
    parse_stage_times,
    validate_morph,
)
from titan_morph.launch import world_size


def _parse(*args: str):
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(["--job.config_file", str(DEFAULT_CONFIG), *args])


def test_toml_and_cli_reach_nested_tables():
    cfg = _parse("--morph.inject.mode", "static", "--morph.inject.delays_ms", "0,0,60", "--morph.memory_budget", "6")
    assert cfg.morph.inject == replace(Inject(), mode="static", delays_ms="0,0,60")
    assert cfg.morph.memory_budget == 6
    assert cfg.morph.synthetic == Synthetic()
    validate_morph(cfg.morph, cfg.parallelism.pipeline_parallel_degree)


def test_every_shipped_config_is_valid():
    from torchtitan.config import ConfigManager

    for path in sorted((REPO / "train_configs").glob("*.toml")):
        cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
        validate_morph(cfg.morph, cfg.parallelism.pipeline_parallel_degree)


BAD = [
    ({"memory_budget": -1}, "morph.memory_budget", ">= the pipeline degree (4)"),
    ({"memory_budget": 3}, "morph.memory_budget", ">= the pipeline degree (4)"),
    ({"stage_times_ms": "1,2"}, "morph.stage_times_ms", '"F,B,W"'),
    ({"stage_times_ms": "1,2,3;1,2,3"}, "morph.stage_times_ms", "4 triples"),
    ({"stage_times_ms": "1,-2,3"}, "morph.stage_times_ms", ">= 0"),
    ({"profile_steps": 0}, "morph.profile_steps", ">= 1"),
    ({"search_budget_ms": 0.0}, "morph.search_budget_ms", "> 0"),
    ({"transport": "rdma"}, "morph.transport", "default | delegate | auto"),
    ({"link_queue_depth": 0}, "morph.link_queue_depth", ">= 1"),
    ({"delegates_per_link": 0}, "morph.delegates_per_link", ">= 1"),
    ({"detect_consecutive": 0}, "morph.detect_consecutive", ">= 1"),
    ({"recover_consecutive": -3}, "morph.recover_consecutive", ">= 1"),
    ({"detect_margin": -0.5}, "morph.detect_margin", ">= 0"),
    ({"recover_ratio": 0.0}, "morph.recover_ratio", "0 < recover_ratio <= 1"),
    ({"recover_ratio": 1.5}, "morph.recover_ratio", "0 < recover_ratio <= 1"),
    ({"detect_min_ms": -1.0}, "morph.detect_min_ms", "finite number of ms >= 0"),
    ({"adapt_memory_budget": 2}, "morph.adapt_memory_budget", "0 (no cap) or >= the pipeline degree (4)"),
    ({"monitor": False}, "morph.adapt", "needs morph.monitor = true"),
    ({"memory_budget": "8"}, "morph.memory_budget", "must be of type int"),
    ({"adapt": "yes"}, "morph.adapt", "must be of type bool"),
    ({"plan_delays_ms": "0,x,0"}, "morph.plan_delays_ms", "not a number"),
    ({"plan_delays_ms": "0,60"}, "morph.plan_delays_ms", "needs 3 values"),
    ({"plan_delays_ms": "0,-1,0"}, "morph.plan_delays_ms", ">= 0"),
    ({"plan_delays_ms": "0,inf,0"}, "morph.plan_delays_ms", "finite"),
]

BAD_INJECT = [
    ({"mode": "sometimes"}, "morph.inject.mode", "none | static | random | trace"),
    ({"mode": "static"}, "morph.inject.delays_ms", "static mode needs"),
    ({"mode": "static", "delays_ms": "0,-5,0"}, "morph.inject.delays_ms", ">= 0"),
    ({"delays_ms": "0,0"}, "morph.inject.delays_ms", "needs 3 values"),
    ({"delays_ms": "0,x,0"}, "morph.inject.delays_ms", "not a number"),
    ({"delays_ms": [0, 0, 60]}, "morph.inject.delays_ms", "quoted string"),
    ({"direction": "up"}, "morph.inject.direction", "both | fwd | bwd"),
    ({"start_step": 0}, "morph.inject.start_step", ">= 1"),
    ({"start_step": 5, "end_step": 3}, "morph.inject.end_step", ">= start_step (5)"),
    ({"links": "0,3"}, "morph.inject.links", "0..2"),
    ({"random_mean_ms": -1.0}, "morph.inject.random_mean_ms", ">= 0"),
    ({"random_std_ms": math.nan}, "morph.inject.random_std_ms", ">= 0"),
    ({"random_interval_ms": "200,100"}, "morph.inject.random_interval_ms", "0 < low <= high"),
    ({"random_interval_ms": "100"}, "morph.inject.random_interval_ms", '"low,high"'),
    ({"mode": "trace"}, "morph.inject.trace_file", "needs a CSV path"),
    ({"mode": "trace", "trace_file": "/nonexistent.csv"}, "morph.inject.trace_file", "not found"),
]

BAD_SYNTHETIC = [
    ({"fwd_ms": "10,10"}, "morph.synthetic.fwd_ms", "4 values"),
    ({"bwd_ms": "-1"}, "morph.synthetic.bwd_ms", ">= 0"),
    ({"wgt_ms": "fast"}, "morph.synthetic.wgt_ms", "number of ms"),
    ({"hidden": 0}, "morph.synthetic.hidden", "multiple of 16"),
    ({"hidden": 40}, "morph.synthetic.hidden", "multiple of 16"),
]


def _bad_cases():
    for kw, key, allowed in BAD:
        yield pytest.param(replace(Morph(), **kw), key, allowed, id=key + "-" + str(list(kw.values())[-1]))
    for kw, key, allowed in BAD_INJECT:
        yield pytest.param(Morph(inject=replace(Inject(), **kw)), key, allowed, id=key + "-" + str(kw)[:30])
    for kw, key, allowed in BAD_SYNTHETIC:
        yield pytest.param(Morph(synthetic=replace(Synthetic(), **kw)), key, allowed, id=key)


@pytest.mark.parametrize(("morph", "key", "allowed"), list(_bad_cases()))
def test_bad_values_fail_with_key_and_allowed_values(morph, key, allowed):
    with pytest.raises(MorphConfigError) as err:
        validate_morph(morph, pp_degree=4)
    message = str(err.value)
    assert key in message and allowed in message, message


def test_good_values_pass():
    validate_morph(Morph(), 4)
    validate_morph(Morph(), None)
    good = Morph(
        memory_budget=12,
        plan_delays_ms="0,0,60",
        stage_times_ms="10,20,10;10,20,10;12,22,11;15,25,12",
        inject=Inject(mode="static", delays_ms="0,inf,60", direction="fwd", start_step=3, end_step=9),
        synthetic=Synthetic(enabled=True, fwd_ms="5,5,5,6"),
    )
    validate_morph(good, 4)
    validate_morph(Morph(inject=Inject(mode="random", random_mean_ms=30, random_std_ms=10, links="1")), 4)
    validate_morph(Morph(inject=Inject(mode="trace", trace_file="table3")), 4)


def test_unknown_keys_name_the_key_and_the_allowed_ones():
    with pytest.raises(MorphConfigError, match=r"morph\.memory_budgett.*memory_budget"):
        check_unknown_keys({"memory_budgett": 4})
    with pytest.raises(MorphConfigError, match=r"morph\.inject\.delay_ms.*delays_ms"):
        check_unknown_keys({"inject": {"delay_ms": "0,1"}})
    with pytest.raises(MorphConfigError, match=r"must be a table \[morph\.synthetic\]"):
        check_unknown_keys({"synthetic": 3})
    check_unknown_keys({"transport": "auto", "inject": {"mode": "none"}, "synthetic": {"enabled": False}})


def test_prepare_args_rejects_unknown_toml_key_and_adds_config_module(tmp_path):
    from titan_morph.train import CONFIG_MODULE, prepare_args

    bad = tmp_path / "bad.toml"
    bad.write_text('[morph]\ntransprot = "auto"\n')
    with pytest.raises(MorphConfigError, match=r"unknown \[morph\] option morph\.transprot"):
        prepare_args(["--job.config_file", str(bad)])
    plain = tmp_path / "plain.toml"
    plain.write_text("[training]\nsteps = 1\n")
    assert prepare_args(["--job.config_file", str(plain)])[-2:] == ["--job.custom_config_module", CONFIG_MODULE]
    assert prepare_args(["--job.config_file", str(DEFAULT_CONFIG)]) == ["--job.config_file", str(DEFAULT_CONFIG)]


def test_typed_views():
    assert parse_stage_times("", 4) is None
    assert parse_stage_times("1,2,3", 2) == ((1.0, 2.0, 3.0), (1.0, 2.0, 3.0))
    model = link_model_from_config(Inject(mode="static", delays_ms="0,50", direction="fwd", start_step=2), 2)
    assert model is not None
    assert model.delay_ms(1, "fwd", step=2) == 50.0
    assert model.delay_ms(1, "bwd", step=2) == 0.0  # direction filter
    assert model.delay_ms(1, "fwd", step=1) == 0.0  # before start_step
    assert link_model_from_config(Inject(), 3) is None
    trace = link_model_from_config(Inject(mode="trace", trace_file="table3"), 3, steps=100)
    assert trace is not None and math.isinf(max(trace.snapshot(step=100)))


def test_world_size_from_config_and_overrides():
    assert world_size(str(DEFAULT_CONFIG), []) == 4
    assert world_size(str(DEFAULT_CONFIG), ["--parallelism.pipeline_parallel_degree", "2"]) == 2
    assert world_size(str(DEFAULT_CONFIG), ["--parallelism.pipeline_parallel_degree=3"]) == 3


def test_run_id_is_shared_by_the_ranks_of_one_launch(monkeypatch):
    from titan_morph.train import run_id

    monkeypatch.setenv("TITAN_MORPH_RUN_ID", "20260101-000000-1")
    assert run_id() == "20260101-000000-1"
    monkeypatch.delenv("TITAN_MORPH_RUN_ID")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc-uuid")
    assert run_id() == "abc-uuid"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun without --standalone/--rdzv-id
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert run_id().endswith(f"-agent{os.getppid()}-port29500")


def test_trace_file_is_checked_against_the_pipeline(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("step,link,delay_ms\n3,2,40\n8,2,0\n")
    morph = Morph(inject=Inject(mode="trace", trace_file=str(trace)))
    validate_morph(morph, 4)
    model = link_model_from_config(morph.inject, 3)
    assert model is not None and model.delay_ms(2, "bwd", step=5) == 40.0 and model.delay_ms(2, "fwd", step=9) == 0.0
    with pytest.raises(MorphConfigError, match=r"morph\.inject\.trace_file.*out of range"):
        validate_morph(morph, 2)  # one link only
    trace.write_text("when,link\n1,0\n")
    with pytest.raises(MorphConfigError, match=r"morph\.inject\.trace_file.*needs columns"):
        validate_morph(morph, 4)


def test_plan_delays_make_pipemorph_plan_for_them():
    """plan_delays_ms: PipeMorph starts from Alg. 2 for those delays (more warm-up before the slow link)."""
    from titan_morph.integration.assembly import initial_plan
    from titan_morph.integration.config import parse_plan_delays

    assert parse_plan_delays("", 3) is None and parse_plan_delays("60", 3) == (60.0, 60.0, 60.0)
    base = replace(Morph(), memory_budget=7, stage_times_ms="10,10,10")
    plain = initial_plan("pipemorph", base, 4, 24)
    planned = initial_plan("pipemorph", replace(base, plan_delays_ms="0,0,60"), 4, 24)
    assert plain.model.delays == (0.0, 0.0, 0.0) and planned.model.delays == (0.0, 0.0, 60.0)
    assert planned.plan_id != plain.plan_id and planned.warmup[2] > plain.warmup[2], (plain.warmup, planned.warmup)
    assert initial_plan("zb-h2", replace(base, plan_delays_ms="0,0,60"), 4, 24).warmup == (7, 5, 3, 1)
    searching = replace(base, plan_delays_ms="0,0,60", search=True, search_budget_ms=50)
    searched = initial_plan("pipemorph", searching, 4, 24)
    assert searched.model.delays == (0.0, 0.0, 60.0)
    # no planned delays: the search would only shrink slackness (every such plan has the same makespan)
    assert initial_plan("pipemorph", replace(base, search=True), 4, 24).warmup == plain.warmup
