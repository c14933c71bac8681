"""``./run_train.sh`` with more ranks than GPUs: pipeline ranks share the GPUs; what else would
need one GPU per rank is one clear line instead of NCCL's duplicate-GPU error."""

from __future__ import annotations

import pytest

from tests.launch import REPO
from titan_morph.config import ConfigError
from titan_morph.integration.launching import check_devices


def _settings(*overrides: str):
    from titan_morph.integration.titan022.launcher import load

    return load(str(REPO / "train_configs" / "debug_cpu.toml"), list(overrides))[1]


def test_more_ranks_than_gpus_share_them_for_pipeline_parallelism_only() -> None:
    check_devices(4, 1, _settings())  # PP = 4 on one GPU
    hybrid = _settings(
        "--parallelism.pipeline_parallel_degree", "2", "--parallelism.data_parallel_replicate_degree", "2"
    )
    with pytest.raises(ConfigError) as err:
        check_devices(4, 1, hybrid)
    message = str(err.value)
    assert "\n" not in message and message.startswith("NGPU: 4 ranks on 1 CUDA device(s)")
    assert "data_parallel_replicate_degree 2" in message and "NGPU <= 1" in message


@pytest.mark.parametrize(("ranks", "devices"), [(4, 0), (2, 2), (1, 8)])
def test_enough_gpus_or_cpu_only_pass(ranks: int, devices: int) -> None:
    hybrid = _settings(
        "--parallelism.pipeline_parallel_degree", "2", "--parallelism.data_parallel_replicate_degree", "2"
    )
    check_devices(ranks, devices, hybrid)
