"""[morph] section: typed fields, TOML/CLI parsing through TorchTitan's ConfigManager, validation."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import pytest

from tests.launch import DEFAULT_CONFIG, REPO
from titan_morph.config import ConfigError, Inject, Morph, MorphSettings, Synthetic, resolve_morph
from titan_morph.config.fields import Layout, check_unknown_keys
from titan_morph.config.links import break_window, link_model
from titan_morph.integration.titan022.jobconfig import CONFIG_MODULE, check_early, load, prepare_args


def _resolved(morph: Morph, stages: int | None = None, limit: float | None = None) -> MorphSettings:
    return resolve_morph(morph, Layout(stages, limit))


def _inject(**kw) -> object:
    return _resolved(Morph(transport="auto", inject=Inject(**kw))).inject


def _parse(*args: str):
    from torchtitan.config import ConfigManager

    return ConfigManager().parse_args(["--job.config_file", str(DEFAULT_CONFIG), *args])


def test_toml_and_cli_reach_nested_tables():
    cfg = _parse("--morph.inject.mode", "static", "--morph.inject.delays_ms", "0,0,60", "--morph.memory_budget", "6")
    assert cfg.morph.inject == replace(Inject(), mode="static", delays_ms=[0.0, 0.0, 60.0])
    assert cfg.morph.memory_budget == 6
    assert cfg.morph.synthetic == Synthetic()
    _resolved(cfg.morph, cfg.parallelism.pipeline_parallel_degree)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--morph.inject.delays_ms", "30"), {"inject.delays_ms": [30.0]}),
        (("--morph.inject.delays_ms", "0,inf,0"), {"inject.delays_ms": [0.0, math.inf, 0.0]}),
        (("--morph.stage_times_ms", "10,20,10;11,21,11"), {"stage_times_ms": [10.0, 20.0, 10.0, 11.0, 21.0, 11.0]}),
        (("--morph.inject.links", "0,2"), {"inject.links": [0, 2]}),
        (("--morph.monitor", "false", "--morph.adapt", "false"), {"monitor": False, "adapt": False}),
        (("--morph.search", "--morph.synthetic.enabled", "true"), {"search": True, "synthetic.enabled": True}),
        (("--morph.search", "yes", "--morph.adapt", "0"), {"search": True, "adapt": False}),
        (("--morph.transport", "delegate"), {"transport": "delegate"}),
    ],
)
def test_cli_lists_booleans_and_choices(args, expected):
    morph = _parse(*args).morph
    for key, value in expected.items():
        obj = morph
        for part in key.split("."):
            obj = getattr(obj, part)
        assert obj == value, (key, obj)


def test_toml_lists_and_comma_strings_load_the_same(tmp_path):
    """TOML lists, comma strings and single numbers give the same typed values."""
    text = DEFAULT_CONFIG.read_text()
    base = text[: text.index("\n[morph]\n") + 1]
    as_lists = tmp_path / "lists.toml"
    as_lists.write_text(
        base + "[morph]\nstage_times_ms = [[10, 20, 10], [11, 21, 11], [10, 20, 10], [10, 20, 10]]\n"
        'plan_delays_ms = [0, 0, 60]\n[morph.inject]\nmode = "static"\ndelays_ms = [0, 0, 60]\n'
        "random_interval_ms = [50, 100]\n[morph.synthetic]\nfwd_ms = 12\n"
    )
    as_strings = tmp_path / "strings.toml"
    as_strings.write_text(
        base + '[morph]\nstage_times_ms = "10,20,10;11,21,11;10,20,10;10,20,10"\nplan_delays_ms = "0,0,60"\n'
        '[morph.inject]\nmode = "static"\ndelays_ms = "0,0,60"\nrandom_interval_ms = "50,100"\n'
        '[morph.synthetic]\nfwd_ms = "12"\n'
    )
    from torchtitan.config import ConfigManager

    a, b = (ConfigManager().parse_args(["--job.config_file", str(p)]).morph for p in (as_lists, as_strings))
    assert a == b
    assert a.inject.delays_ms == [0.0, 0.0, 60.0] and a.synthetic.fwd_ms == [12.0]
    parsed = _resolved(a, 4)
    assert parsed.stage_times(4) == ((10.0, 20.0, 10.0), (11.0, 21.0, 11.0), (10.0, 20.0, 10.0), (10.0, 20.0, 10.0))
    assert parsed.plan_delays(3) == (0.0, 0.0, 60.0)
    _resolved(a, 4, limit=12_500)


def test_every_shipped_config_passes_the_launch_checks():
    paths = sorted((REPO / "train_configs").glob("*.toml"))
    assert len(paths) >= 4
    for path in paths:
        check_early(path, [])  # the checks before TorchTitan loads agree with the full ones
        cfg, settings = load(path)  # what ./run_train.sh runs before starting any rank
        assert settings.morph.inject.mode in ("none", "static", "random", "trace")


BAD = [
    ({"memory_budget": -1}, "morph.memory_budget", "out of range: must be >= 0"),
    ({"memory_budget": 3}, "morph.memory_budget", ">= the pipeline degree (4)"),
    ({"stage_times_ms": "1,2"}, "morph.stage_times_ms", "needs 3 or 12 values"),
    ({"stage_times_ms": "1,2,3;1,2,3"}, "morph.stage_times_ms", "needs 3 or 12 values"),
    ({"stage_times_ms": "1,-2,3"}, "morph.stage_times_ms", "must be >= 0"),
    ({"profile_steps": 0}, "morph.profile_steps", "must be >= 1"),
    ({"search_budget_ms": 0.0}, "morph.search_budget_ms", "must be > 0"),
    ({"transport": "rdma"}, "morph.transport", "'rdma' is not one of default, delegate, auto"),
    ({"link_queue_depth": 0}, "morph.link_queue_depth", "must be >= 1"),
    ({"delegates_per_link": 0}, "morph.delegates_per_link", "must be >= 1 and <= 64"),
    ({"delegates_per_link": 65}, "morph.delegates_per_link", "must be >= 1 and <= 64"),
    ({"detect_consecutive": 0}, "morph.detect_consecutive", ">= 1"),
    ({"recover_consecutive": -3}, "morph.recover_consecutive", ">= 1"),
    ({"detect_margin": -0.5}, "morph.detect_margin", ">= 0"),
    ({"recover_ratio": 0.0}, "morph.recover_ratio", "must be > 0 and <= 1"),
    ({"recover_ratio": 1.5}, "morph.recover_ratio", "must be > 0 and <= 1"),
    ({"detect_min_ms": -1.0}, "morph.detect_min_ms", ">= 0"),
    ({"adapt_memory_budget": 2}, "morph.adapt_memory_budget", "0 or >= the pipeline degree (4)"),
    ({"monitor": False}, "morph.adapt", "needs morph.monitor = true"),
    ({"memory_budget": "8"}, "morph.memory_budget", "must be an integer"),
    ({"memory_budget": 8.0}, "morph.memory_budget", "must be an integer"),
    ({"adapt": "yes"}, "morph.adapt", "is not a boolean"),
    ({"search_budget_ms": "fast"}, "morph.search_budget_ms", "must be a number"),
    ({"plan_delays_ms": "0,x,0"}, "morph.plan_delays_ms", "'x' is not a number"),
    ({"plan_delays_ms": "0,60"}, "morph.plan_delays_ms", "needs 1 or 3 values"),
    ({"plan_delays_ms": "0,-1,0"}, "morph.plan_delays_ms", ">= 0"),
    ({"plan_delays_ms": "0,inf,0"}, "morph.plan_delays_ms", "finite"),
    ({"plan_delays_ms": [0, 20_000, 0]}, "morph.plan_delays_ms", "train_timeout_seconds"),
]

BAD_INJECT = [
    ({"mode": "sometimes"}, "morph.inject.mode", "is not one of none, static, random, trace"),
    ({"mode": "static"}, "morph.inject.delays_ms", "static mode needs"),
    ({"mode": "static", "delays_ms": "0,-5,0"}, "morph.inject.delays_ms", ">= 0"),
    ({"delays_ms": "0,0"}, "morph.inject.delays_ms", "needs 1 or 3 values"),
    ({"delays_ms": "0,x,0"}, "morph.inject.delays_ms", "not a number"),
    ({"delays_ms": 1e6}, "morph.inject.delays_ms", "<= 12500"),
    ({"delays_ms": [0, 0, 1e6]}, "morph.inject.delays_ms", "train_timeout_seconds x 1000 / microbatches"),
    ({"direction": "up"}, "morph.inject.direction", "is not one of both, fwd, bwd"),
    ({"start_step": 0}, "morph.inject.start_step", ">= 1"),
    ({"start_step": 5, "end_step": 3}, "morph.inject.end_step", ">= start_step (5)"),
    ({"links": "0,3"}, "morph.inject.links", "0..2"),
    ({"links": [0, -1]}, "morph.inject.links", ">= 0"),
    ({"random_mean_ms": -1.0}, "morph.inject.random_mean_ms", ">= 0"),
    ({"random_std_ms": math.nan}, "morph.inject.random_std_ms", "finite"),
    ({"mode": "random", "random_mean_ms": 12_000.0, "random_std_ms": 500.0}, "morph.inject.random_std_ms", "mean + 3"),
    ({"random_interval_ms": "200,100"}, "morph.inject.random_interval_ms", "low <= high"),
    ({"random_interval_ms": "100"}, "morph.inject.random_interval_ms", "[low, high]"),
    ({"random_interval_ms": [0, 100]}, "morph.inject.random_interval_ms", "must be > 0"),
    ({"mode": "trace"}, "morph.inject.trace_file", "needs a CSV path"),
    ({"mode": "trace", "trace_file": "/nonexistent.csv"}, "morph.inject.trace_file", "not found"),
    ({"mode": "break"}, "morph.inject.mode", "needs morph.transport = auto (got 'default')"),
    ({"mode": "brake"}, "morph.inject.mode", "is not one of none, static, random, trace, break"),
]

BAD_SYNTHETIC = [
    ({"fwd_ms": "10,10"}, "morph.synthetic.fwd_ms", "needs 1 or 4 values"),
    ({"bwd_ms": "-1"}, "morph.synthetic.bwd_ms", ">= 0"),
    ({"wgt_ms": "fast"}, "morph.synthetic.wgt_ms", "not a number"),
    ({"wgt_ms": []}, "morph.synthetic.wgt_ms", "needs at least 1"),
    ({"hidden": 0}, "morph.synthetic.hidden", ">= 16"),
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
    with pytest.raises(ConfigError) as err:
        _resolved(morph, 4, 12_500)
    message = str(err.value)
    assert message.startswith(key + ": ") and allowed in message, message


def test_good_values_pass():
    _resolved(Morph(), 4)
    _resolved(Morph(), None)
    good = Morph(
        memory_budget=12,
        plan_delays_ms="0,0,60",
        stage_times_ms="10,20,10;10,20,10;12,22,11;15,25,12",
        inject=Inject(mode="static", delays_ms="0,inf,60", direction="fwd", start_step=3, end_step=9),
        synthetic=Synthetic(enabled=True, fwd_ms="5,5,5,6"),
    )
    _resolved(good, 4, limit=12_500)
    assert good.inject.delays_ms == [0.0, math.inf, 60.0] and good.synthetic.fwd_ms == [5.0, 5.0, 5.0, 6.0]
    _resolved(Morph(inject=Inject(mode="random", random_mean_ms=30, random_std_ms=10, links="1")), 4)
    _resolved(Morph(delegates_per_link=64, inject=Inject(delays_ms=12_500)), 4, limit=12_500)
    _resolved(Morph(inject=Inject(mode="trace", trace_file="table3")), 4)
    _resolved(Morph(transport="auto", inject=Inject(mode="break", links="1", start_step=3)), 4)


def test_break_mode_names_links_and_steps_and_models_no_delay():
    cfg = _parse(
        "--morph.transport",
        "auto",
        "--morph.inject.mode",
        "break",
        "--morph.inject.links",
        "1",
        "--morph.inject.start_step",
        "3",
    )
    _resolved(cfg.morph, cfg.parallelism.pipeline_parallel_degree)
    inject = _resolved(cfg.morph, 4).inject
    assert break_window(inject, 3) == (frozenset({1}), 3, 0)
    assert link_model(inject, 3) is None
    assert break_window(_inject(mode="break", end_step=5), 3) == (frozenset({0, 1, 2}), 1, 5)
    assert break_window(_inject(mode="static", delays_ms=[0, 0, 60]), 3) is None
    with pytest.raises(ConfigError, match=r"^morph\.inject\.links: .* link ids are 0\.\.2"):
        _resolved(Morph(transport="auto", inject=Inject(mode="break", links="3")), 4)


def test_unknown_keys_name_the_key_and_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"^morph\.memory_budgett: unknown key \(did you mean memory_budget\?\)"):
        check_unknown_keys({"memory_budgett": 4}, Morph, "morph")
    with pytest.raises(ConfigError, match=r"morph\.inject\.delay_ms.*delays_ms"):
        check_unknown_keys({"inject": {"delay_ms": "0,1"}}, Morph, "morph")
    with pytest.raises(ConfigError, match=r"must be a table \[morph\.synthetic\]"):
        check_unknown_keys({"synthetic": 3}, Morph, "morph")
    check_unknown_keys(
        {"transport": "auto", "inject": {"mode": "none"}, "synthetic": {"enabled": False}}, Morph, "morph"
    )


def test_negated_boolean_flags_are_spelled_with_a_value():
    from titan_morph.config.cli import expand_negated_flags, option_fields
    from titan_morph.config.schema import JobConfig

    argv = ["--morph.no-adapt", "--morph.synthetic.no_enabled", "--morph.no-such", "--compile.no-enable", "--x", "1"]
    assert expand_negated_flags(argv, option_fields(JobConfig)) == [
        "--morph.adapt",
        "false",
        "--morph.synthetic.enabled",
        "false",
        "--morph.no-such",
        "--compile.no-enable",
        "--x",
        "1",
    ]
    morph = _parse(*prepare_args(["--job.config_file", str(DEFAULT_CONFIG), "--morph.no-adapt"])[2:]).morph
    assert morph.adapt is False and morph.monitor is True


def test_prepare_args_rejects_unknown_toml_key_and_adds_config_module(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[morph]\ntransprot = "auto"\n')
    with pytest.raises(ConfigError, match=r"morph\.transprot: unknown key"):
        prepare_args(["--job.config_file", str(bad)])
    plain = tmp_path / "plain.toml"
    plain.write_text("[training]\nsteps = 1\n")
    assert prepare_args(["--job.config_file", str(plain)])[-2:] == ["--job.custom_config_module", CONFIG_MODULE]
    assert prepare_args(["--job.config_file", str(DEFAULT_CONFIG)]) == ["--job.config_file", str(DEFAULT_CONFIG)]


def test_typed_views():
    assert _resolved(Morph(stage_times_ms=""), 4).stage_times(4) is None
    assert _resolved(Morph(stage_times_ms=[]), 4).stage_times(4) is None
    triples = ((1.0, 2.0, 3.0), (1.0, 2.0, 3.0))
    assert _resolved(Morph(stage_times_ms="1,2,3"), 2).stage_times(2) == triples
    assert _resolved(Morph(stage_times_ms=[1, 2, 3])).stage_times(2) == triples  # a lone group, layout unknown
    assert _resolved(Morph(), 4).stage_times(4) is None  # unknown: profiled during the first profile_steps steps
    assert _resolved(Morph(synthetic=Synthetic(enabled=True, fwd_ms=[5, 6], bwd_ms=7)), 2).stage_times(2) == (
        (5.0, 7.0, 10.0),
        (6.0, 7.0, 10.0),
    )
    assert _resolved(Morph(), 4).plan_delays(3) is None
    assert _resolved(Morph(plan_delays_ms=[20]), 4).plan_delays(3) == (20.0, 20.0, 20.0)
    model = link_model(_inject(mode="static", delays_ms="0,50", direction="fwd", start_step=2), 2)
    assert model is not None
    assert model.delay_ms(1, "fwd", step=2) == 50.0
    assert model.delay_ms(1, "bwd", step=2) == 0.0  # direction filter
    assert model.delay_ms(1, "fwd", step=1) == 0.0  # before start_step
    assert link_model(_inject(), 3) is None
    trace = link_model(_inject(mode="trace", trace_file="table3"), 3, steps=100)
    assert trace is not None and math.isinf(max(trace.snapshot(step=100)))


def test_world_size_from_config_and_overrides():
    assert load(DEFAULT_CONFIG)[1].world_size == 4
    assert load(DEFAULT_CONFIG, ["--parallelism.pipeline_parallel_degree", "2"])[1].world_size == 2
    assert load(DEFAULT_CONFIG, ["--parallelism.pipeline_parallel_degree=3"])[1].world_size == 3


def test_run_id_is_shared_by_the_ranks_of_one_launch(monkeypatch):
    from titan_morph.integration.titan022.trainer import run_id

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
    _resolved(morph, 4)
    model = link_model(_resolved(morph, 4).inject, 3)
    assert model is not None and model.delay_ms(2, "bwd", step=5) == 40.0 and model.delay_ms(2, "fwd", step=9) == 0.0
    with pytest.raises(ConfigError, match=r"morph\.inject\.trace_file.*out of range"):
        _resolved(morph, 2)  # one link only
    trace.write_text("when,link\n1,0\n")
    with pytest.raises(ConfigError, match=r"morph\.inject\.trace_file.*needs columns"):
        _resolved(morph, 4)
    trace.write_text("step,link,delay_ms\n3,2,40\n8,2\n")  # a short row
    with pytest.raises(ConfigError, match=r"morph\.inject\.trace_file.*line 3 has 2 fields, the header has 3"):
        _resolved(morph, 4)
    trace.write_text("step,link,delay_ms\n3,2,40\n8,2,inf\n")
    _resolved(morph, 4, limit=100.0)  # inf = link down: not a delay
    trace.write_text("step,link,delay_ms\n3,2,400\n")
    with pytest.raises(ConfigError, match=r"morph\.inject\.trace_file.*400 ms.*delay limit 100 ms"):
        _resolved(morph, 4, limit=100.0)


def test_plan_delays_make_pipemorph_plan_for_them():
    """plan_delays_ms: PipeMorph starts from Alg. 2 for those delays (more warm-up before the slow link)."""
    assert _resolved(Morph(plan_delays_ms=""), 4).plan_delays(3) is None
    assert _resolved(Morph(plan_delays_ms="60"), 4).plan_delays(3) == (60.0, 60.0, 60.0)
    base = replace(Morph(), memory_budget=7, stage_times_ms="10,10,10")

    def initial_plan(family: str, morph: Morph, stages: int, n: int):
        from titan_morph.integration.plans import initial_plan

        return initial_plan(family, _resolved(morph, stages), stages, n)

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


def test_plan_for_a_distribution_of_delays():
    """plan_delays_std_ms: the initial plan minimises the expected makespan over plan_samples vectors
    drawn from N(plan_delays_ms, std) -- deterministic (the same on every rank), never worse on those
    samples than the plan for the mean alone."""
    from titan_morph.integration.plans import initial_plan
    from titan_morph.pipelining.search.robust import expected_makespan

    base = _resolved(
        replace(Morph(), stage_times_ms=[10, 10, 10], plan_delays_ms=[30], search=True, search_iterations=40), 4
    )
    assert base.plan_delay_samples(3) is None  # no std: one vector
    robust = replace(base, plan_delays_std_ms=(10.0,) * 3, plan_samples=8, plan_seed=3)
    samples = robust.plan_delay_samples(3)
    assert samples is not None and len(samples) == 8 and samples == robust.plan_delay_samples(3)
    plan, mean = initial_plan("pipemorph", robust, 4, 12), initial_plan("pipemorph", base, 4, 12)
    assert plan.orders == initial_plan("pipemorph", robust, 4, 12).orders
    assert expected_makespan(plan.model, plan.orders, samples) <= expected_makespan(plan.model, mean.orders, samples)
    distribution = Morph(stage_times_ms=[10, 10, 10], plan_delays_ms=[30], plan_delays_std_ms=[10], search=True)
    assert _resolved(distribution, 4).plan_delays_std_ms == (10.0, 10.0, 10.0)
    with pytest.raises(ConfigError, match="morph.plan_delays_std_ms.*needs morph.search"):
        _resolved(replace(distribution, search=False), 4)
    with pytest.raises(ConfigError, match="morph.plan_delays_std_ms.*needs plan_delays_ms"):
        _resolved(replace(distribution, plan_delays_ms=[]), 4)


def test_the_step_window_and_direction_apply_to_transmit_times_too():
    """[morph.inject]'s window and direction restrict a link model's transmit times as its delays."""
    from titan_morph.config.links import _Windowed
    from titan_morph.pipelining.core.links import StaticDelays

    windowed = _Windowed(StaticDelays((0.0, 50.0), transmit=(0.0, 7.0)), start_step=2, end_step=4, direction="fwd")
    assert (windowed.delay_ms(1, "fwd", step=3), windowed.transmit_ms(1, "fwd", step=3)) == (50.0, 7.0)
    assert windowed.transmit_ms(1, "bwd", step=3) == 0.0  # the other direction
    assert windowed.transmit_ms(1, "fwd", step=1) == windowed.transmit_ms(1, "fwd", step=5) == 0.0  # outside
    assert windowed.transmit_snapshot(step=3) == (0.0, 7.0)


def test_host_ifnames_takes_one_interface() -> None:
    morph = Morph(host_ifnames="host")
    assert resolve_morph(morph).host_interfaces == ("host",)
    with pytest.raises(ConfigError, match=r"^morph.host_ifnames: .*more than one interface: give one"):
        resolve_morph(Morph(host_ifnames="host,host2"))


def test_the_default_path_on_its_own_nic_is_routed() -> None:
    """``data_ifname`` puts the default path on per-link groups bound to that NIC: torch schedules'
    traffic must then go through titan_morph's transport even without injection."""
    assert not resolve_morph(Morph()).routed
    assert resolve_morph(Morph(data_ifname="data")).routed


