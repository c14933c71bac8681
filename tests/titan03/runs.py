"""Launch helpers for TorchTitan 0.3.0 jobs: titan_morph's launcher (its checks, then torchrun under
the supervisor), each run in its own dump folder; losses read back from TensorBoard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.launch import REPO, RunResult, _child_env, launch

LAUNCHER = "titan_morph.integration.titan03.launcher"
QUICK = ("--training.seq_len", "32", "--metrics.log_freq", "1")
"""Short sequences keep a 4-rank launch of the debug model at ~30 s on two CPU cores."""


def train(
    folder: Path, *overrides: str, config: str = "debug_cpu", timeout_s: float = 300, log_rank: str = ""
) -> RunResult:
    """``launcher run CONFIG --dump_folder FOLDER *overrides``; ``log_rank``: the ranks whose output is
    kept (the launcher's default: the last one, which logs the loss)."""
    shown = ["--log-rank", log_rank] if log_rank else []
    cmd = [sys.executable, "-m", LAUNCHER, "run", *shown, config, "--dump_folder", str(folder), *QUICK, *overrides]
    return launch(cmd, folder, timeout_s=timeout_s)


def losses(result: RunResult, steps: int) -> dict[int, float]:
    """The per-step losses of a finished run (it must have succeeded and logged every step)."""
    assert result.returncode == 0, f"training failed (exit {result.returncode}):\n{result.tail()}"
    got = result.losses()
    assert sorted(got) == list(range(1, steps + 1)), f"loss per step: {got}\n{result.tail()}"
    return got


def check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``launcher check *args``: the pre-rank checks alone."""
    cmd = [sys.executable, "-m", LAUNCHER, "check", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, env=_child_env(env))
