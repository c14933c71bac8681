"""CPU process groups for the small collectives titan_morph runs beside the pipeline's own traffic,
and gloo bound to one network interface.

The clock estimate and the per-step exchange carry a few hundred floats; on GPUs the pipeline group
is NCCL, which needs device tensors, so they run on a gloo group over the same ranks, made once per
pipeline group and reused. With ``[morph] host_ifnames`` that group is bound to the host interface
(a new group even when the pipeline group is gloo), so this control traffic never shares the data
NIC with the pipeline's default path (paper §5: host-side traffic on its own NIC). A CPU job can
take the GPU jobs' path on purpose (:func:`separate_control_groups`, ``[morph] control_groups =
"separate"``): then every such group is new, also where the job's own group is gloo.

A group made here waits as long as TorchTitan's ``[comm]`` timeouts allow (init_s when made,
train_s once :func:`step_timeout` sees step 2), not torch's 30-minute default: TorchTitan shortens
only its own groups.

What runs every step gathers with :func:`gather_rows`, point-to-point messages, not a collective:
torch's flight recorder (on in TorchTitan, ``[comm] trace_buf_size``) keeps each collective with the
Python stack it came from (1-3 KB) until its ring of 20000 entries is full, megabytes per rank over
a few thousand steps for one collective a step; gloo records no point-to-point operation.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from titan_morph.comm.timeouts import DEFAULT_TIMEOUTS, CommTimeouts

__all__ = [
    "GATHER_TAG",
    "GROUP_LOCK",
    "check_interface",
    "cpu_group",
    "cpu_group_over",
    "gather_rows",
    "gloo_options",
    "interface_address",
    "separate_control_groups",
    "step_timeout",
]

GATHER_TAG = 0x7E11
"""The tag of :func:`gather_rows`' messages, apart from a pipeline's own on the same gloo group."""

GROUP_LOCK = threading.Lock()
"""Held while this process makes a gloo group: one at a time, so a group made with a temporary
``GLOO_SOCKET_IFNAME`` (:func:`cpu_group`) never leaks its interface into another's."""

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address

# Module-level: making a group is collective, so every caller on this rank must share the one made.
_cpu_groups: dict[tuple[str, str], dist.ProcessGroup] = {}
_separate = False  # every control-plane group a new gloo group (:func:`separate_control_groups`)


def separate_control_groups(on: bool) -> None:
    """Whether :func:`cpu_group` makes a new gloo group also for a group that is gloo already (the
    path an NCCL job takes); set once per process, before the first group is asked for."""
    global _separate
    _separate = on


def check_interface(name: str, setting: str) -> None:
    """Raise ValueError naming ``setting`` unless ``name`` is a network interface of this host."""
    try:
        socket.if_nametoindex(name)
    except OSError:
        have = ", ".join(sorted(n for _, n in socket.if_nameindex()))
        raise ValueError(
            f"{setting}: no network interface {name!r} on {socket.gethostname()} (it has {have})"
        ) from None


def interface_address(name: str, setting: str) -> str:
    """The IPv4 address of interface ``name`` (ValueError naming ``setting`` when it has none)."""
    check_interface(name, setting)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as e:
            raise ValueError(f"{setting}: interface {name!r} has no IPv4 address ({e.strerror})") from None
    return socket.inet_ntoa(raw[20:24])


def gloo_options(interface: str, timeout_s: float) -> Any:
    """Options of a ProcessGroupGloo whose connections all use ``interface`` (torch's stub omits
    ``ProcessGroupGloo._Options``)."""
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    opts._devices = [dist.ProcessGroupGloo.create_device(interface=interface)]
    opts._timeout = timedelta(seconds=timeout_s)
    return opts


@contextlib.contextmanager
def _gloo_interface(interface: str) -> Iterator[None]:
    """torch's ``new_group`` takes no gloo options: it reads ``GLOO_SOCKET_IFNAME`` when the group
    is made, so the interface is set there for that moment only (under :data:`GROUP_LOCK`)."""
    key = "GLOO_SOCKET_IFNAME"
    with GROUP_LOCK:
        saved = os.environ.get(key)
        os.environ[key] = interface
        try:
            yield
        finally:
            if saved is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = saved


