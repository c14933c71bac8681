"""DP x PP on CPU (train_configs/hybrid_cpu.toml: PP = 2 x FSDP = 2 on 4 ranks), real torchrun.

* FSDP x PP with titan_morph's schedule trains to the same losses as PP alone on the same global
  batch (``dp_blocks`` feeds the PP-only run the samples both DP ranks read);
* a slow DP pair (``rank_links``) is detected, moved onto a pipeline link through a checkpoint and
  a relaunch by the launcher, and the losses equal the undisturbed run's;
* the launcher's supervisor restarts a job that asks for it, with the new host of every rank.

The end-to-end acceptance run (18 steps, 30 ms from step 3, step times) is ``slow``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tests.launch import REPO, RunResult, launch, supervise_script
from titan_morph.integration.supervisor import torchrun_command

CONFIG = REPO / "train_configs" / "hybrid_cpu.toml"
PLUGIN_ENV = {"PYTHONPATH": str(REPO / "tests" / "integration")}
STEPS = 4
BATCH = 4  # per DP rank: 4 microbatches per pipeline
# The llama3 debug model (real compute, fixed depth) at a short sequence length: on CPU, FSDP's
# DTensor init of sharded parameters differs from the unsharded one, so every run here starts from
# one seed checkpoint (TorchTitan's create_seed_checkpoint) made on a single rank.
MODEL = ("--model.flavor", "debugmodel", "--morph.synthetic.enabled", "false", "--training.seq_len", "32")
SMALL = ("--training.local_batch_size", str(BATCH), "--training.steps", str(STEPS), *MODEL)
STEP_TIME = "time_metrics/end_to_end(s)"


def _run(folder: Path, nproc: int, *overrides: str, env: dict[str, str] | None = None, timeout_s: float = 300):
    result = launch(torchrun_command(CONFIG, folder, nproc, overrides), folder, timeout_s=timeout_s, env=env)
    assert result.returncode == 0, f"training failed (exit {result.returncode}):\n{result.tail(80)}"
    return result


def _losses(result: RunResult, steps: int) -> dict[int, float]:
    losses = result.losses()
    assert sorted(losses) == list(range(1, steps + 1)), f"loss per step: {losses}"
    return losses


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ...]:
    """Overrides that start a run from one seed checkpoint of the debug model."""
    folder = tmp_path_factory.mktemp("hybrid") / "seed"
    one = ("--parallelism.pipeline_parallel_degree", "1", "--parallelism.data_parallel_shard_degree", "1")
    _run(folder, 1, *one, *MODEL, "--morph.orchestrator", "off", "--checkpoint.create_seed_checkpoint")
    step0 = folder / "checkpoint" / "step-0"
    assert step0.is_dir(), list(folder.rglob("*"))[:20]
    return ("--checkpoint.initial_load_path", str(step0))


@pytest.fixture(scope="module")
def undisturbed(seed: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """DP x PP without injection or moves: the reference losses."""
    folder = tmp_path_factory.mktemp("hybrid") / "undisturbed"
    fixed = ("--morph.orchestrator", "off", "--checkpoint.load_only")
    return _losses(_run(folder, 4, *SMALL, *seed, *fixed), STEPS)


def test_dp_x_pp_losses_equal_pp_only_on_the_same_global_batch(seed, undisturbed, tmp_path, no_leftovers):
    pp_only = (
        "--parallelism.data_parallel_shard_degree",
        "1",
        "--model.name",
        "llama3_morph_dpblocks",
        "--experimental.custom_import",
        "dp_blocks",
        "--morph.orchestrator",
        "off",
        "--checkpoint.load_only",
    )
    got = _losses(
        _run(
            tmp_path / "pp", 2, *SMALL, *seed, *pp_only, "--training.local_batch_size", str(2 * BATCH), env=PLUGIN_ENV
        ),
        STEPS,
    )
    for step, loss in undisturbed.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), f"step {step}: PP only {got[step]} vs DP x PP {loss}"
    assert len(set(undisturbed.values())) == STEPS  # the model trains (losses change step to step)
    no_leftovers(tmp_path)


@pytest.mark.slow
def test_slow_dp_pair_is_moved_and_losses_equal_the_undisturbed_run(seed, undisturbed, tmp_path, no_leftovers):
    slow = (
        "--morph.inject.mode",
        "static",
        "--morph.inject.rank_links",
        "0-1",
        "--morph.inject.delays_ms",
        "40",
        "--morph.detect_consecutive",
        "2",
        "--morph.control_groups",
        "separate",  # the control plane on groups of its own, as on NCCL: the same decisions
    )
    result = _run(tmp_path / "run", 4, *SMALL, *seed, *slow, timeout_s=400)
    out = result.output
    assert "relaunching after step 2 with the host of each rank [0, 2, 1, 3]" in out, result.tail(80)
    assert "DP pair 0-1 (stage 0's DP group) slow" in out
    assert "[[0, 1], [2, 3]] -> [[0, 2], [1, 3]] (pair 0-1: stage 0's DP group -> link 0 of pipeline 0)" in out
    assert out.count("Training starts at step 1") >= 1 and "Training starts at step 3" in out
    # the relaunched pipeline 0 plans for the pair's measured delay and delegates its link at once
    assert "link 0 slow: known before the first step (the orchestrator moved a slow pair onto it)" in out
    changes = result.scalars("morph/topology_changes")
    assert changes[1] == 0 and all(changes[s] == 1 for s in range(2, STEPS + 1)), changes
    # before the move stage 0's DP group is slow; after it the pipeline link 0-1 is (pipeline 0)
    dp0 = result.scalars("morph/dp_delay_ms/stage0")
    assert dp0[1] > 30 and all(dp0[s] < 30 for s in range(3, STEPS + 1)), dp0
    got = _losses(result, STEPS)
    for step, loss in undisturbed.items():
        assert got[step] == pytest.approx(loss, rel=1e-6), f"step {step}: moved {got[step]} vs undisturbed {loss}"
    no_leftovers(tmp_path)


JOB = """
from titan_morph.integration.relaunch import request_relaunch
if launches == 1:
    request_relaunch([1, 0, 3, 2], 4, 1, "test move", {(1, 0): 35.0})
