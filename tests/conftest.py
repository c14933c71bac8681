"""Shared fixtures; the launchers themselves live in ``tests.launch``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.launch import processes_mentioning


@pytest.fixture
def no_leftovers():
    """Yields a checker: after a launch, no process may still mention the run's dump folder."""

    def check(dump_folder: Path, grace_s: float = 10.0) -> None:
        deadline = time.monotonic() + grace_s
        while (left := processes_mentioning(str(dump_folder))) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"processes left behind after the run: {left}"

    return check
