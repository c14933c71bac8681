"""Start real worker processes for multi-rank tests: free ports, bounded waits, no leftovers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parents[1])


def _with_repo_root(pythonpath: str | None) -> str:
    """Worker scripts import ``tests.*`` and ``titan_morph`` from this checkout."""
    return REPO_ROOT if not pythonpath else f"{REPO_ROOT}{os.pathsep}{pythonpath}"


def free_port() -> int:
    """A TCP port on localhost that was free a moment ago (for a gloo/torchrun rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(
    argv_per_rank: Sequence[Sequence[str]], *, timeout_s: float, env: dict[str, str] | None = None
) -> list[str]:
    """Run one ``python`` process per rank; return their outputs, or fail with every rank's log.

    Each process gets its own session so a hung rank's whole group can be killed; nothing outlives
    the call.
    """
    procs = [
        subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": _with_repo_root(os.environ.get("PYTHONPATH")), **(env or {})},
        )
        for argv in argv_per_rank
    ]
    deadline = time.monotonic() + timeout_s
    logs = [""] * len(procs)
    timed_out = False
    try:
        for r, p in enumerate(procs):
            try:
                logs[r] = p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0]
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        for r, p in enumerate(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                logs[r] += p.communicate(timeout=10)[0] or ""
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    if timed_out or failed:
        detail = "\n".join(f"--- rank {r} (rc {procs[r].returncode}) ---\n{logs[r][-3000:]}" for r in range(len(procs)))
        reason = f"ranks did not finish within {timeout_s:.0f} s" if timed_out else f"ranks {failed} failed"
        raise AssertionError(f"{reason}\n{detail}")
    return logs