elif launches == 2:
    request_relaunch([0, 1, 2, 3], 5, 2, "never read")
    sys.exit(3)  # a failure is not relaunched, even with a request pending
"""


def test_supervisor_relaunches_with_the_new_rank_order(tmp_path):
    names = ("TITAN_MORPH_HOSTS", "TITAN_MORPH_TOPOLOGY_CHANGES", "TITAN_MORPH_SLOW_PAIRS", "TITAN_MORPH_RUN_ID")
    proc, launches = supervise_script(tmp_path, JOB, names)
    assert proc.returncode == 3, proc.stderr
    assert [entry[:3] for entry in launches] == [[None, None, None], ["1,0,3,2", "1", "0-1:35"]]
    assert launches[0][3] == launches[1][3] and launches[0][3]  # one run id: the same run folder
    assert (
        "relaunching after step 4 with the host of each rank [1, 0, 3, 2] (topology move 1): test move" in proc.stderr
    )


@pytest.mark.slow
def test_acceptance_move_then_pipemorph_absorbs_the_pipeline_straggler(tmp_path, no_leftovers):
    """The issue's acceptance run via ./run_train.sh's launcher: 30 ms on ranks 0-1 from step 3."""
    steps = ("--training.steps", "18")
    base = _run(tmp_path / "base", 4, *steps, timeout_s=500)
    slow = ("--morph.inject.mode", "static", "--morph.inject.rank_links", "0-1", "--morph.inject.delays_ms", "30")
    moved = _run(tmp_path / "moved", 4, *steps, *slow, "--morph.inject.start_step", "3", timeout_s=600)
    assert max(moved.scalars("morph/topology_changes").values()) >= 1
    ref, got = _losses(base, 18), _losses(moved, 18)
    for step, loss in ref.items():
        assert got[step] == pytest.approx(loss, rel=1e-6), f"step {step}: {got[step]} vs {loss}"
    t_base, t_moved = base.scalars(STEP_TIME), moved.scalars(STEP_TIME)
    med_base = statistics.median(t_base[s] for s in range(13, 19))
    med_moved = statistics.median(t_moved[s] for s in range(13, 19))
    print(f"median step 13-18: undisturbed {med_base * 1e3:.0f} ms, moved {med_moved * 1e3:.0f} ms")
    no_leftovers(tmp_path)
