"""Real multi-process training through ``run_train.sh`` / ``torchrun`` on CPU (gloo).

Each launch costs ~8-10 s of start-up; the CI subset keeps to a handful of launches.
"""

from __future__ import annotations

import json
import math
import sys

import pytest

from tests.launch import DEFAULT_CONFIG, LOSS_TAG, REPO, TPS_TAG, launch, torchrun


def _assert_ok(result) -> None:
    assert result.returncode == 0, f"training failed (exit {result.returncode}):\n{result.tail()}"


def test_run_train_sh_default_config(tmp_path, no_leftovers):
    """./run_train.sh trains the default config on 4 ranks: exit 0, loss falls, TensorBoard written."""
    dump = tmp_path / "run"
    steps = 6
    result = launch(
        [str(REPO / "run_train.sh"), "--training.steps", str(steps), "--job.dump_folder", str(dump)],
        dump,
        env={"PYTHON": sys.executable},
    )
    _assert_ok(result)
    assert "run_train.sh: 4 ranks" in result.output
    losses = result.losses()
    assert sorted(losses) == list(range(1, steps + 1)), f"loss scalars per step: {losses}"
    assert all(math.isfinite(v) and v > 0 for v in losses.values())
    assert losses[steps] < losses[1] - 0.5, f"loss did not fall: {losses}"
    tps = result.scalars(TPS_TAG)
    assert sorted(tps) == list(range(1, steps + 1)) and all(v > 0 for v in tps.values())
    # The run folder is self-describing: resolved config, the TOML it came from, launch info.
    config = json.loads((dump / "config.json").read_text())
    assert config["model"]["name"] == "llama3_morph"
    assert config["parallelism"]["pipeline_parallel_degree"] == 4
    assert config["morph"]["inject"]["mode"] == "none"
    assert (dump / "job.toml").read_text() == DEFAULT_CONFIG.read_text()
    assert json.loads((dump / "run.json").read_text())["world_size"] == 4
    no_leftovers(dump)


@pytest.mark.slow  # the default run compares losses with torch's 1F1B in test_schedule_losses
@pytest.mark.parametrize("ranks", [2, 4])
def test_losses_equal_stock_llama3_pipelining(tmp_path, ranks, no_leftovers):
    """llama3_morph (one stage per rank, our pipelining_fn) == TorchTitan's llama3 path, same 1F1B/seed/data."""
    common = ("--training.steps", "3", "--parallelism.pipeline_parallel_schedule", "1F1B")
    ours = torchrun(ranks, tmp_path / "morph", "--model.name", "llama3_morph", *common)
    _assert_ok(ours)
    assert "titan_morph: pipeline schedule 1F1B" in ours.output
    stock = torchrun(ranks, tmp_path / "stock", "--model.name", "llama3", *common)
    _assert_ok(stock)
    assert "titan_morph: pipeline schedule" not in stock.output  # really TorchTitan's pipeline_llm
    a, b = ours.losses(), stock.losses()
    assert sorted(a) == sorted(b) == [1, 2, 3], (a, b)
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-5), f"step {step}: {a[step]} vs {b[step]}"
    no_leftovers(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_losses_equal_stock_other_schedules(tmp_path, schedule):
    """Same equality for GPipe (and 1F1B with 16 microbatches), 4 ranks, 4 steps."""
    common = ("--training.steps", "4", "--parallelism.pipeline_parallel_schedule", schedule)
    if schedule == "1F1B":
        common += ("--training.local_batch_size", "16")
    ours = torchrun(4, tmp_path / "morph", "--model.name", "llama3_morph", *common)
    stock = torchrun(4, tmp_path / "stock", "--model.name", "llama3", *common)
    _assert_ok(ours)
    _assert_ok(stock)
    assert ours.losses() == pytest.approx(stock.losses(), rel=1e-5)


@pytest.mark.slow
def test_bad_morph_value_fails_fast_end_to_end(tmp_path, no_leftovers):
    """A bad [morph] value stops every rank before training, with the key and allowed values."""
    result = torchrun(2, tmp_path / "bad", "--morph.inject.mode", "sometimes", timeout_s=120)
    assert result.returncode != 0
    assert "morph.inject.mode" in result.output and "invalid choice 'sometimes'" in result.output
    assert "step:" not in result.output and "Training starts" not in result.output
    no_leftovers(tmp_path)


@pytest.mark.slow
def test_unknown_schedule_is_a_clear_error(tmp_path):
    result = torchrun(2, tmp_path / "bad", "--parallelism.pipeline_parallel_schedule", "Zigzag", timeout_s=120)
    assert result.returncode != 0
    assert "pipeline_parallel_schedule: 'Zigzag' is not one of" in result.output and "1F1B" in result.output


@pytest.mark.slow
def test_run_train_sh_ten_steps(tmp_path):
    """The acceptance run: ./run_train.sh, default config, 4 ranks, 10 steps, loss falls."""
    dump = tmp_path / "run"
    result = launch([str(REPO / "run_train.sh"), "--job.dump_folder", str(dump)], dump)
    _assert_ok(result)
    losses = result.losses()
    assert sorted(losses) == list(range(1, 11))
    assert losses[10] < losses[1] - 1.0
    assert LOSS_TAG in result.output or "loss:" in result.output


def test_plugged_in_schedule_runs_and_reports_metrics(tmp_path, no_leftovers):
    """A schedule registered by a plug-in module is built by llama3_morph; its metrics reach TensorBoard."""
    result = torchrun(
        2,
        tmp_path / "probe",
        "--training.steps",
        "2",
        "--experimental.custom_import",
        "probe_schedule",
        "--parallelism.pipeline_parallel_schedule",
        "Probe1F1B",
        env={"PYTHONPATH": str(REPO / "tests" / "integration")},
    )
    _assert_ok(result)
    assert result.scalars("morph/probe_steps") == {1: 1.0, 2: 2.0}
    assert result.scalars("morph/probe_stage") == {1: 1.0, 2: 1.0}  # written by the last stage
    assert sorted(result.losses()) == [1, 2]
    no_leftovers(tmp_path)
