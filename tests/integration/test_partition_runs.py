"""partition = "auto" in real torchrun jobs: a compute straggler is measured, the schedule re-planned
and the layers moved through a checkpoint and the launcher's relaunch; the losses are those of an
undisturbed run, and nothing is left behind.

* the module split of a split (TorchTitan's names), and the supervisor's relaunch carrying the split;
* the synthetic testbed (train_configs/partition_cpu.toml, shortened): rank 3 twice as slow from
  step 4, detected in 2 steps, moved at once (``repartition_after = 0``) to 5,5,4,2;
* the llama3 debug model (``slow``): a straggler from the start, the measured costs move layers, and
  the losses equal an undisturbed run's (1e-5).
"""

from __future__ import annotations

import re

import pytest
from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part

from tests.launch import DEFAULT_CONFIG, REPO, RunResult, assert_same_training, launch, supervise_script
from titan_morph.integration.partition import module_names
from titan_morph.integration.supervisor import torchrun_command

PARTITION = REPO / "train_configs" / "partition_cpu.toml"
LLAMA_STEPS = 6


def _run(config, folder, *overrides: str, timeout_s: float = 400) -> RunResult:
    result = launch(torchrun_command(config, folder, 4, overrides), folder, timeout_s=timeout_s)
    assert result.returncode == 0, f"training failed (exit {result.returncode}):\n{result.tail(80)}"
    return result


def test_module_names_of_a_split_follow_the_releases_names():
    names = module_names(generate_llm_fqn_per_model_part, 6, (2, 3, 1, 0))
    assert names == [
        ["tok_embeddings", "layers.0", "layers.1"],
        ["layers.2", "layers.3", "layers.4"],
        ["layers.5"],
        ["norm", "output"],
    ]
    # TorchTitan's even split is the layers' split with the embedding and the output as a layer each
    assert module_names(generate_llm_fqn_per_model_part, 6, (1, 2, 2, 1)) == generate_llm_fqn_per_model_part(4, 6)


JOB = """
from titan_morph.integration.relaunch import request_relaunch
if launches == 1:
    env = {"TITAN_MORPH_SPLIT": "5,5,4,2", "TITAN_MORPH_PARTITION": '{"x": 1}'}
    request_relaunch([0, 1, 2, 3], 25, 0, "test re-partition", env=env)
"""


def test_supervisor_relaunches_with_the_carried_split(tmp_path):
    names = ("TITAN_MORPH_SPLIT", "TITAN_MORPH_PARTITION", "TITAN_MORPH_HOSTS", "TITAN_MORPH_LAUNCH_TIME")
    proc, (first, second) = supervise_script(tmp_path, JOB, names)
    assert proc.returncode == 0, proc.stderr
    assert first[:2] == [None, None] and second[:3] == ["5,5,4,2", '{"x": 1}', "0,1,2,3"]
    assert float(second[3]) > float(first[3]) > 0  # each launch knows when it started
    assert "relaunching after step 25 with layers per stage [5, 5, 4, 2]: test re-partition" in proc.stderr


def test_synthetic_straggler_is_detected_replanned_and_moved(tmp_path, no_leftovers):
    fast = ("--training.steps", "8", "--morph.detect_consecutive", "2", "--morph.repartition_after", "0")
    result = _run(PARTITION, tmp_path / "run", *fast)
    out = result.output
    # detected after 2 slow steps from step 4 (step 5; step 6 when a step's noise hides one), and the split
    # follows the measured speed (0.5 at factor 2 on a quiet host: [5, 5, 4, 2]; it reads higher when the
    # baseline steps carry host overhead, e.g. 0.65: [5, 4, 4, 3]): layers leave rank 3 either way. On a
    # loaded host another rank may read slow in the same decision ("rank 2 slow: ...; rank 3 slow: ...")
    seen = re.search(r"step (\d+): [^\n]*rank 3 slow: op time", out)
    assert seen is not None and int(seen.group(1)) in (5, 6), result.tail(60)
    first = re.search(r"step (\d+): [^\n]*rank \d slow: op time", out)
    assert first is not None
    step = int(first.group(1))
    moves = [
        (int(after), [int(n) for n in layers.split(",")])
        for after, layers in re.findall(r"relaunching after step (\d+) with layers per stage \[([\d, ]+)\]", out)
    ]
    assert out.count("titan_morph.launch: relaunching") == len(moves) >= 1, result.tail(60)
    # a loaded host's noise in the baseline steps (2-3, before the straggler starts at step 4) can
    # move layers at step 3, from the measured stage times; the straggler's first move comes at its
    # first detection, and with repartition_after = 0 a re-read speed after it (the relaunched
    # ranks' first steps) may move again: every split from then on keeps layers off rank 3
    baseline = [m for m in moves if m[0] < 4]
    assert [after for after, _ in baseline] in ([], [3]), moves
    detected = moves[len(baseline) :]
    assert detected and detected[0][0] == step, moves
    for _, chosen in detected:
        assert sum(chosen) == 16 and chosen[3] < 4 and chosen[3] == min(chosen), moves
    for _, chosen in moves:
        assert f"layers per stage {chosen} would plan" in out
    assert f"Training starts at step {step + 1}" in out and "from before the relaunch" in out
    # the price the first move was bought at counts the checkpoint and the end of the run; the
    # relaunched run measures it whole and prints both
    estimated = re.search(r"relaunch cost ([\d.]+) s \(estimated\): .* plus the checkpoint's save [\d.]+ s", out)
    measured = re.search(r"relaunch cost ([\d.]+) s \(measured\): .*the move was priced at ([\d.]+) s", out)
    assert estimated is not None and measured is not None, result.tail(60)
    assert measured.group(2) == estimated.group(1)
    split = {s: result.scalars(f"morph/partition/stage{s}") for s in range(4)}
    held = baseline[-1][1] if baseline else [4] * 4  # the split the straggler found
    assert [split[s][step] for s in range(4)] == held and [split[s][8] for s in range(4)] == moves[-1][1]
    assert result.scalars("morph/repartitions")[8] == len(moves) and result.scalars("morph/slow_rank/rank3")[8] == 1.0
    assert sorted(result.losses()) == list(range(1, 9))
    no_leftovers(tmp_path)


@pytest.mark.slow
def test_llama_repartition_gives_the_losses_of_an_undisturbed_run(tmp_path, no_leftovers):
    steps = ("--training.steps", str(LLAMA_STEPS))
    moved = _run(
        DEFAULT_CONFIG,
        tmp_path / "moved",
        *steps,
        "--checkpoint.enable",
        "--checkpoint.interval",
        "1000",
        "--morph.partition",
        "auto",
        "--morph.inject.mode",
        "static",
        "--morph.inject.compute_factor",
        "1,1,1,2",
        "--morph.repartition_after",
        "0",
    )
    assert moved.output.count("titan_morph.launch: relaunching after step 3 with layers per stage") == 1, moved.tail(80)
    assert "Training starts at step 4" in moved.output
    base = _run(DEFAULT_CONFIG, tmp_path / "base", *steps)
    assert_same_training(moved, base, "re-partitioned", LLAMA_STEPS)
    assert len(set(base.losses().values())) == LLAMA_STEPS  # the model trains
    no_leftovers(tmp_path)
