"""The monitor's re-plans change no gradient: real jobs (llama3 debug, PP = 4, 12 steps) whose
losses and grad norms equal an undisturbed run's (rel 1e-5).

* a slow link (60 ms on link 1, steps 3-6): the re-plan (the search on), the link on the
  delegates, and the re-plan back once it recovers;
* ``partition = "auto"``: the re-plan from the stage times measured over the first steps, and a
  slow rank's re-plan for its measured speed (layers kept: no relaunch), the run in issue 40.

The rebalance across DP replicas and the re-partition's relaunch compare the same figures in
``test_rebalance_runs.py`` and ``test_partition_runs.py``; every plan the planner makes is checked
against the unsplit model's gradients in ``tests/runtime/test_plan_gradients.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch import GRAD_NORM_TAG, RunResult, assert_same_training, torchrun

STEPS = 12
COMMON = ("--training.steps", str(STEPS), "--training.seq_len", "64", "--metrics.log_freq", "1")


def _run(folder: Path, *overrides: str) -> RunResult:
    result = torchrun(4, folder, *COMMON, *overrides, timeout_s=400)
    assert result.returncode == 0, f"training failed (exit {result.returncode}):\n{result.tail(80)}"
    return result


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    run = _run(tmp_path_factory.mktemp("replan") / "undisturbed")
    assert len(set(run.scalars(GRAD_NORM_TAG).values())) == STEPS  # the model trains
    return run


def test_a_slow_link_re_plan_and_its_recovery_keep_the_gradients(undisturbed, tmp_path, no_leftovers):
    run = _run(
        tmp_path / "link",
        *("--morph.inject.mode", "static", "--morph.inject.delays_ms", "0,60,0"),
        *("--morph.inject.start_step", "3", "--morph.inject.end_step", "6"),
        *("--morph.detect_consecutive", "2", "--morph.recover_consecutive", "2", "--morph.search", "true"),
    )
    assert "link 1 slow" in run.output and "link 1 recovered" in run.output, run.tail(80)
    assert max(run.scalars("morph/delegated/link1").values()) == 1.0  # the slow link ran on the delegates
    assert_same_training(run, undisturbed, "slow link", STEPS)
    no_leftovers(tmp_path / "link")


def test_partition_auto_re_plans_keep_the_gradients(undisturbed, tmp_path, no_leftovers):
    run = _run(
        tmp_path / "auto",
        *("--checkpoint.enable", "--checkpoint.interval", "1000", "--morph.partition", "auto"),
        *("--morph.repartition_after", "1000"),  # the rental never pays for a relaunch here
        *("--morph.inject.mode", "static", "--morph.inject.compute_factor", "1,1,3,1"),
        *("--morph.inject.start_step", "5", "--morph.detect_consecutive", "2"),
    )
    assert "stage times measured over" in run.output and "rank 2 slow" in run.output, run.tail(80)
    assert "relaunching" not in run.output
    assert_same_training(run, undisturbed, "partition auto", STEPS)
    no_leftovers(tmp_path / "auto")
