"""``./run_train.sh`` with more ranks than GPUs: one clear line instead of NCCL's duplicate-GPU error."""

from __future__ import annotations

import pytest

from titan_morph.config import ConfigError
from titan_morph.integration.launching import check_devices


def test_more_ranks_than_gpus_is_refused_with_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        check_devices(4, 1)
    message = str(err.value)
    assert message.startswith("NGPU: 4 ranks but this host has 1 CUDA device(s)") and "\n" not in message
    assert "NGPU <= 1" in message and 'CUDA_VISIBLE_DEVICES=""' in message


@pytest.mark.parametrize(("ranks", "devices"), [(4, 0), (2, 2), (1, 8)])
def test_enough_gpus_or_cpu_only_pass(ranks: int, devices: int) -> None:
    check_devices(ranks, devices)
