"""Real llama3 debug training with ``[morph] transport = "delegate"`` gives the
same per-step losses as the default transport (real torchrun, CPU, 5 steps), and leaves no
delegate process or shared-memory segment behind.

CI: PP=2 (PipeMorph). Slow: PP=4, with and without injected delays (applied inside the delegates).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.launch import processes_mentioning, torchrun
from titan_morph.comm.delegate.shm import leftovers

STEPS = 5
DELEGATE = "titan_morph.comm.delegate.worker"
COMMON = ("--training.steps", str(STEPS), "--training.seq_len", "32", "--metrics.log_freq", "1")


def _delays(ranks: int) -> tuple[str, ...]:
    values = ["0"] * (ranks - 1)
    values[(ranks - 1) // 2] = "20"
    return ("--morph.inject.mode", "static", "--morph.inject.delays_ms", ",".join(values))


def _left_behind(segments_before: set[str], delegates_before: set[int]) -> tuple[list[str], list[int]]:
    """Segments and delegate processes that appeared since and belong to no running job: a delegate
    whose trainer (``"parent"`` of its spec) still runs, and that job's segments (its run token),
    belong to another job on the shared host, not to a leak of this run."""
    orphans, live_tokens = [], set()
    for pid, cmd in processes_mentioning(DELEGATE):
        parent, token = re.search(r'"parent": (\d+)', cmd), re.search(r"--run=(\w+)", cmd)
        if parent and Path(f"/proc/{parent.group(1)}").exists():
            live_tokens.update([token.group(1)] if token else [])
        elif pid not in delegates_before:
            orphans.append(pid)
    segments = [n for n in set(leftovers()) - segments_before if not any(t in n for t in live_tokens)]
    return sorted(segments), orphans


def _run(ranks: int, folder: Path, *args: str) -> dict[int, float]:
    before = set(leftovers())
    delegates_before = {pid for pid, _ in processes_mentioning(DELEGATE)}
    result = torchrun(ranks, folder, *COMMON, "--parallelism.pipeline_parallel_schedule", "PipeMorph", *args)
    assert result.returncode == 0, f"training failed (exit {result.returncode}):\n{result.tail()}"
    losses = result.losses()
    assert sorted(losses) == list(range(1, STEPS + 1)), f"loss per step: {losses}"
    segments, left = _left_behind(before, delegates_before)
    if segments or left:  # a concurrent job's delegates may be shutting down right now: look again
        time.sleep(3.0)
        again = _left_behind(before, delegates_before)
        segments, left = sorted(set(segments) & set(again[0])), sorted(set(left) & set(again[1]))
    assert not segments, f"shared-memory segments left: {segments}"
    assert not left, f"delegate processes left: {left}"
    return losses


CASES = [
    pytest.param(2, False, id="pp2", marks=pytest.mark.slow),
    pytest.param(4, False, id="pp4", marks=pytest.mark.slow),
    pytest.param(4, True, id="pp4-delay", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("ranks, delayed", CASES)
def test_delegate_losses_equal_default_transport(ranks, delayed, tmp_path, no_leftovers):
    extra = _delays(ranks) if delayed else ()
    default = _run(ranks, tmp_path / "default", *extra)
    delegated = _run(
        ranks, tmp_path / "delegate", *extra, "--morph.transport", "delegate", "--morph.delegates_per_link", "2"
    )
    assert delegated == default, f"delegate {delegated} vs default {default}"
    no_leftovers(tmp_path)
