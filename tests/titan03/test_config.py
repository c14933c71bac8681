"""TorchTitan 0.3.0: the config functions and the checks made before any rank starts.

Every shipped TOML has its config function in ``titan_morph.configs``; the ``morph`` field has the
[morph] table's options under the same names (so the same ``--morph.*`` overrides); a bad value is
one line ``error: <key>: ...`` and exit code 2, from the launcher and from ``./run_train.sh``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.launch import REPO, _child_env
from tests.titan03.runs import check

TRANSPORT_ERROR = "error: morph.transport: 'bogus' is not one of default, delegate, auto"
SHIPPED = {
    "debug_cpu": 4,
    "straggler_demo_cpu": 4,
    "synthetic_cpu": 4,
    "adapt_cpu": 4,
    "hybrid_cpu": 4,
    "partition_cpu": 4,
    "tp_pp_cpu": 4,
}
"""Config function -> ranks, one per TOML of train_configs/ (llama3_8b_pp8 is a GPU example)."""


def test_a_bad_value_is_one_line_and_exit_2() -> None:
    result = check("debug_cpu", "--morph.transport", "bogus")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [TRANSPORT_ERROR]


def test_run_train_checks_before_any_rank() -> None:
    env = _child_env({"TORCHTITAN": "0.3.0", "VENV": sys.prefix})
    result = subprocess.run(
        ["./run_train.sh", "--morph.transport", "bogus"], cwd=REPO, capture_output=True, text=True, timeout=600, env=env
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith(("[setup]", "WARNING", "ERROR: pip"))]
    assert lines == [TRANSPORT_ERROR]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--morph.inject.delays_ms", "0,0,abc"), "error: morph.inject.delays_ms: 'abc' is not a number"),
        (("--training.stepz", "3"), "error: unrecognized option(s): --training.stepz (did you mean --training.steps?)"),
        (("--morph.memory_budget", "2"), "error: morph.memory_budget: 2 must be 0 or >= the pipeline degree (4)"),
        (("--parallelism.pipeline_parallel_schedule", "Foo"), "error: parallelism.pipeline_parallel_schedule: 'Foo'"),
    ],
)
def test_bad_overrides_name_the_key(args: tuple[str, ...], message: str) -> None:
    result = check("debug_cpu", *args)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(message), result.stderr


def test_an_unknown_config_function_lists_the_shipped_ones() -> None:
    result = check("nope")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: config: 'nope' is not one of {', '.join(sorted(SHIPPED))} (module titan_morph.configs)"
    ]


def test_every_shipped_job_resolves_with_its_ranks() -> None:
    from titan_morph.integration.titan03.jobconfig import load

    for function, ranks in SHIPPED.items():
        assert load(function)[1].world_size == ranks, function


def test_dp_x_pp_resolves_as_a_hybrid_job() -> None:
    """``hybrid_cpu``: PP = 2 x FSDP = 2, the checkpoint on (a topology move resumes from it)."""
    from titan_morph.integration.titan03.jobconfig import load

    _, settings = load("hybrid_cpu")
    assert settings.hybrid and (settings.stages, settings.dp_degree) == (2, 2)
    assert settings.job.checkpoint and settings.morph.orchestrator == "pp"
    assert check("hybrid_cpu").returncode == 0


def test_the_morph_field_has_the_toml_options() -> None:
    """Same names as 0.2.2's [morph] table, so the same --morph.* overrides."""
    import titan_morph.configs as configs
    from titan_morph.config.cli import option_fields
    from titan_morph.config.schema import JobConfig
    from titan_morph.integration.titan03.jobconfig import option_fields_of

    on_03 = {k for k in option_fields_of(configs.debug_cpu()) if k.startswith("morph.")}
    assert on_03 == set(option_fields(JobConfig))


def test_negated_flags_and_lists_reach_the_settings() -> None:
    from titan_morph.integration.titan03.jobconfig import load

    _, settings = load(
        "debug_cpu", ["--morph.no-adapt", "--morph.inject.mode", "static", "--morph.inject.delays_ms", "0,20,0"]
    )
    assert settings.morph.adapt is False
    assert settings.morph.inject.delays_ms == (0.0, 20.0, 0.0)


def test_the_config_functions_match_their_tomls() -> None:
    """Each function keeps its TOML's [morph] table and the job's sizes."""
    import tomllib

    from titan_morph.integration.titan03.jobconfig import parse

    for function in SHIPPED:
        toml = tomllib.loads((REPO / "train_configs" / f"{function}.toml").read_text())
        config = parse("titan_morph.configs", function, ())
        assert config.training.local_batch_size == toml["training"]["local_batch_size"], function
        assert config.training.seq_len == toml["training"]["seq_len"], function
        assert config.training.steps == toml["training"]["steps"], function
        assert config.parallelism.pipeline_parallel_schedule == toml["parallelism"]["pipeline_parallel_schedule"]
        for key, value in toml["morph"].items():
            if not isinstance(value, dict):
                assert getattr(config.morph, key) == value, f"{function}: morph.{key}"
        for table in ("inject", "synthetic"):
            for key, value in toml["morph"].get(table, {}).items():
                got = getattr(getattr(config.morph, table), key)
                assert got == value, f"{function}: morph.{table}.{key}: {got} vs {value}"
        degrees = toml["parallelism"]
        assert config.parallelism.pipeline_parallel_degree == degrees["pipeline_parallel_degree"], function
        assert config.parallelism.data_parallel_shard_degree == degrees.get("data_parallel_shard_degree", 1), function
    assert os.path.isdir(REPO / "titan_morph" / "assets" / "tokenizer")
