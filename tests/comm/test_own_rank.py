"""P2P ops with one's own rank cross no link (torch 2.11 warms P2P up with a dummy to each
neighbour stage before the first step; in a V a stage's neighbour runs on its own rank): they are
matched within the call, and the rest goes to the transport (a real gloo rank)."""

from __future__ import annotations

import pytest

from tests.launch import run_ranks


def _own(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm.transport import on_own_rank

    got = torch.zeros(2)
    other = dist.P2POp(dist.isend, torch.ones(1), 1 - rank)  # to the peer: left to the transport
    ops = [dist.P2POp(dist.irecv, got, rank), other, dist.P2POp(dist.isend, torch.tensor([3.0, 4.0]), rank)]
    rest, local = on_own_rank(ops)
    out = {"rest": [op is other for op in rest], "got": got.tolist(), "local": [h.wait() for h in local]}
    try:
        on_own_rank([dist.P2POp(dist.isend, torch.ones(1), rank)])
    except ValueError as e:
        out["unpaired"] = str(e)
    return out


def test_ops_with_ones_own_rank_are_matched_in_the_call() -> None:
    for r in run_ranks(_own, 2, timeout=60):
        assert r["rest"] == [True] and r["got"] == [3.0, 4.0] and r["local"] == [True]
        assert r["unpaired"].startswith("1 sends to this rank itself but 0 receives")


pytestmark = pytest.mark.timeout(120)
