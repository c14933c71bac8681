"""The gloo groups titan_morph makes beside the pipeline's wait as long as the job's ``[comm]``
timeouts allow (init_s, then train_s from step 2), not torch's 30-minute default: a peer that never
joins ends the collective with an error within the bound, on real gloo ranks."""

from __future__ import annotations

import time

from tests.launch import run_ranks


def _timeout_s(group) -> float:  # type: ignore[no-untyped-def]
    """The group's gloo timeout as torch holds it (seconds)."""
    import torch

    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()


def _failed_gather(group) -> tuple[bool, float]:  # type: ignore[no-untyped-def]
    """All-gather on ``group`` with no peer joining: (raised, seconds until it returned)."""
    import torch
    import torch.distributed as dist

    rows = [torch.zeros(4) for _ in range(dist.get_world_size(group))]
    t0 = time.monotonic()
    try:
        dist.all_gather(rows, torch.ones(4), group=group)
    except RuntimeError:
        return True, time.monotonic() - t0
    return False, time.monotonic() - t0


def _peer_never_joins(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from titan_morph.comm.groups import cpu_group, step_timeout
    from titan_morph.comm.timeouts import CommTimeouts

    world_group = dist.group.WORLD
    assert world_group is not None
    fixed = cpu_group(world_group, "lo", CommTimeouts.fixed(3))  # made on lo: a new gloo group
    training = CommTimeouts(init_s=60, train_s=3)
    switched = cpu_group(dist.new_group([0, 1], backend="gloo"), "lo", training)
    out: dict = {"made": _timeout_s(fixed), "init": _timeout_s(switched)}
    step_timeout(switched, training, 1)  # step 1 still waits init_s
    out["step1"] = _timeout_s(switched)
    step_timeout(switched, training, 2)
    out["step2"] = _timeout_s(switched)
    step_timeout(world_group, training, 2)  # the caller's own group: TorchTitan's to shorten
    out["world"] = _timeout_s(world_group)
    if rank == 0:  # rank 1 joins neither gather: it waits on the world group for rank 0 to finish
        out["fixed"] = _failed_gather(fixed)
        out["switched"] = _failed_gather(switched)
    dist.barrier()
    return out


def test_a_peer_that_never_joins_ends_the_gather_within_the_job_timeout() -> None:
    # run_ranks kills every rank on its own timeout and asserts that none is left running
    results = run_ranks(_peer_never_joins, 2, timeout=120, pg_timeout_s=60)
    for r in results:
        assert r["made"] == 3.0
        assert (r["init"], r["step1"], r["step2"]) == (60.0, 60.0, 3.0)
        assert r["world"] == 60.0
    for what in ("fixed", "switched"):
        raised, seconds = results[0][what]
        assert raised, f"{what}: the gather returned without its peer"
        assert seconds < 20.0, f"{what}: the gather took {seconds:.1f} s, not bounded by the 3 s timeout"


def _exchange_switch(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from titan_morph.comm.timeouts import CommTimeouts
    from titan_morph.runtime.exchange import StepExchange

    world_group = dist.group.WORLD
    assert world_group is not None
    timeouts = CommTimeouts(init_s=40, train_s=7)
    made = StepExchange(world_group, 2, 1, "lo", timeouts)
    own = StepExchange(world_group, 2, 1, "", timeouts)
    seen = []
    for step in (0, 1, 2):  # 0-based: TorchTitan's steps 1, 2, 3
        for exchange in (made, own):
            exchange.all_gather([float(rank)] * 4, step)
        seen.append((_timeout_s(made.group), _timeout_s(own.group)))
    return {"own_is_world": own.group is world_group, "seen": seen}


def test_the_exchange_group_waits_train_s_after_step_one() -> None:
    (r,) = run_ranks(_exchange_switch, 1, timeout=60, pg_timeout_s=50)
    assert r["own_is_world"]
    assert r["seen"] == [(40.0, 50.0), (7.0, 50.0), (7.0, 50.0)]
