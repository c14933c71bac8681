"""DP x PP microbatches per replica: ``[morph] rebalance_microbatches``, ``replica_microbatches``
and a ``compute_factor`` per rank of the world, parsed and checked before any rank starts."""

from __future__ import annotations

import pytest

from tests.launch import REPO
from titan_morph.config import ConfigError
from titan_morph.config.links import compute_model
from titan_morph.integration.titan022.jobconfig import load

HYBRID = REPO / "train_configs" / "hybrid_cpu.toml"  # DP 2 x PP 2, N = 24
SMALL = ("--training.local_batch_size", "8")  # N = 8: a global batch of 16 microbatches


def test_defaults_and_good_values_resolve():
    _, settings = load(HYBRID, list(SMALL))
    assert settings.morph.rebalance_microbatches and settings.morph.replica_microbatches == ()
    assert (
        settings.replica_counts == (8, 8) and settings.replica_capacity == 15
    )  # 2 x N, less one for the other replica
    _, fixed = load(HYBRID, [*SMALL, "--morph.replica_microbatches", "5,11", "--morph.rebalance_microbatches", "false"])
    assert fixed.replica_counts == (5, 11) and not fixed.morph.rebalance_microbatches
    _, one = load(HYBRID, ["--training.local_batch_size", "1"])
    assert one.replica_capacity == 1  # 2 microbatches over 2 replicas: nothing can move


def test_compute_factor_per_rank_of_the_world():
    static = ("--morph.inject.mode", "static", "--morph.inject.start_step", "4")
    _, per_host = load(HYBRID, [*SMALL, *static, "--morph.inject.compute_factor", "1,1,1,2"])
    model = compute_model(per_host.morph.inject, per_host.stages)
    assert model is not None and model.ranks == 4 and model.factors(4) == (1.0, 1.0, 1.0, 2.0)
    _, per_stage = load(HYBRID, [*SMALL, *static, "--morph.inject.compute_factor", "1,2"])
    assert per_stage.morph.inject.compute_factor == (1.0, 2.0)
    with pytest.raises(ConfigError, match=r"needs 1, 2 \(one per pipeline rank\) or 4 values"):
        load(HYBRID, [*SMALL, *static, "--morph.inject.compute_factor", "1,1,2"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("--morph.replica_microbatches", "0,16"), "gives replica 0 no microbatches: every replica needs >= 1"),
        (("--morph.replica_microbatches", "6,6"), "sums to 12; the global batch is 16 microbatches"),
        (("--morph.replica_microbatches", "8,4,4"), r"one count per data-parallel replica \(2 replicas\), got 3"),
        (("--morph.replica_microbatches", "-1,17"), "morph.replica_microbatches"),
        (("--morph.replica_microbatches", "8,8", "--parallelism.pipeline_parallel_schedule", "1F1B"), "titan_morph"),
        (("--morph.rebalance_microbatches", "maybe"), "'maybe' is not a boolean"),
    ],
)
def test_bad_replica_options_are_one_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load(HYBRID, [*SMALL, *overrides])


def test_replica_counts_need_dp_and_pp():
    with pytest.raises(ConfigError, match="needs data parallelism with pipeline parallelism"):
        load(HYBRID, [*SMALL, "--parallelism.data_parallel_shard_degree", "1", "--morph.replica_microbatches", "8"])
