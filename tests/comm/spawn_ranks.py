"""Run a function on N real gloo ranks (spawned processes, free-port TCP rendezvous), bounded in time.

Each rank's return value comes back through a pickle file; a rank's exception fails the run with
its traceback; on timeout every rank is killed, so no process outlives the test.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

PG_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, out: str, fn: Callable[..., Any], args: tuple) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import faulthandler

    faulthandler.enable()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=PG_TIMEOUT_S),
    )
    try:
        result = fn(rank, world, *args)
        Path(out, f"{rank}.pkl").write_bytes(pickle.dumps(("ok", result)))
    except BaseException:
        Path(out, f"{rank}.pkl").write_bytes(pickle.dumps(("error", traceback.format_exc())))
        raise
    finally:
        import gc

        gc.collect()  # nothing holding gloo work may survive into interpreter finalization
        dist.destroy_process_group()
    # The result is on disk and the group is gone. Skip interpreter finalization: a rare race
    # between gloo's threads and interpreter teardown aborts there ("terminate called without an
    # active exception") after all work succeeded; it is a known issue to fix in the library.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 60.0) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` gloo ranks; returns the per-rank results."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="titan_morph_comm_") as out:
        ctx = mp.start_processes(
            _entry, args=(world, free_port(), out, fn, args), nprocs=world, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=0.2):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{fn.__name__} on {world} ranks did not finish within {timeout} s")
        except Exception as e:
            details = []
            for r in range(world):
                p = Path(out, f"{r}.pkl")
                if p.exists():
                    status, val = pickle.loads(p.read_bytes())
                    details.append(f"--- rank {r} ---\n{val}" if status == "error" else f"--- rank {r}: fn returned")
            raise AssertionError(f"{e}\n" + "\n".join(details)) from e
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join(5)
            assert all(not p.is_alive() for p in ctx.processes), "rank processes left running"
        results = []
        for r in range(world):
            status, val = pickle.loads(Path(out, f"{r}.pkl").read_bytes())
            assert status == "ok", val
            results.append(val)
        return results
