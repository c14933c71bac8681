"""CPU process groups for the small collectives titan_morph runs beside the pipeline's own traffic,
and gloo bound to one network interface.

The clock estimate and the per-step exchange carry a few hundred floats; on GPUs the pipeline group
is NCCL, which needs device tensors, so they run on a gloo group over the same ranks, made once per
pipeline group and reused. With ``[morph] host_ifnames`` that group is bound to the host interface
(a new group even when the pipeline group is gloo), so this control traffic never shares the data
NIC with the pipeline's default path (paper §5: host-side traffic on its own NIC).

A group made here waits as long as TorchTitan's ``[comm]`` timeouts allow (init_s when made,
train_s once :func:`step_timeout` sees step 2), not torch's 30-minute default: TorchTitan shortens
only its own groups.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from titan_morph.comm.timeouts import DEFAULT_TIMEOUTS, CommTimeouts

__all__ = ["GROUP_LOCK", "check_interface", "cpu_group", "gloo_options", "interface_address", "step_timeout"]

GROUP_LOCK = threading.Lock()
"""Held while this process makes a gloo group: one at a time, so a group made with a temporary
``GLOO_SOCKET_IFNAME`` (:func:`cpu_group`) never leaks its interface into another's."""

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address

# Module-level: making a group is collective, so every caller on this rank must share the one made.
_cpu_groups: dict[tuple[str, str], dist.ProcessGroup] = {}


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
    """``group`` itself when it runs on gloo and no ``interface`` is asked, else a gloo group over
    the same ranks, bound to ``interface`` when one is given (members only; made on first use and
    cached, so every caller on this rank shares it), its collectives bounded by ``timeouts.init_s``."""
    if not interface and dist.get_backend(group) == "gloo":
        return group
    key = (group.group_name, interface)
    cached = _cpu_groups.get(key)
    if cached is None:
        if interface:
            check_interface(interface, "[morph] host_ifnames")
        ranks = dist.get_process_group_ranks(group)
        timeout = timedelta(seconds=timeouts.init_s)
        with _gloo_interface(interface) if interface else contextlib.nullcontext():
            made = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout, use_local_synchronization=True)
        cached = _cpu_groups[key] = made
    return cached


def step_timeout(group: dist.ProcessGroup, timeouts: CommTimeouts, step: int) -> None:
    """Bound the collectives of ``group`` in TorchTitan step ``step`` (``timeouts.for_step``) when
    :func:`cpu_group` made it; a caller's own group is TorchTitan's, which shortens it itself."""
    if not any(group is made for made in _cpu_groups.values()):
        return
    # torch's private setter, the one TorchTitan's set_pg_timeouts calls on its own groups
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeouts.for_step(step)), group)
