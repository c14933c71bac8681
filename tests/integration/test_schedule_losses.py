"""Acceptance: titan_morph's schedules train exactly like TorchTitan's stock 1F1B (real torchrun, CPU).

Per-step losses of ``PipeMorph``, ``ZBH1`` and ``ZBH2`` (MorphSchedule, ``llama3_morph``) must equal
those of TorchTitan's own llama3 + torch ``Schedule1F1B`` within 1e-5 relative over 5 steps, at PP=2
and PP=4, with and without emulated link delays (``[morph.inject]``, which only delay messages),
and across a mid-run ``set_plan`` (``replan_schedule.ReplanZBH1`` switches plans at step 3).

The llama3 debug model runs with short sequences to keep each launch at ~10-40 s; the CI subset is
PP=4 with delays (PipeMorph planned for them) and the re-plan; the rest is ``slow``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch import REPO, torchrun

STEPS = 5
COMMON = ("--training.steps", str(STEPS), "--training.seq_len", "32", "--metrics.log_freq", "1")
PLUGIN_ENV = {"PYTHONPATH": str(REPO / "tests" / "integration")}


def _delays(ranks: int) -> tuple[str, ...]:
    """20 ms on the middle link (PP=4: "0,20,0"; PP=2: "20")."""
    values = ["0"] * (ranks - 1)
    values[(ranks - 1) // 2] = "20"
    delays = ",".join(values)
    return ("--morph.inject.mode", "static", "--morph.inject.delays_ms", delays, "--morph.plan_delays_ms", delays)


def _run(ranks: int, folder: Path, *args: str, env: dict[str, str] | None = None) -> dict[int, float]:
    result = torchrun(ranks, folder, *COMMON, *args, timeout_s=300, env=env)
    assert result.returncode == 0, f"training failed (exit {result.returncode}):\n{result.tail()}"
    losses = result.losses()
    assert sorted(losses) == list(range(1, STEPS + 1)), f"loss per step: {losses}"
    return losses


_reference: dict[int, dict[int, float]] = {}


def _stock(ranks: int, tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """TorchTitan's stock path: model llama3 (its pipeline_llm) with torch's Schedule1F1B."""
    if ranks not in _reference:
        folder = tmp_path_factory.mktemp(f"stock{ranks}")
        args = ("--model.name", "llama3", "--parallelism.pipeline_parallel_schedule", "1F1B")
        _reference[ranks] = _run(ranks, folder / "run", *args)
    return _reference[ranks]


def _assert_equal(got: dict[int, float], ref: dict[int, float], what: str) -> None:
    for step in ref:
        assert got[step] == pytest.approx(ref[step], rel=1e-5), f"{what}, step {step}: {got[step]} vs {ref[step]}"


CI = {(4, "PipeMorph", True)}
CASES = [
    pytest.param(r, s, d, marks=() if (r, s, d) in CI else pytest.mark.slow, id=f"pp{r}-{s}-{'d' if d else 'nod'}elay")
    for r in (2, 4)
    for s in ("PipeMorph", "ZBH1", "ZBH2")
    for d in (False, True)
]


@pytest.mark.parametrize("ranks, schedule, delayed", CASES)
def test_losses_equal_stock_1f1b(ranks, schedule, delayed, tmp_path, tmp_path_factory, no_leftovers):
    args = ("--parallelism.pipeline_parallel_schedule", schedule, *(_delays(ranks) if delayed else ()))
    got = _run(ranks, tmp_path / "run", *args)
    _assert_equal(got, _stock(ranks, tmp_path_factory), f"{schedule} PP={ranks} delayed={delayed}")
    no_leftovers(tmp_path)


@pytest.mark.parametrize(
    "ranks, delayed",
    [
        pytest.param(4, True, id="pp4-delay", marks=pytest.mark.slow),
        pytest.param(2, False, id="pp2-nodelay", marks=pytest.mark.slow),
    ],
)
def test_losses_equal_stock_1f1b_across_set_plan(ranks, delayed, tmp_path, tmp_path_factory, no_leftovers):
    """ZB-H1's plan for steps 1-2, then (set_plan between steps, all ranks) a PipeMorph plan."""
    folder = tmp_path / "run"
    args = ["--parallelism.pipeline_parallel_schedule", "ReplanZBH1", "--experimental.custom_import", "replan_schedule"]
    if delayed:
        args += _delays(ranks)[:4]
    result = torchrun(ranks, folder, *COMMON, *args, timeout_s=300, env=PLUGIN_ENV)
    assert result.returncode == 0, f"training failed (exit {result.returncode}):\n{result.tail()}"
    plan_ids = result.scalars("morph/plan_id")
    assert sorted(plan_ids) == list(range(1, STEPS + 1)), plan_ids
    assert plan_ids[1] == plan_ids[2] != plan_ids[3] == plan_ids[STEPS], f"plan did not change at step 3: {plan_ids}"
    assert result.scalars("morph/plan_changes")[STEPS] == 1.0
    _assert_equal(result.losses(), _stock(ranks, tmp_path_factory), f"ReplanZBH1 PP={ranks}")
    no_leftovers(tmp_path)
