"""Which NIC carries which traffic (``[morph] data_ifname``, ``host_ifnames``), on real gloo ranks.

The per-link groups, the per-step exchange's CPU group and the delegates (their gloo pairs and
their store) are bound to the interface they are given; here "lo", the one every host has, so each
group's connected sockets must sit on 127.0.0.1 and the delegates must start with
``GLOO_SOCKET_IFNAME=lo`` and reach their store on lo's address. An unknown interface is one clear
error naming the setting. (tests/netlab shows the classes on two real NICs.)
"""

from __future__ import annotations

import pytest

from tests.launch import run_ranks


def _local_addresses(fds: list[int]) -> set[str]:
    import os
    import socket

    found = set()
    for fd in fds:
        with socket.socket(fileno=os.dup(fd)) as s:
            if s.family == socket.AF_INET and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                found.add(s.getsockname()[0])
    return found


def _bound_to_lo(rank: int, world: int) -> dict:
    import os

    import torch
    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateTransport
    from titan_morph.comm.groups import cpu_group
    from titan_morph.comm.pairs import LinkGroups, LinkTransport
    from titan_morph.comm.timeouts import CommTimeouts
    from titan_morph.runtime.exchange import StepExchange

    out: dict = {}
    world_group = dist.group.WORLD
    assert world_group is not None
    # the exchange's CPU group: a new gloo group on lo even though WORLD is gloo already
    exchange = StepExchange(world_group, 2, 1, "lo")
    out["new_group"] = exchange.group is not world_group and exchange.group is cpu_group(world_group, "lo")
    out["gathered"] = [r[0] for r in exchange.all_gather([float(rank)] * 4, 0)]
    # the per-link groups on lo, carrying one message each way
    groups = LinkGroups(
        stage=rank, num_stages=world, namespace="ifname", timeouts=CommTimeouts.fixed(30), interface="lo"
    )
    wire = LinkTransport(groups, epoch=0.0)
    peer = 1 - rank
    mine, theirs = torch.full((8,), float(rank + 1)), torch.zeros(8)
    ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)]
    for h in wire.batch_p2p(ops if rank == 0 else ops[::-1]):
        h.wait(30.0)
    out["pair_payload"] = theirs.tolist()
    out["pair_addresses"] = sorted(_local_addresses(groups.group(0).fwd._fds))
    # the delegates on lo
    with DelegateTransport(
        stage=rank, num_stages=world, timeouts=CommTimeouts.fixed(60), host_interfaces=("lo",)
    ) as tr:
        assert tr.proc is not None
        environ = open(f"/proc/{tr.proc.pid}/environ", "rb").read().split(b"\0")
        out["delegate_ifname"] = [e.decode() for e in environ if e.startswith(b"GLOO_SOCKET_IFNAME=")]
        out["store"] = tr.pool._store_addr.rsplit(":", 1)[0]
        buf = torch.zeros(16)
        if rank == 0:
            for h in tr.batch_p2p([dist.P2POp(dist.isend, torch.arange(16.0), 1)]):
                h.wait(30.0)
        else:
            for h in tr.batch_p2p([dist.P2POp(dist.irecv, buf, 0)]):
                h.wait(30.0)
        out["delegated"] = buf.tolist()
    out["env_after"] = os.environ.get("GLOO_SOCKET_IFNAME")  # cpu_group set it only while it made the group
    return out


def test_groups_and_delegates_bound_to_lo_work() -> None:
    results = run_ranks(_bound_to_lo, 2, timeout=120)
    for rank, r in enumerate(results):
        assert r["new_group"], "the exchange's CPU group must be a new group on the host interface"
        assert r["gathered"] == [0.0, 1.0]
        assert r["pair_payload"] == [float(2 - rank)] * 8
        assert r["pair_addresses"] == ["127.0.0.1"], r["pair_addresses"]
        assert r["delegate_ifname"] == ["GLOO_SOCKET_IFNAME=lo"]
        assert r["store"] == "127.0.0.1"
        assert r["env_after"] is None
    assert results[1]["delegated"] == [float(i) for i in range(16)]


def _unknown_interface(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from titan_morph.comm.groups import cpu_group
    from titan_morph.comm.pairs import LinkGroups

    errors = {}
    for what, make in (
        ("data", lambda: LinkGroups(stage=rank, num_stages=world, namespace="bad", interface="tmnosuch0")),
        ("host", lambda: cpu_group(dist.group.WORLD, "tmnosuch0")),  # type: ignore[arg-type]
    ):
        try:
            make()
            errors[what] = ""
        except ValueError as e:
            errors[what] = str(e)
    return errors


def test_an_unknown_interface_is_one_clear_error() -> None:
    for r in run_ranks(_unknown_interface, 2, timeout=60):
        assert r["data"].startswith("[morph] data_ifname: no network interface 'tmnosuch0'"), r
        assert r["host"].startswith("[morph] host_ifnames: no network interface 'tmnosuch0'"), r


@pytest.mark.parametrize("name", ["lo"])
def test_interface_address_of_lo(name: str) -> None:
    from titan_morph.comm.groups import interface_address

    assert interface_address(name, "[morph] host_ifnames") == "127.0.0.1"
