"""The transport stack of one pipeline rank, from ``[morph] transport`` and ``[morph.inject]``:
torch P2P, per-link groups, the link emulator, the recorder, the delegated data plane (§5) and the
failover between them (§5.3). Kept per process so the trainer can close them while the process
groups still exist."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import TypedDict

import torch
import torch.distributed as dist

from titan_morph.comm.clock import CommonClock
from titan_morph.comm.transport import TorchTransport, Transport
from titan_morph.config.links import break_window
from titan_morph.integration.cpu import shared_gpu
from titan_morph.integration.request import ScheduleRequest, group_of
from titan_morph.pipelining.core.links import LinkModel

__all__ = ["close_transports", "make_transport"]

logger = logging.getLogger(__name__)
# Per-link group namespaces: module-wide so that every rank numbers them in the same construction order.
_link_groups = itertools.count()

# This process's transports: TorchTitan's trainer closes the schedule, not what it built, so they are kept
# here and closed by the trainer's close() while the process groups still exist.
_opened: list[Transport] = []


class _Where(TypedDict):
    """Where a transport sits: this rank's place in the pipeline and the pipeline's group."""

    stage: int
    num_stages: int
    group: dist.ProcessGroup | None


def make_transport(req: ScheduleRequest, clock: CommonClock, *, monitored: bool = False) -> Transport | None:
    """:func:`_transport` for this rank, remembered so that :func:`close_transports` closes it."""
    transport = _transport(req, clock, monitored=monitored)
    if transport is not None:
        _opened.append(transport)
    return transport


def close_transports(*, drain: bool) -> None:
    """Close this process's transports (their threads and delegate processes) while the process
    groups still exist: called at the end of training, before TorchTitan destroys them. ``drain``:
    let queued sends leave first (a finished run), else abandon them (a failed one)."""
    while _opened:
        _opened.pop().close(drain=drain)


def _transport(req: ScheduleRequest, clock: CommonClock, *, monitored: bool = False) -> Transport | None:
    """The transport of ``[morph] transport`` for this rank, on ``clock``; None for plain
    torch.distributed (no injection, default transport, nothing to record).

    ``default``: torch P2P (on one process group per link over ``[morph] data_ifname`` when that
    is set), through the ``[morph.inject]`` link emulator when it is on (a send
    blocks once ``link_queue_depth`` messages are in flight: NCCL's head-of-line blocking, §3.2),
    else recording message stamps for the monitor when ``monitored``. ``delegate``: the delegated
    data plane (§5), which applies the injected delays inside its delegates and never blocks the
    training thread on the wire; a failed delegate stops the job with one error. ``auto``: the
    default path on one process group per link (so one link can fail and be re-made alone), moved
    per link to the delegates when a link is slow or its default path fails (and back when probes
    succeed again), and back from the delegates when one of them dies (§5.3).

    Ranks sharing a GPU (:func:`~titan_morph.integration.cpu.shared_gpu`: Gloo, without point-to-point
    of device memory): the delegated path carries every link, ``auto``'s delegate side; ``default``
    moves its bytes over it, under the link emulator (and its blocking queue) when injecting.

    Every wait is bounded by TorchTitan's ``[comm]`` timeouts (start-up, then training).
    """
    settings = req.settings
    morph = settings.morph
    stage = req.stage
    ranks = stage.group_size
    links = req.links()
    timeouts = settings.timeouts
    device = stage.device
    where: _Where = {"stage": stage.group_rank, "num_stages": ranks, "group": stage.group}
    from titan_morph.comm.delegate.transport import DelegateTransport  # spawns processes: loaded only when used

    def delegates(strict: bool, delays: LinkModel | None = links) -> DelegateTransport:
        """The delegated path (§5); ``strict``: a failed delegate stops the job (no failover behind);
        ``delays``: the link model its delegates apply (None: the emulator above applies it)."""
        return DelegateTransport(
            **where,
            links=delays,
            delegates_per_link=morph.delegates_per_link,
            epoch=clock.epoch,
            timeouts=timeouts,
            strict=strict,
            device=device,
            host_interfaces=morph.host_interfaces,
        )

    if shared_gpu() is not None and morph.transport != "delegate":
        return _shared_gpu_transport(req, clock, where, delegates)
    if morph.transport == "delegate":  # all PP traffic via delegates; they apply the injected delays
        return delegates(strict=True)
    primary: Transport = TorchTransport(clock.epoch)
    pairs = None
    if morph.transport == "auto" or morph.data_ifname:  # per-link groups: on their own NIC, or to fail alone
        from titan_morph.comm.pairs import BreakPlan, LinkGroups, LinkTransport

        window = break_window(morph.inject, ranks - 1)
        group_name = group_of(stage).group_name
        pairs = LinkGroups(
            stage=stage.group_rank,
            num_stages=ranks,
            namespace=f"{group_name}/{next(_link_groups)}",
            backend="nccl" if device is not None and torch.device(device).type == "cuda" else "gloo",
            timeouts=timeouts,
            device=device,
            breaks=BreakPlan(*window) if window is not None else None,
            interface=morph.data_ifname,
        )
        primary = LinkTransport(pairs, group=stage.group, epoch=clock.epoch)
    if links is not None:
        from titan_morph.comm.emulator.transport import EmulatedTransport

        primary = EmulatedTransport(
            primary,
            links,
            **where,
            depth=morph.link_queue_depth,
            epoch=clock.epoch,
            timeouts=timeouts,
        )
    elif monitored:  # the real network: message stamps for the monitor
        from titan_morph.comm.recorded import RecordedTransport

        primary = RecordedTransport(primary, **where, epoch=clock.epoch)
    elif morph.transport == "default" and pairs is None:
        return None
    if morph.transport == "default":
        return primary
    from titan_morph.comm.failover.transport import FailoverTransport

    return FailoverTransport(
        primary,
        delegates(strict=False),
        **where,
        pairs=pairs,
        timeouts=timeouts,
        recover_probes=morph.recover_consecutive,
    )


def _shared_gpu_transport(
    req: ScheduleRequest, clock: CommonClock, where: _Where, delegates: Callable[..., Transport]
) -> Transport:
    """The data plane of ranks that share a GPU (see :func:`_transport`), logged once per rank."""
    morph, links, transport = req.settings.morph, req.links(), req.settings.morph.transport
    emulated = transport == "default" and links is not None
    how = "on its delegate side" if transport == "auto" else "over the delegated path"
    extra = f", under the link emulator (link_queue_depth {morph.link_queue_depth})" if emulated else ""
    logger.warning(f"titan_morph: ranks share a GPU: transport {transport!r} runs every link {how}{extra}")
    if not emulated or links is None:
        return delegates(strict=True)
    from titan_morph.comm.emulator.transport import EmulatedTransport

    wire = delegates(strict=True, delays=None)
    return EmulatedTransport(
        wire, links, **where, depth=morph.link_queue_depth, epoch=clock.epoch, timeouts=req.settings.timeouts
    )