def test_a_file_the_run_writes_is_checked_before_any_rank(tmp_path):
    _resolved(Morph(profiles_file=str(tmp_path / "profiles.jsonl")), 4)
    cases = [
        (tmp_path / "missing" / "profiles.jsonl", "is in a folder that does not exist"),
        (tmp_path, "is a folder"),
    ]
    for path, why in cases:
        with pytest.raises(ConfigError) as err:
            _resolved(Morph(profiles_file=str(path)), 4)
        assert str(err.value).startswith("morph.profiles_file: ") and why in str(err.value), err.value


EARLY = """
import sys
from titan_morph.config import ConfigError
from titan_morph.integration.titan022.jobconfig import check_early
try:
    check_early(sys.argv[1], sys.argv[2:])
    print("passed")
except ConfigError as err:
    print(err)
assert "torch" not in sys.modules and "torchtitan" not in sys.modules, "the early checks imported torch"
"""


@pytest.mark.parametrize(
    ("toml", "args", "expected"),
    [
        ("[morph]\ntransport = 'auto'\n", ["--morph.transport", "bogus"], "morph.transport: 'bogus' is not one of"),
        ("[morph\n", [], "invalid TOML"),
        ("[morph]\ntransprt = 'auto'\n", [], "morph.transprt: unknown key (did you mean transport?)"),
        ("[morph]\ninject.delays_ms = [0, -5]\n", [], "morph.inject.delays_ms"),
        ("[morph]\nmonitor = true\n", ["--morph.no-adapt", "--training.steps", "3"], "passed"),
        # the overrides' values are checked with the TOML's: files, lists, combinations
        ("", ["--morph.profiles_file", "{tmp}/missing/p.jsonl"], "morph.profiles_file: '{tmp}/missing/p.jsonl' is in"),
        ("", ["--morph.inject.mode", "trace", "--morph.inject.trace_file", "{tmp}/no.csv"], "no.csv' file not found"),
        ("", ["--morph.inject.delays_ms", "0,-5", "--morph.inject.mode", "static"], "morph.inject.delays_ms"),
        (
            "[morph.inject]\nmode = 'static'\ncompute_factor = [1, 2]\n",
            ["--morph.inject.mode=trace", "--morph.inject.trace_file", "train_configs/traces/changing_link.csv"],
            "morph.inject.compute_factor: [1.0, 2.0] needs mode = static or random, got mode = 'trace'",
        ),
        ("[morph]\nmonitor = true\n", ["--morph.profiles_file", "{tmp}/p.jsonl", "--morph.adapt", "false"], "passed"),
    ],
)
def test_early_checks_report_a_typo_before_torch_loads(tmp_path, toml, args, expected):
    import subprocess
    import sys

    path = tmp_path / "job.toml"
    path.write_text(toml)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    expected = expected.replace("{tmp}", str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", EARLY, str(path), *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert expected in out.stdout, out.stdout
