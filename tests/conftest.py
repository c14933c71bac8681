"""Shared fixtures; the launchers themselves live in ``tests.launch``."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from tests.launch import REPO, launch, processes_mentioning

PRINTED_LOSS = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)")


@pytest.fixture
def no_leftovers():
    """Yields a checker: after a launch, no process may still mention the run's dump folder."""

    def check(dump_folder: Path, grace_s: float = 10.0) -> None:
        deadline = time.monotonic() + grace_s
        while (left := processes_mentioning(str(dump_folder))) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"processes left behind after the run: {left}"

    return check


@pytest.fixture(scope="session")
def one_node_losses(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The losses ``./run_train.sh --training.steps 10`` prints on one node (default config, 4 ranks),
    trained in this environment: what a job split over nodes must print. No fixed list: the losses
    depend on the torch release (step 1: 7.92412 on 2.13, 8.24846 on 2.11). A shorter job prints the
    same first 3 (its learning rate differs from the update of step 3 on: 2 warm-up steps)."""
    dump = tmp_path_factory.mktemp("one-node") / "run"
    cmd = [str(REPO / "run_train.sh"), "--training.steps", "10", "--job.dump_folder", str(dump)]
    result = launch(cmd, dump, timeout_s=300, env={"PYTHON": sys.executable})
    assert result.returncode == 0, result.tail()
    losses = {int(step): float(loss) for step, loss in PRINTED_LOSS.findall(result.output)}
    assert sorted(losses) == list(range(1, 11)), result.tail()
    return [losses[step] for step in range(1, 11)]
