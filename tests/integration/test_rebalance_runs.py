"""Microbatches moved between DP replicas, real torchrun (train_configs/hybrid_cpu.toml: DP 2 x PP 2
on 4 gloo ranks, the synthetic testbed, N = 8 per replica, the topology orchestrator on).

* rank 3 (stage 1 of replica 1) computes twice as slow from step 4 to 8: the split moves to uneven,
  returns to even after the straggler's end, and the losses and grad norms equal the undisturbed
  run's; its control plane talks on groups of its own (``control_groups = "separate"``, an NCCL
  job's path), the undisturbed run's on the job's;
* the undisturbed run never rebalances; a run started uneven (``replica_microbatches``) trains to
  the same losses; under ``partition = "auto"`` the replicas keep their layers, microbatches move;
* (slow) a topology move and then a rebalance in one job, losses the undisturbed run's;
* bad counts stop ``./run_train.sh`` before any rank: one line, exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.launch import REPO, RunResult, assert_same_training, check_like_run_train, launch
from titan_morph.integration.supervisor import torchrun_command

CONFIG = REPO / "train_configs" / "hybrid_cpu.toml"
STEPS = 16  # the return needs 2 steps read healthy after step 8: room for a loaded host
BASE = (
    "--training.local_batch_size",
    "8",
    "--training.steps",
    str(STEPS),
)
# short windows where a straggler is injected; the undisturbed run keeps the default detector, whose
# claim is that it never moves microbatches without a straggler
RULES = ("--morph.detect_consecutive", "2", "--morph.recover_consecutive", "2")
SLOW = (
    *RULES,
    "--morph.inject.mode",
    "static",
    "--morph.inject.compute_factor",
    "1,1,1,2",
    "--morph.inject.start_step",
    "4",
    "--morph.inject.end_step",
    "8",
)
SPLIT = "morph/microbatches/replica"


def _run(folder, *overrides: str) -> RunResult:
    result = launch(torchrun_command(CONFIG, folder, 4, [*BASE, *overrides]), folder, timeout_s=400)
    assert result.returncode == 0, f"training failed (exit {result.returncode}):\n{result.tail(80)}"
    return result


def _losses(result: RunResult) -> dict[int, float]:
    losses = result.losses()
    assert sorted(losses) == list(range(1, STEPS + 1)), f"loss per step: {losses}"
    return losses


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return _run(tmp_path_factory.mktemp("rebalance") / "undisturbed")


def test_undisturbed_run_never_rebalances(undisturbed, no_leftovers):
    rebalances = undisturbed.scalars("morph/rebalances")
    assert sorted(rebalances) == list(range(1, STEPS + 1)) and set(rebalances.values()) == {0.0}, rebalances
    assert set(undisturbed.scalars(f"{SPLIT}0").values()) == {8.0}
    assert "microbatches per replica" not in undisturbed.output
    assert len(set(_losses(undisturbed).values())) == STEPS  # the model trains
    no_leftovers(undisturbed.dump_folder)


def test_slow_rank_moves_microbatches_and_back_with_the_undisturbed_losses(undisturbed, tmp_path, no_leftovers):
    # the control plane on groups of its own, as on NCCL (the undisturbed run: on the job's own)
    result = _run(tmp_path / "slow", *SLOW, "--morph.control_groups", "separate")
    ones, zeros = result.scalars(f"{SPLIT}1"), result.scalars(f"{SPLIT}0")
    # the split after each step (the next step runs it): uneven from the detection (2 slow steps from
    # step 4: step 5 at the earliest) until 2 steps after the straggler's end read healthy (step 10 on a
    # quiet host, later when the host's load hides some), even again before the run ends
    uneven = [s for s in sorted(ones) if ones[s] < 8]
    assert uneven and min(uneven) >= 5 and 8 <= max(uneven) < STEPS, ones
    assert uneven == list(range(min(uneven), max(uneven) + 1)), ones  # one move away, one move back
    assert all(ones[s] + zeros[s] == 16 for s in ones), (zeros, ones)
    assert min(ones.values()) <= 6 and ones[STEPS] == 8.0 and zeros[STEPS] == 8.0, ones
    assert max(result.scalars("morph/rebalances").values()) >= 2.0  # away and back (a re-read speed may add one)
    out = result.output
    assert "microbatches per replica [8, 8] -> [" in out and "-> [8, 8] (global batch 16 unchanged" in out, result.tail(
        80
    )
    assert "replica 1 runs" in out or "replica 0 runs" in out
    assert_same_training(result, undisturbed, "rebalanced", STEPS)
    no_leftovers(tmp_path)


@pytest.mark.slow
def test_a_run_started_uneven_trains_to_the_same_losses(undisturbed, tmp_path, no_leftovers):
    fixed = ("--morph.replica_microbatches", "3,13", "--morph.rebalance_microbatches", "false")
    result = _run(tmp_path / "fixed", *fixed)
    assert set(result.scalars(f"{SPLIT}1").values()) == {13.0}
    assert_same_training(result, undisturbed, "3/13 split", STEPS)
    no_leftovers(tmp_path)


@pytest.mark.slow
def test_partition_auto_re_plans_each_pipeline_and_moves_microbatches_not_layers(tmp_path, no_leftovers):
    auto = ("--morph.partition", "auto", "--morph.synthetic.layers", "4", "--morph.synthetic.fwd_ms", "5")
    more = ("--morph.synthetic.bwd_ms", "5", "--morph.synthetic.wgt_ms", "5")
    result = _run(tmp_path / "auto", *SLOW, *auto, *more)
    assert max(result.scalars("morph/rebalances").values()) >= 1, result.tail(80)
    assert set(result.scalars("morph/repartitions").values()) <= {0.0}  # DP replicas keep one split
    for s in range(2):
        assert set(result.scalars(f"morph/partition/stage{s}").values()) == {2.0}
    assert "Training starts at step 1" in result.output and "Training starts at step 2" not in result.output
    no_leftovers(tmp_path)


@pytest.mark.slow
def test_a_topology_move_then_a_rebalance_in_one_job(undisturbed, tmp_path, no_leftovers):
    """A slow DP pair (hosts 0-1) is moved onto a pipeline link first; host 1's device, twice as slow
    from step 1, moves with its host (rank 1 -> rank 2: stage 1 of replica 0), and the relaunched
    job moves microbatches away from replica 0. Losses: the undisturbed run's."""
    pair = ("--morph.inject.rank_links", "0-1", "--morph.inject.delays_ms", "40")
    slow_host = ("--morph.inject.compute_factor", "1,2,1,1", "--morph.inject.start_step", "1")
    result = _run(tmp_path / "both", *RULES, "--morph.inject.mode", "static", *pair, *slow_host)
    out = result.output
    assert "relaunching after step 2 with the host of each rank [0, 2, 1, 3]" in out, result.tail(80)
    zeros = result.scalars(f"{SPLIT}0")
    assert zeros[STEPS] < 8 and result.scalars(f"{SPLIT}1")[STEPS] == 16 - zeros[STEPS], zeros
    assert "-> replica 0 runs" in out or "-> replica 1 runs" in out
    assert_same_training(result, undisturbed, "moved, then rebalanced", STEPS)
    no_leftovers(tmp_path)


