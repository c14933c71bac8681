"""Every TorchTitan schedule through titan_morph's TrainSpec: placements, stage counts, config checks
for multi-stage schedules, the rank that logs the loss (no training here; see test_vshape_losses)."""

from __future__ import annotations

import dataclasses
import types

import pytest

from tests.launch import DEFAULT_CONFIG
from titan_morph.config import ConfigError, resolve
from titan_morph.integration import schedules
from titan_morph.integration.titan022.jobconfig import job_view, load, settings_of
from titan_morph.integration.titan022.train_spec import stages_per_rank


def _parse(*args: str):
    return load(DEFAULT_CONFIG, args)[0]


def test_every_torchtitan_schedule_is_registered_with_its_placement():
    from torch.distributed.pipelining.schedules import get_schedule_class

    for name in (
        "1F1B",
        "GPipe",
        "Interleaved1F1B",
        "LoopedBFS",
        "InterleavedZeroBubble",
        "ZBVZeroBubble",
        "DualPipeV",
    ):
        get_schedule_class(name)  # a name TorchTitan accepts
        schedules.check_schedule_name(name)
    placements = {name: schedules.schedule_placement(name) for name in schedules.schedule_names()}
    assert placements["ZBVZeroBubble"] == placements["DualPipeV"] == placements["PipeMorphV"] == "v"
    assert placements["Interleaved1F1B"] == placements["InterleavedZeroBubble"] == "loop"
    assert placements["PipeMorph"] == placements["1F1B"] == "single"
    assert schedules.stages_per_rank_of("pipemorphv") == 2
    assert schedules.stages_per_rank_of("Interleaved1F1B") == 2
    assert schedules.stages_per_rank_of("Interleaved1F1B", layers_per_stage=1) is None  # the model decides
    assert schedules.stages_per_rank_of("NotRegistered") is None
    with pytest.raises(ValueError, match="placement of schedule 'X' must be one of single, loop, v"):
        schedules.register_schedule("X", lambda req: None, placement="ring")


def test_stages_per_rank_follows_torchtitans_split():
    def job(per_stage):
        par = types.SimpleNamespace(
            pipeline_parallel_layers_per_stage=per_stage,
            pipeline_parallel_first_stage_less_layers=1,
            pipeline_parallel_last_stage_less_layers=1,
            pipeline_parallel_schedule="PipeMorphV",
        )
        return types.SimpleNamespace(parallelism=par)

    assert stages_per_rank(job(None), "v", 4, 6) == 2
    assert stages_per_rank(job(None), "single", 4, 6) == 1
    assert stages_per_rank(job(2), "loop", 2, 6) == 2  # (6 + 1 + 1) / 2 = 4 stages on 2 ranks
    assert stages_per_rank(job(1), "loop", 2, 6) == 4
    with pytest.raises(ValueError, match="gives 4 stage.s. per rank;.*'PipeMorphV' needs exactly 2"):
        stages_per_rank(job(1), "v", 2, 6)
    with pytest.raises(ValueError, match="gives 5 stages, not a multiple of pipeline_parallel_degree = 2"):
        stages_per_rank(job(2), "v", 2, 8)


def test_per_stage_options_count_the_vs_stages():
    """A V on PP=2 has 4 stages: per-stage lists take 4 values (per-link ones still one per link)."""
    args = ("--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule", "PipeMorphV")
    cfg = _parse(*args, "--morph.stage_times_ms", "1,2,1;1,2,1;1,2,1;1,2,1", "--morph.plan_delays_ms", "30")
    assert job_view(cfg).stages_per_rank == 2  # the launcher's checks know the V from the schedule name
    assert len(settings_of(cfg).morph.stage_times_ms) == 12
    one_per_rank = dataclasses.replace(job_view(cfg), stages_per_rank=1)
    with pytest.raises(ConfigError, match="stage_times_ms"):
        resolve(cfg.morph, one_per_rank)


def test_a_v_logs_its_loss_from_rank_0():
    from titan_morph.integration.launching import loss_rank

    for schedule, rank in (("PipeMorphV", 0), ("ZBVZeroBubble", 0), ("DualPipeV", 0), ("PipeMorph", 3)):
        _, settings = load(DEFAULT_CONFIG, ["--parallelism.pipeline_parallel_schedule", schedule])
        assert loss_rank(settings, 4) == rank, schedule
