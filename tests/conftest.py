"""Shared helpers: launch real ``torchrun`` trainings with bounded time and no leftover processes."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "train_configs" / "debug_cpu.toml"
LOSS_TAG = "loss_metrics/global_avg_loss"
TPS_TAG = "throughput(tps)"


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "VENV": sys.prefix}
    env.pop("TITAN_MORPH_RUN_ID", None)
    env.update(extra or {})
    return env


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live processes (pid, cmdline) whose command line contains ``text`` (e.g. a run's dump folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            status = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if status.split(") ", 1)[-1].startswith("Z"):
            continue  # zombie already exited
        cmd = raw.replace(b"\0", b" ").decode(errors="replace")
        if text in cmd:
            found.append((int(entry), cmd))
    return found


@dataclass
class RunResult:
    """A finished launch: exit code, combined output, its dump folder and wall time."""

    returncode: int
    output: str
    dump_folder: Path
    seconds: float

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-n:])

    def tb_dirs(self) -> list[str]:
        return sorted(glob.glob(str(self.dump_folder / "tb" / "*")))

    def scalars(self, tag: str) -> dict[int, float]:
        """Scalar ``tag`` per step, read back from the run's TensorBoard event files."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        values: dict[int, float] = {}
        for folder in self.tb_dirs():
            acc = EventAccumulator(folder, size_guidance={"scalars": 0})
            acc.Reload()
            if tag in acc.Tags().get("scalars", []):
                values.update({ev.step: ev.value for ev in acc.Scalars(tag)})
        return values

    def losses(self) -> dict[int, float]:
        return self.scalars(LOSS_TAG)


def launch(
    cmd: list[str], dump_folder: Path, *, timeout_s: float = 240, env: dict[str, str] | None = None
) -> RunResult:
    """Run ``cmd`` (a torchrun or run_train.sh command) in its own process group; kill it on timeout."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=_child_env(env),
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout_s} s; last output:\n" + out[-6000:])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return RunResult(proc.returncode, out, dump_folder, time.monotonic() - start)


def torchrun(
    nproc: int,
    dump_folder: Path,
    *overrides: str,
    config: Path = DEFAULT_CONFIG,
    timeout_s: float = 240,
    env: dict[str, str] | None = None,
) -> RunResult:
    """``torchrun --standalone`` (free rendezvous port) of ``python -m titan_morph.train`` on ``nproc`` ranks."""
    from titan_morph.launch import torchrun_command

    overrides = ("--parallelism.pipeline_parallel_degree", str(nproc), *overrides)
    cmd = torchrun_command(config, dump_folder, nproc, overrides)
    return launch(cmd, dump_folder, timeout_s=timeout_s, env=env)


@pytest.fixture
def no_leftovers():
    """Yields a checker: after a launch, no process may still mention the run's dump folder."""

    def check(dump_folder: Path, grace_s: float = 10.0) -> None:
        deadline = time.monotonic() + grace_s
        while (left := processes_mentioning(str(dump_folder))) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"processes left behind after the run: {left}"

    return check