def cpu_group(
    group: dist.ProcessGroup, interface: str = "", timeouts: CommTimeouts = DEFAULT_TIMEOUTS
) -> dist.ProcessGroup:
    """``group`` itself when it runs on gloo, no ``interface`` is asked and the control groups are
    not kept apart (:func:`separate_control_groups`), else a gloo group over the same ranks, bound
    to ``interface`` when one is given (members only; made on first use and cached, so every caller
    on this rank shares it), its collectives bounded by ``timeouts.init_s``."""
    if not interface and not _separate and dist.get_backend(group) == "gloo":
        return group
    key = (group.group_name, interface)
    cached = _cpu_groups.get(key)
    if cached is None:
        cached = _cpu_groups[key] = _new_gloo_group(dist.get_process_group_ranks(group), interface, timeouts)
    return cached


def cpu_group_over(
    ranks: list[int], interface: str = "", timeouts: CommTimeouts = DEFAULT_TIMEOUTS
) -> dist.ProcessGroup:
    """A gloo group over the global ``ranks`` (members only; cached per rank set and interface, as
    :func:`cpu_group`'s): for a set of ranks no group of the job spans, e.g. every TP lane of a pipeline."""
    key = (",".join(map(str, sorted(ranks))), interface)
    cached = _cpu_groups.get(key)
    if cached is None:
        cached = _cpu_groups[key] = _new_gloo_group(sorted(ranks), interface, timeouts)
    return cached


def _new_gloo_group(ranks: list[int], interface: str, timeouts: CommTimeouts) -> dist.ProcessGroup:
    """A gloo group over ``ranks``, made by its members alone (``use_local_synchronization``)."""
    if interface:
        check_interface(interface, "[morph] host_ifnames")
    timeout = timedelta(seconds=timeouts.init_s)
    with _gloo_interface(interface) if interface else contextlib.nullcontext():
        made = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout, use_local_synchronization=True)
    if not isinstance(made, dist.ProcessGroup):  # torch answers non-members with a sentinel
        raise RuntimeError(f"rank {dist.get_rank()} asked for a gloo group over ranks {ranks} it is not in")
    return made


def step_timeout(group: dist.ProcessGroup, timeouts: CommTimeouts, step: int) -> None:
    """Bound the collectives of ``group`` in TorchTitan step ``step`` (``timeouts.for_step``) when
    :func:`cpu_group` made it; a caller's own group is TorchTitan's, which shortens it itself."""
    if not any(group is made for made in _cpu_groups.values()):
        return
    # torch's private setter, the one TorchTitan's set_pg_timeouts calls on its own groups
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeouts.for_step(step)), group)


def gather_rows(group: dist.ProcessGroup, mine: torch.Tensor, timeout_s: float, what: str) -> list[torch.Tensor]:
    """Every rank's ``mine`` (one shape and dtype on all ranks), ordered by group rank: an all-gather
    of point-to-point messages on a gloo ``group`` (each rank sends its tensor to every other), so
    that torch's flight recorder keeps nothing of it (see the module docstring). Each rank posts all
    its receives, then its sends; every wait ends within ``timeout_s`` of the start, and a missing
    peer raises naming this rank, the peer and ``what``."""
    size, me = dist.get_world_size(group), dist.get_rank(group)
    rows = [mine if r == me else torch.empty_like(mine) for r in range(size)]
    peers = [r for r in range(size) if r != me]
    ranks = {r: dist.get_global_rank(group, r) for r in peers}
    works = [("receive from", r, dist.irecv(rows[r], src=ranks[r], group=group, tag=GATHER_TAG)) for r in peers]
    works += [("send to", r, dist.isend(mine, dst=ranks[r], group=group, tag=GATHER_TAG)) for r in peers]
    deadline = time.monotonic() + timeout_s
    for op, peer, work in works:
        if work is None:  # torch types isend/irecv as optional (None on a rank outside the group)
            raise RuntimeError(f"{what}: rank {dist.get_rank()} is not in the group it gathers on")
        try:
            work.wait(timedelta(seconds=max(1e-3, deadline - time.monotonic())))
        except RuntimeError as err:
            raise RuntimeError(
                f"{what}: rank {dist.get_rank()} could not {op} rank {ranks[peer]} within {timeout_s:g} s "
                f"([comm] timeouts): {err}"
            ) from err
    return rows
