"""TorchTitan 0.3.0: DP x PP (``hybrid_cpu``: PP = 2 x FSDP = 2 on 4 real ranks, synthetic testbed).

* PipeMorph under FSDP trains to torch's ``Schedule1F1B`` losses on the same job, to log precision
  (on this small model the split backward changes no bit; the debug model's split schedules differ
  by up to :data:`~tests.titan03.test_losses.SPLIT_REL`), its DP collectives measured by the DP
  backend (the world-wide exchange reports every stage's DP delay each step);
* a slow rank (stage 1 of replica 1, twice as slow from step 4 to 8) moves microbatches to the other
  replica and back, its control plane on groups of its own (an NCCL job's path), and the losses and
  grad norms equal the undisturbed run's, as on 0.2.2 (``tests/integration/test_rebalance_runs.py``);
* (slow) a slow DP pair is moved onto a pipeline link through a checkpoint and a relaunch, and the
  losses equal the undisturbed run's, as on 0.2.2 (``tests/integration/test_hybrid.py``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.launch import RunResult, assert_same_training
from tests.titan03.runs import losses, train
from tests.titan03.test_losses import SAME_REL

STEPS = 3
SMALL = ("--training.seq_len", "16", "--training.local_batch_size", "4")
"""4 microbatches of 16 tokens per pipeline: two launches stay near a minute on two CPU cores."""


def _hybrid(folder: Path, steps: int, *overrides: str, timeout_s: float = 300, log_rank: str = "") -> RunResult:
    args = ("--training.steps", str(steps), *SMALL, *overrides)
    return train(folder, *args, config="hybrid_cpu", timeout_s=timeout_s, log_rank=log_rank)


def _assert_close(got: dict[int, float], ref: dict[int, float], rel: float, what: str) -> None:
    for step in ref:
        assert got[step] == pytest.approx(ref[step], rel=rel), f"{what}, step {step}: {got[step]} vs {ref[step]}"


def test_dp_x_pp_pipemorph_matches_1f1b(tmp_path: Path, no_leftovers) -> None:
    morph = _hybrid(tmp_path / "pipemorph", STEPS)
    torch_1f1b = ("--parallelism.pipeline_parallel_schedule", "1F1B", "--morph.orchestrator", "off")
    ref = losses(_hybrid(tmp_path / "1f1b", STEPS, *torch_1f1b), STEPS)
    got = losses(morph, STEPS)
    _assert_close(got, ref, SAME_REL, "DP x PP: PipeMorph vs 1F1B")
    assert len(set(ref.values())) == STEPS, ref  # the model trains: the losses change step to step
    # both stages' DP groups (FSDP's collectives on the DP backend) were measured at every step
    for stage in (0, 1):
        delay = morph.scalars(f"morph/dp_delay_ms/stage{stage}")
        assert sorted(delay) == list(range(1, STEPS + 1)) and all(math.isfinite(v) for v in delay.values()), delay
    assert max(morph.scalars("morph/topology_changes").values()) == 0
    no_leftovers(tmp_path)


@pytest.mark.slow
def test_slow_dp_pair_is_moved_and_losses_equal_the_undisturbed_run(tmp_path: Path, no_leftovers) -> None:
    steps = 5
    slow = ("--morph.inject.mode", "static", "--morph.inject.rank_links", "0-1", "--morph.inject.delays_ms", "40")
    # ranks 0 and 2 form pipeline 0 after the move (hosts 0 and 1): rank 0 logs its known slow link
    moved = (*slow, "--morph.detect_consecutive", "2")
    result = _hybrid(tmp_path / "moved", steps, *moved, timeout_s=400, log_rank="0,3")
    out = result.output
    assert "relaunching after step 2 with the host of each rank [0, 2, 1, 3]" in out, result.tail(80)
    assert "[[0, 1], [2, 3]] -> [[0, 2], [1, 3]] (pair 0-1: stage 0's DP group -> link 0 of pipeline 0)" in out
    assert "Training starts at step 3" in out
    assert "link 0 slow: known before the first step (the orchestrator moved a slow pair onto it)" in out
    changes = result.scalars("morph/topology_changes")
    assert changes[1] == 0 and all(changes[s] == 1 for s in range(2, steps + 1)), changes
    ref = losses(_hybrid(tmp_path / "undisturbed", steps, "--morph.orchestrator", "off"), steps)
    _assert_close(losses(result, steps), ref, SAME_REL, "moved vs undisturbed")
    no_leftovers(tmp_path)


REBALANCE_STEPS = 16
"""The return needs 2 steps read healthy after the straggler's end (step 8): room for a loaded host."""
EIGHT = ("--training.local_batch_size", "8")
"""8 microbatches per replica: room to move some."""
SLOW_RANK = (
    *("--morph.detect_consecutive", "2", "--morph.recover_consecutive", "2"),
    *("--morph.inject.mode", "static", "--morph.inject.compute_factor", "1,1,1,2"),
    *("--morph.inject.start_step", "4", "--morph.inject.end_step", "8"),
)
SPLIT = "morph/microbatches/replica"


def test_a_slow_rank_moves_microbatches_and_back_with_the_undisturbed_losses(tmp_path: Path, no_leftovers) -> None:
    steps = REBALANCE_STEPS
    result = _hybrid(tmp_path / "slow", steps, *EIGHT, *SLOW_RANK, "--morph.control_groups", "separate")
    assert result.returncode == 0, result.tail(80)
    ones, zeros = result.scalars(f"{SPLIT}1"), result.scalars(f"{SPLIT}0")
    # the split after each step: uneven from the detection (step 5 at the earliest) until 2 steps after
    # the straggler's end read healthy, even again before the run ends; one move away, one move back
    uneven = [s for s in sorted(ones) if ones[s] < 8]
    assert uneven and min(uneven) >= 5 and 8 <= max(uneven) < steps, ones
    assert uneven == list(range(min(uneven), max(uneven) + 1)), ones
    assert all(ones[s] + zeros[s] == 16 for s in ones) and ones[steps] == zeros[steps] == 8.0, (zeros, ones)
    assert "microbatches per replica [8, 8] -> [" in result.output, result.tail(80)
    undisturbed = _hybrid(tmp_path / "undisturbed", steps, *EIGHT)
    assert set(undisturbed.scalars("morph/rebalances").values()) == {0.0}
    assert_same_training(result, undisturbed, "rebalanced on 0.3.0", steps)
    no_leftovers(tmp_path)
