"""Tensor parallelism inside each stage, real torchrun jobs (``train_configs/tp_pp_cpu.toml``: TP 2 x
PP 2 on 4 gloo ranks, the llama3 debug model): lane 0 (ranks 0 -> 2) alone is slowed by 60 ms on
link 0 from step 3 to step 6 (``rank_links 0-2``), lane 1 (ranks 1 -> 3) is not.

Every rank -- both lanes of both stages -- must name link 0 slow and recovered at the same steps,
re-plan together (one lane re-planning alone paired different microbatches in the TP collectives
and hung the job), and train to the losses and grad norms of torch's 1F1B on the same layout.
"""

from __future__ import annotations

import re

import pytest

from tests.launch import GRAD_NORM_TAG, REPO, RunResult, assert_same_training, launch
from titan_morph.integration.supervisor import torchrun_command

CONFIG = REPO / "train_configs" / "tp_pp_cpu.toml"
STEPS = 10
COMMON = ("--training.steps", str(STEPS), "--training.seq_len", "64")
LANE0_SLOW = (
    *("--morph.inject.mode", "static", "--morph.inject.rank_links", "0-2", "--morph.inject.delays_ms", "60"),
    *("--morph.inject.start_step", "3", "--morph.inject.end_step", "6"),
    *("--morph.detect_consecutive", "2", "--morph.recover_consecutive", "2"),
)
DECISION = re.compile(r"\[rank(\d)\]:.*titan_morph: step (\d+): link (\d) (slow|recovered)")


def _run(folder, *overrides: str) -> RunResult:
    result = launch(torchrun_command(CONFIG, folder, 4, [*COMMON, *overrides]), folder, timeout_s=400)
    assert result.returncode == 0, f"training failed (exit {result.returncode}):\n{result.tail(80)}"
    return result