BAD = {
    "zero": ("0,16", "gives replica 0 no microbatches: every replica needs >= 1"),
    "unsplit": ("7,7", "sums to 14; the global batch is 16 microbatches"),
    "count": ("4,4,8", "needs one count per data-parallel replica (2 replicas), got 3"),
}


@pytest.mark.parametrize("case", BAD)
def test_the_launchers_check_refuses_bad_counts_in_one_line(case, tmp_path, monkeypatch, capsys):
    counts, expected = BAD[case]
    dump = tmp_path / "run"
    args = [*BASE, "--morph.replica_microbatches", counts, "--job.dump_folder", str(dump)]
    code, lines = check_like_run_train(CONFIG, args, {}, monkeypatch, capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: morph.replica_microbatches: "), lines
    assert expected in lines[0] and not dump.exists(), lines[0]


@pytest.mark.parametrize("case", [c if c == "zero" else pytest.param(c, marks=pytest.mark.slow) for c in BAD])
def test_bad_counts_are_one_line_and_exit_2_before_any_rank(case, tmp_path):
    counts, expected = BAD[case]
    dump = tmp_path / "run"
    env = {**os.environ, "VENV": sys.prefix, "CONFIG_FILE": str(CONFIG), "PYTHONUNBUFFERED": "1"}
    env.pop("TITAN_MORPH_RUN_ID", None)
    args = [*BASE, "--morph.replica_microbatches", counts, "--job.dump_folder", str(dump)]
    result = subprocess.run(
        [str(REPO / "run_train.sh"), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[setup]")]
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: morph.replica_microbatches: "), result.stderr
    assert expected in lines[0], lines[0]
    assert result.stdout == "" and not dump.exists(), "no rank may have started"
