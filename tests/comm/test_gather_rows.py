"""The per-step gather (:func:`titan_morph.comm.groups.gather_rows`): every rank gets every rank's
row, torch's flight recorder keeps nothing of it (it keeps every collective, with its stack, until
its ring is full), and a peer that never sends ends the wait within the bound with a message naming
both ranks."""

from __future__ import annotations

import pytest

from tests.launch import run_ranks

WORLD, STEPS = 3, 40


def _gather(rank: int, world: int, steps: int) -> tuple[int, int, int]:
    import pickle

    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace

    from titan_morph.comm.groups import gather_rows

    def entries() -> int:
        return len(pickle.loads(_dump_fr_trace(True, False, False)).get("entries", []))

    dist.barrier()  # a collective: the recorder has at least this one
    before = entries()
    for step in range(steps):
        mine = torch.full((5,), float(100 * rank + step), dtype=torch.float64)
        rows = gather_rows(dist.group.WORLD, mine, 30.0, "test")
        assert [r.tolist() for r in rows] == [[float(100 * r + step)] * 5 for r in range(world)]
    after = entries()
    dist.all_gather([torch.zeros(1) for _ in range(world)], torch.ones(1))  # one more collective
    return before, after, entries()


def test_every_rank_gets_every_row_and_the_flight_recorder_keeps_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")  # as TorchTitan sets it ([comm] trace_buf_size)
    for before, after, last in run_ranks(_gather, WORLD, STEPS, timeout=120):
        assert before >= 1 and after == before and last == after + 1, (before, after, last)


def _silent_peer(rank: int, world: int) -> str:
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from titan_morph.comm.groups import gather_rows

    store = dist.distributed_c10d._get_default_store()
    if rank == 1:  # never sends; stays up until rank 0 has given up
        store.wait(["silent/given_up"], timedelta(seconds=50))
        return ""
    start = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        gather_rows(dist.group.WORLD, torch.zeros(3, dtype=torch.float64), 1.0, "the exchange of step 7")
    took = time.monotonic() - start
    store.set("silent/given_up", "1")
    assert took < 20.0, took  # the 1 s bound, not the peer's exit (that would be another error)
    return str(err.value)


def test_a_peer_that_never_sends_ends_the_wait_within_the_bound() -> None:
    message = run_ranks(_silent_peer, 2, timeout=60)[0]
    assert message.startswith("the exchange of step 7: rank 0 could not receive from rank 1 within 1 s"), message
