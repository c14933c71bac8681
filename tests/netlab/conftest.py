"""Fixtures for the netlab tests: a lab with its own prefix, removed whatever the test did."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from titan_morph.netlab.lab import Lab, can_make_namespaces, down

PREFIX = "tmtest"


@pytest.fixture(scope="session")
def namespaces_ok() -> None:
    """Skips (one line) where this process cannot make network namespaces."""
    why = can_make_namespaces()
    if why:
        pytest.skip(f"netlab: {why}")


@pytest.fixture
def lab3(namespaces_ok: None) -> Iterator[Lab]:
    lab = Lab(3, PREFIX)
    lab.up()
    try:
        yield lab
    finally:
        down(PREFIX)


def finish(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """``proc``'s output once it exits; past ``timeout_s`` its whole session is killed (it was
    started with ``start_new_session``: the lab's runs and their ranks go with it)."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out or ""
