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

from tests.launch import REPO, RunResult, assert_same_training, launch
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
