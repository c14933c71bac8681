"""Delegate lifecycle: after a normal close, an exception, SIGTERM and SIGKILL of a rank,
no delegate process of the run is alive (``/proc`` scan, what ``ps`` shows) and ``/dev/shm``
holds no ``titan_morph_*`` segment of it.

The signal cases run two real training-rank processes (this file as a script) so a test can kill
one of them the way a cluster manager would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from titan_morph.comm.delegate.shm import leftovers

REPO = Path(__file__).resolve().parent.parent.parent


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    from tests.launch import processes_mentioning as scan

    return scan(text)


def _exchange(tr, rank: int) -> None:
    """One message each way over link 0 (both ranks), checked."""
    import torch
    import torch.distributed as dist

    x = torch.arange(10, dtype=torch.float32)
    buf = torch.empty(10)
    ops = [dist.P2POp(dist.isend, x + rank, 1 - rank), dist.P2POp(dist.irecv, buf, 1 - rank)]
    for h in tr.batch_p2p(ops):
        h.wait(30.0)
    assert torch.equal(buf, x + (1 - rank))


def _close_and_raise(rank: int, world: int) -> list[str]:
    from titan_morph.comm.delegate.transport import DelegateTransport

    tokens = []
    tr = DelegateTransport(stage=rank, num_stages=world, delegates_per_link=2)
    _exchange(tr, rank)
    tr.close()
    tokens.append(tr.token)
    try:
        with DelegateTransport(stage=rank, num_stages=world) as tr2:
            tokens.append(tr2.token)
            _exchange(tr2, rank)
            raise ValueError("boom")
    except ValueError:
        pass
    return tokens


def _gone(marker: str, timeout_s: float = 15.0) -> tuple[list, list]:
    """Wait until no process mentions ``marker`` and no segment starts with it; what is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        procs, segs = processes_mentioning(marker), leftovers(marker)
        if (not procs and not segs) or time.monotonic() > deadline:
            return procs, segs
        time.sleep(0.1)


def test_nothing_left_after_close_and_after_an_exception() -> None:
    from tests.launch import run_ranks

    results = run_ranks(_close_and_raise, 2, timeout=120)
    assert results[0] == results[1]
    for token in results[0]:
        procs, segs = _gone(token, 5.0)
        assert not procs, f"delegates of run {token} still alive: {procs}"
        assert not segs, f"shared-memory segments of run {token} left: {segs}"


def _rank_main(rank: int, world: int, port: int) -> None:
    """A training rank that sets up delegates, exchanges data, reports, and then just waits."""
    from datetime import timedelta

    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateTransport

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    tr = DelegateTransport(stage=rank, num_stages=world, delegates_per_link=2)
    _exchange(tr, rank)
    print(f"READY {tr.token}", flush=True)
    time.sleep(120)


def _start_ranks(world: int = 2) -> tuple[list[subprocess.Popen], str]:
    from tests.launch import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(r), str(world), str(port)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for r in range(world)
    ]
    tokens = set()
    deadline = time.monotonic() + 120
    for p in procs:
        import select

        while True:
            if time.monotonic() > deadline or p.poll() is not None:
                for q in procs:
                    q.kill()
                pytest.fail(f"rank {procs.index(p)} did not set up its delegates (exit {p.poll()})")
            ready, _, _ = select.select([p.stdout], [], [], 1.0)
            if ready:
                line = p.stdout.readline()
                if line.startswith("READY "):
                    tokens.add(line.split()[1])
                    break
    assert len(tokens) == 1, tokens
    return procs, tokens.pop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_delegates_and_segments_vanish_when_a_rank_is_killed(sig: signal.Signals) -> None:
    procs, token = _start_ranks()
    try:
        s1 = f"titan_morph_{token}_s1_"
        assert processes_mentioning(s1), "rank 1's delegates should be running"
        assert leftovers(f"titan_morph_{token}"), "segments should exist while the ranks run"
        procs[1].send_signal(sig)
        procs[1].wait(10)
        left_procs, left_segs = _gone(s1)
        assert not left_procs, f"rank 1 got {sig.name}; its delegates are still alive: {left_procs}"
        assert not left_segs, f"rank 1 got {sig.name}; its segments are left: {left_segs}"
        procs[0].send_signal(sig)
        procs[0].wait(10)
        left_procs, left_segs = _gone(token)
        assert not left_procs, f"delegates of run {token} still alive: {left_procs}"
        assert not left_segs, f"segments of run {token} left: {left_segs}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
            if p.stdout:
                p.stdout.close()


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