@pytest.fixture(scope="module")
def one_f_one_b(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return _run(tmp_path_factory.mktemp("tp") / "1f1b", "--parallelism.pipeline_parallel_schedule", "1F1B")


def test_a_slow_lane_is_its_links_and_every_rank_decides_alike(one_f_one_b, tmp_path, no_leftovers):
    run = _run(tmp_path / "lane", *LANE0_SLOW)
    decisions: dict[int, list[tuple[int, int, str]]] = {}
    for rank, step, link, what in DECISION.findall(run.output):
        decisions.setdefault(int(rank), []).append((int(step), int(link), what))
    assert sorted(decisions) == [0, 1, 2, 3], run.tail(80)  # both lanes of both stages decided
    assert all(d == decisions[0] for d in decisions.values()), decisions  # the same, at the same steps
    seen = [(link, what) for _, link, what in decisions[0]]
    assert seen[:1] == [(0, "slow")] and (0, "recovered") in seen, decisions[0]
    assert max(run.scalars("morph/delegated/link0").values()) == 1.0  # both lanes' link on the delegates
    assert_same_training(run, one_f_one_b, "TP 2 x PP 2, lane 0 slow", STEPS)
    no_leftovers(tmp_path / "lane")


# The slow-lane run above already carries both lanes' link on the delegates (auto), checked against
# 1F1B: these paths, every message on one transport from step 1, are the slow run's.
PATHS = [
    pytest.param("PipeMorph", "delegate", id="pipemorph-delegate", marks=pytest.mark.slow),
    pytest.param("PipeMorph", "default", id="pipemorph-default", marks=pytest.mark.slow),
    pytest.param("PipeMorph", "auto", id="pipemorph-auto", marks=pytest.mark.slow),
    pytest.param("ZBH2", "auto", id="zbh2-auto", marks=pytest.mark.slow),
]
SHORT = 6


@pytest.fixture(scope="module")
def short_1f1b(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    folder = tmp_path_factory.mktemp("tp") / "1f1b-short"
    return _run(folder, "--training.steps", str(SHORT), "--parallelism.pipeline_parallel_schedule", "1F1B")


@pytest.mark.parametrize("schedule, transport", PATHS)
def test_every_path_with_tp_trains_like_1f1b(schedule, transport, short_1f1b, tmp_path, no_leftovers):
    delayed = ("--morph.inject.mode", "static", "--morph.inject.delays_ms", "30")  # both lanes of the link
    overrides = ("--parallelism.pipeline_parallel_schedule", schedule, "--morph.transport", transport)
    run = _run(tmp_path / "run", "--training.steps", str(SHORT), *overrides, *delayed)
    assert_same_training(run, short_1f1b, f"TP 2 x PP 2, {schedule} on {transport}", SHORT)
    no_leftovers(tmp_path / "run")


@pytest.mark.slow
def test_a_slow_tp_rank_moves_layers_off_its_stage(tmp_path, no_leftovers):
    """Rank 3 (stage 1, TP rank 1) twice as slow: stage 1 is measured slow (its lanes meet in the TP
    collectives), the layers move to stage 0 through a checkpoint and a relaunch, the losses stay."""
    steps = ("--training.steps", "8")
    auto = ("--checkpoint.enable", "--checkpoint.interval", "1000", "--morph.partition", "auto")
    slow = (
        "--morph.inject.mode",
        "static",
        "--morph.inject.compute_factor",
        "1,1,1,2",
        "--morph.repartition_after",
        "0",
    )
    moved = _run(tmp_path / "moved", *steps, *auto, *slow)
    split = re.search(r"relaunching after step \d+ with layers per stage \[(\d+), (\d+)\]", moved.output)
    assert split and int(split[1]) > int(split[2]), moved.tail(80)  # off the slow stage 1 (3 + 3 layers before)
    base = _run(tmp_path / "base", *steps)
    assert_same_training(moved, base, "TP 2 x PP 2 re-partitioned", 8)
    no_leftovers(tmp_path)


@pytest.mark.slow
def test_dp_tp_pp_rebalances_a_slow_rank_and_keeps_its_losses(tmp_path, no_leftovers):
    """DP 2 x TP 2 x PP 2 (8 ranks): rank 7 (replica 1, stage 1, TP rank 1) twice as slow from step 3;
    its replica's lanes fold into one speed, the split moves, and the losses are the even run's
    within 1e-4 (grad norms 1e-3; measured 3.6e-5 and 2.2e-4): a split alone changes the float
    additions of the TP and FSDP reductions (7/9 held from step 1, no rebalance: step 1's grad norm
    3.5e-5 off the even run's, the losses up to 1.4e-5 over 8 steps), and AdamW carries that on; a
    lost or doubled microbatch would be off by about 1/16."""
    dims = ("--parallelism.data_parallel_shard_degree", "2", "--training.steps", "8")
    slow = ("--morph.inject.mode", "static", "--morph.inject.compute_factor", "1,1,1,1,1,1,1,2")
    slow += ("--morph.inject.start_step", "3", "--morph.detect_consecutive", "2")

    def run(folder, *overrides: str) -> RunResult:
        result = launch(torchrun_command(CONFIG, folder, 8, [*COMMON, *dims, *overrides]), folder, timeout_s=600)
        assert result.returncode == 0, f"training failed (exit {result.returncode}):\n{result.tail(80)}"
        return result

    moved = run(tmp_path / "moved", *slow)
    even = run(tmp_path / "even", "--morph.rebalance_microbatches", "false")
    ones = moved.scalars("morph/microbatches/replica1")
    assert min(ones.values()) < 8, ones  # replica 1 gave microbatches away
    for step, loss in even.losses().items():
        assert moved.losses()[step] == pytest.approx(loss, rel=1e-4), f"step {step}"
    for step, norm in even.scalars(GRAD_NORM_TAG).items():
        assert moved.scalars(GRAD_NORM_TAG)[step] == pytest.approx(norm, rel=1e-3), f"step {step}"
    no_leftovers(tmp_path)
