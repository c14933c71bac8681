"""The control plane on every backend, checked before any rank starts: ``[morph] control_groups``,
what DP x PP cannot do on NCCL (the orchestrator and ``rank_links`` need the CPU jobs' DP
backend's timings), and FSDP's ``always`` resharding with replicas that may differ in their
microbatch counts or plans. Each refusal is one line naming the setting."""

from __future__ import annotations

import pytest

from tests.launch import REPO
from titan_morph.config import ConfigError
from titan_morph.config.rules import check_dp_backend
from titan_morph.integration.titan022.jobconfig import load

HYBRID = REPO / "train_configs" / "hybrid_cpu.toml"  # DP 2 x PP 2
SMALL = ("--training.local_batch_size", "8")
OFF = ("--morph.orchestrator", "off")  # the config moves ranks (orchestrator = "pp")


def test_control_groups_resolve_and_refuse_other_values():
    _, settings = load(HYBRID, list(SMALL))
    assert settings.morph.control_groups == "auto"
    _, apart = load(HYBRID, [*SMALL, "--morph.control_groups", "separate"])
    assert apart.morph.control_groups == "separate"
    with pytest.raises(ConfigError, match="morph.control_groups: 'shared' is not one of auto, separate"):
        load(HYBRID, [*SMALL, "--morph.control_groups", "shared"])


def test_what_only_gloo_measures_is_refused_on_nccl():
    _, plain = load(HYBRID, [*SMALL, *OFF])
    check_dp_backend(plain, "nccl")  # the exchange and the rebalance run there
    _, moves = load(HYBRID, [*SMALL, "--morph.orchestrator", "pp"])
    check_dp_backend(moves, "gloo")
    with pytest.raises(ConfigError, match=r"^morph.orchestrator: 'pp' moves ranks on the DP collectives' timings") as e:
        check_dp_backend(moves, "nccl")
    assert "use off on GPUs" in str(e.value) and "\n" not in str(e.value)
    pairs = ("--morph.inject.mode", "static", "--morph.inject.rank_links", "0-1", "--morph.inject.delays_ms", "20")
    _, delayed = load(HYBRID, [*SMALL, *OFF, *pairs])
    with pytest.raises(ConfigError, match=r"^morph.inject.rank_links: '0-1' delays DP collectives on gloo only"):
        check_dp_backend(delayed, "nccl")


@pytest.mark.parametrize(
    "overrides, why",
    [
        ((), "morph.rebalance_microbatches"),
        (("--morph.rebalance_microbatches", "false"), "morph.adapt"),
        (("--morph.rebalance_microbatches", "false", "--morph.replica_microbatches", "6,10"), "replica_microbatches"),
    ],
)
def test_reshard_always_with_replicas_that_may_differ_is_one_line(overrides, why):
    reshard = ("--parallelism.fsdp_reshard_after_forward", "always")
    with pytest.raises(ConfigError, match=r"^parallelism.fsdp_reshard_after_forward: 'always' all-gathers") as e:
        load(HYBRID, [*SMALL, *reshard, *overrides])
    assert why in str(e.value) and "use default or never" in str(e.value) and "\n" not in str(e.value)


def test_reshard_always_with_replicas_that_cannot_differ_is_accepted():
    reshard = ("--parallelism.fsdp_reshard_after_forward", "always")
    fixed = ("--morph.rebalance_microbatches", "false", "--morph.adapt", "false")
    load(HYBRID, [*SMALL, *reshard, *fixed])
    load(HYBRID, [*SMALL, *OFF, *reshard, "--parallelism.pipeline_parallel_schedule", "1F1B"])
    load(HYBRID, [*SMALL, "--parallelism.fsdp_reshard_after_forward", "never"])


def test_the_orchestrator_with_tensor_parallelism_is_one_line():
    tp = ("--parallelism.tensor_parallel_degree", "2")
    with pytest.raises(ConfigError, match=r"^morph.orchestrator: 'pp' moves hosts of a DP x PP layout") as e:
        load(HYBRID, [*SMALL, *tp])
    assert "use off with TP" in str(e.value) and "\n" not in str(e.value)
    load(HYBRID, [*SMALL, *tp, *OFF])  # DP x TP x PP itself resolves
