"""The pluggable point-to-point transport of the pipeline runtime (paper §5), written down.

Every pipeline send/recv the schedule issues goes through one :class:`Transport`:
``batch_p2p(ops) -> handles``, each handle having ``wait(timeout)``. :class:`Transport` names
every member the runtime and the monitor use, and every transport implements all of it:
:class:`TorchTransport` (torch.distributed itself, exactly torch's ``_batch_p2p``),
``RecordedTransport`` (the same, with message records), ``EmulatedTransport`` (the link emulator),
``DelegateTransport`` (the delegated data plane) and ``FailoverTransport`` (``auto``).

Topology used to name traffic (one stage per rank): pipeline-group rank ``r`` runs stage ``r``;
link ``i`` joins stages ``i`` and ``i+1``; direction ``"fwd"`` carries activations ``i → i+1`` and
``"bwd"`` gradients ``i+1 → i`` (the same convention as ``titan_morph.pipelining.core.links``).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch.distributed.pipelining import schedules as _schedules

from titan_morph.comm.records import CommTimeoutError, MessageRecord
from titan_morph.comm.waits import DeviceOp, on_nccl, stream_wait
from titan_morph.pipelining.core.links import LinkModel

# torch's own implementation, captured before anyone (use_transport) swaps the module attribute.
_torch_batch_p2p = _schedules._batch_p2p
if getattr(_torch_batch_p2p, "__titan_morph_transport__", False):  # pragma: no cover - import order guard
    raise RuntimeError("titan_morph.comm.transport imported while torch's _batch_p2p is swapped")


@runtime_checkable
class Handle(Protocol):
    """One in-flight message (or plain op); torch's ``_wait_batch_p2p`` calls ``wait()`` on it.

    ``record`` is the message's :class:`~titan_morph.comm.records.MessageRecord` (None where the
    transport keeps none); ``ops`` the P2P ops it carries (a failover path re-issues them);
    ``due_s`` when the link model delivers a receive (``time.monotonic()`` s; None when unknown:
    a device clock then takes the moment the wait returned).
    """

    @property
    def record(self) -> MessageRecord | None: ...

    @property
    def ops(self) -> Sequence[dist.P2POp]: ...

    @property
    def due_s(self) -> float | None: ...

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (at most ``timeout`` s; None = the transport's own bound)."""
        ...

    def is_completed(self) -> bool:
        """Whether ``wait`` would return at once."""
        ...


@runtime_checkable
class P2P(Protocol):
    """What torch's schedules call instead of ``_batch_p2p`` while ``use_transport`` is active."""

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        """Issue ``ops`` (sends and/or receives); per-peer order of sends must be preserved."""
        ...


@runtime_checkable
class Transport(P2P, Protocol):
    """A pipeline data plane: everything the runtime and the monitor use, on every transport.

    Topology: one stage per pipeline rank; link ``i`` joins stages ``i`` and ``i+1``; ``"fwd"``
    carries activations ``i -> i+1``, ``"bwd"`` gradients back. Times are ms since ``epoch`` (the
    pipeline's common clock, :mod:`titan_morph.comm.clock`). Transports switch paths only at step
    boundaries (``switch``/``restore`` between steps, on every rank).
    """

    name: str
    """``default`` (torch.distributed), ``emulated``, ``delegate`` or ``auto``."""
    epoch: float
    """t = 0 of every time this transport reports, as a ``time.monotonic()`` value of this rank."""
    links: LinkModel | None
    """The injected link model (None: the real network, no emulation)."""
    depth: int | None
    """Messages in flight per (link, direction) before a send blocks the caller (None: never)."""

    @property
    def failovers(self) -> int:
        """(link, direction) pairs moved to the delegated path because the default path failed."""
        ...

    def now_ms(self) -> float:
        """ms since ``epoch``."""
        ...

    def set_step(self, step: int) -> None:
        """The training step about to run (records and step-keyed traces); call before each step."""
        ...

    def hint_issue(self, t_s: float, max_early_ms: float = 2.0) -> None:
        """The next ``batch_p2p``'s sends were logically issued at ``t_s`` (``time.monotonic()``), up to
        ``max_early_ms`` before the call: a device clock's producing op ended then. Transports that
        time nothing from the issue ignore it."""
        ...

    def records(self) -> list[MessageRecord]:
        """Copies of the records not yet taken (empty where none are kept)."""
        ...

    def take_records(self) -> list[MessageRecord]:
        """This rank's message records since the last call (empty where none are kept)."""
        ...

    def blocked_ms(self) -> dict[int, float]:
        """Per link: total ms the caller was blocked issuing sends, since the start."""
        ...

    def delegated(self) -> frozenset[int]:
        """Links with at least one direction on the delegated (host delegate process) path."""
        ...

    def switch(self, links: Iterable[int]) -> None:
        """Move both directions of ``links`` to the delegated path (between steps, every rank);
        ``ValueError`` on a transport without one."""
        ...

    def restore(self, links: Iterable[int]) -> None:
        """Move ``links`` that :meth:`switch` delegated back to the default path (between steps)."""
        ...

    def close(self, timeout: float | None = None, drain: bool = True) -> None:
        """Release threads, processes and resources (idempotent): after outstanding sends left
        (``drain``, within ``timeout`` s; None = the transport's own bound) or abandoning them."""
        ...


@runtime_checkable
class RateProbeable(Protocol):
    """A transport whose links' default path can carry a probe train."""

    def rate_probe_path(self, link: int) -> P2P | None:
        """The unrecorded path of ``link``'s pipeline messages, or None where they do not take one
        a probe can time (the link is delegated, emulated, or on the device)."""
        ...


@runtime_checkable
class Settles(Protocol):
    """A handle whose operations a helper thread can wait for ahead of the consumer: ``settle`` ends
    when they completed (or raises their failure) and stamps nothing, so the consumer's own ``wait``
    still records when it began waiting and when it saw the data."""

    def settle(self, timeout: float) -> None:
        """Block until the operations completed, at most ``timeout`` s (their error if they failed)."""
        ...


@runtime_checkable
class DeviceOrdered(Protocol):
    """A handle whose ``wait`` may return before its operations ran: on NCCL it orders the current
    stream after them (:mod:`titan_morph.comm.waits`). A path that stamps deliveries, or re-issues
    traffic after a failure, asks their :class:`~titan_morph.comm.waits.DeviceOp` when (whether) the
    data really arrived."""

    def device_ops(self) -> list[DeviceOp]:
        """This handle's operations on the device's queue (empty where ``wait`` returns with the data)."""
        ...


class TorchHandle:
    """Adapts a ``dist.Work`` to :class:`Handle` (timeout in seconds instead of a timedelta).

    Note: on gloo a receive wait that times out closes the pair to the peer, so a timeout here is
    terminal for that peer, never a poll. On NCCL (``device``) a bounded wait is stream-ordered and
    the operation is watched off the host (:func:`~titan_morph.comm.waits.stream_wait`): one that
    outlasts the bound is an error of the next bounded wait (``stalls``: where it is kept).
    """

    __slots__ = ("work", "ops", "op", "stalls")
    record = None
    due_s = None

    def __init__(
        self, work: dist.Work, ops: Sequence[dist.P2POp] = (), device: bool = False, stalls: Stalls | None = None
    ) -> None:
        self.work, self.ops, self.stalls = work, ops, stalls if stalls is not None else Stalls()
        self.op = DeviceOp(work) if device else None

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            return bool(self.work.wait())
        if self.op is not None:
            self.stalls.check()
            stream_wait(self.op, timeout, self._stalled)
            return True
        return bool(self.work.wait(datetime.timedelta(seconds=max(0.0, timeout))))

    def _stalled(self, waited_s: float) -> None:
        self.stalls.add(
            CommTimeoutError(f"point-to-point operation not completed on the device within {waited_s:.3g} s")
        )

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())

    def device_ops(self) -> list[DeviceOp]:
        return [self.op] if self.op is not None else []


class Stalls:
    """Operations found stalled on the device by the watch's thread, raised by the training thread's
    next call (the first one; the others are the same failure seen again)."""

    def __init__(self) -> None:
        self._errors: list[BaseException] = []

    def add(self, error: BaseException) -> None:
        self._errors.append(error)

    def check(self) -> None:
        if self._errors:
            raise self._errors[0]


class DefaultPathOnly:
    """The path members of a transport without a delegated path: nothing is ever delegated, so
    nothing fails over; ``switch`` of any link is an error naming the way to get one."""

    name = ""
    failovers = 0

    def delegated(self) -> frozenset[int]:
        return frozenset()

    def switch(self, links: Iterable[int]) -> None:
        wanted = sorted(links)
        if wanted:
            raise ValueError(
                f"transport {self.name!r} has no delegated path to move links {wanted} to; "
                'use [morph] transport = "auto"'
            )

    def restore(self, links: Iterable[int]) -> None:
        pass


class TorchTransport(DefaultPathOnly, Transport):
    """torch.distributed as the transport: the same calls torch's ``_batch_p2p`` makes
    (homogeneous batches as individual isend/irecv, mixed ones via ``batch_isend_irecv``).
    It keeps no records and never delegates."""

    name = "default"
    links = None
    depth = None

    def __init__(self, epoch: float | None = None) -> None:
        self.epoch = time.monotonic() if epoch is None else float(epoch)
        self.stalls = Stalls()

    def now_ms(self) -> float:
        return (time.monotonic() - self.epoch) * 1e3

    def set_step(self, step: int) -> None:
        pass

    def hint_issue(self, t_s: float, max_early_ms: float = 2.0) -> None:
        pass

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        ops = list(ops)
        self.stalls.check()
        works = _torch_batch_p2p(ops, desc=desc)
        device = bool(ops) and on_nccl(ops[0].group)
        if len(works) == len(ops):
            return [TorchHandle(w, (op,), device, self.stalls) for w, op in zip(works, ops)]
        # coalesced (NCCL)
        return [TorchHandle(w, ops if i == 0 else (), device, self.stalls) for i, w in enumerate(works)]

    def records(self) -> list[MessageRecord]:
        return []

    def take_records(self) -> list[MessageRecord]:
        return []

    def blocked_ms(self) -> dict[int, float]:
        return {}

    def close(self, timeout: float | None = None, drain: bool = True) -> None:
        pass

    def __enter__(self) -> TorchTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class LinkOp:
    """Where one P2P op travels: ``link`` (i ↔ i+1), ``direction`` and whether this rank sends."""

    link: int
    direction: str
    is_send: bool
    peer_stage: int


def is_send(op: dist.P2POp) -> bool:
    """True for ``isend`` ops, False for ``irecv`` (P2POp accepts nothing else)."""
    if op.op is dist.isend:
        return True
    if op.op is dist.irecv:
        return False
    raise ValueError(f"P2POp.op must be torch.distributed.isend or irecv, got {op.op!r}")


def classify_op(op: dist.P2POp, stage: int, num_stages: int) -> LinkOp:
    """Name the (link, direction) of ``op`` issued by ``stage`` (one stage per pipeline rank).

    ``op.group_peer`` is the peer's rank in the op's group, i.e. the peer's stage. Sends to
    ``stage+1`` and receives from ``stage-1`` are forward traffic; the reverse is backward.
    """
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage must be in 0..{num_stages - 1}, got {stage}")
    peer = op.group_peer
    send = is_send(op)
    if peer == stage + 1 and peer < num_stages:
        return LinkOp(stage, "fwd" if send else "bwd", send, peer)
    if peer == stage - 1 and peer >= 0:
        return LinkOp(peer, "bwd" if send else "fwd", send, peer)
    raise ValueError(
        f"stage {stage} of {num_stages} issued a P2P op with stage {peer}: only adjacent stages are "
        "joined by links (one stage per pipeline rank)"
    )


def group_by_link(
    ops: Sequence[dist.P2POp], stage: int, num_stages: int
) -> dict[tuple[int, str, bool], list[dist.P2POp]]:
    """Split ``ops`` into messages keyed by (link, direction, is_send), keeping issue order.

    One ``batch_p2p`` call's ops on one (link, direction) form one message (e.g. all tensors of a
    microbatch's activations), which is the unit the link model delays.
    """
    out: dict[tuple[int, str, bool], list[dist.P2POp]] = {}
    for op in ops:
        lo = classify_op(op, stage, num_stages)
        out.setdefault((lo.link, lo.direction, lo.is_send), []).append(op)
    return out


class LocalHandle:
    """Ops between a rank and itself, done when issued (:func:`on_own_rank`)."""

    record = None
    due_s = None

    def __init__(self, ops: Sequence[dist.P2POp]) -> None:
        self.ops = ops

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def warms_up_through_batch_p2p() -> bool:
    """Whether torch's schedules send a one-element dummy to each neighbour stage through
    ``_batch_p2p`` before their first step, and so through an active transport: torch 2.11 does.
    2.13 and 2.14 vote over direct sends instead (``PipelineStage._warmup_forward_vote``), and 2.15
    preconnects each pair of ranks with direct sends
    (``_PipelineSchedule._initialize_pipeline_distributed_state``): no transport sees either."""
    from torch.distributed.pipelining.schedules import _PipelineSchedule
    from torch.distributed.pipelining.stage import PipelineStage

    voted = hasattr(PipelineStage, "_warmup_forward_vote")
    preconnected = hasattr(_PipelineSchedule, "_initialize_pipeline_distributed_state")
    return not (voted or preconnected)


def warms_up_own_rank(schedule: object, group: dist.ProcessGroup | None) -> bool:
    """Whether torch's ``schedule`` sends its first-step warm-up dummy to this very rank over gloo,
    which cannot carry it: where torch warms up through ``_batch_p2p``
    (:func:`warms_up_through_batch_p2p`) and, in a V, two neighbour stages share a rank. Such a
    schedule's P2P must go through a transport, which pairs those ops within the call
    (:func:`on_own_rank`)."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti

    if not isinstance(schedule, PipelineScheduleMulti) or not warms_up_through_batch_p2p():
        return False
    ranks = schedule.stage_index_to_group_rank
    return dist.get_backend(group) == "gloo" and any(ranks.get(s) == ranks.get(s + 1) for s in ranks)


def on_own_rank(ops: Sequence[dist.P2POp]) -> tuple[list[dist.P2POp], list[Handle]]:
    """Take the ops whose peer is this very rank out of ``ops``: torch 2.11's schedules warm P2P up
    before the first step with a dummy to each neighbour stage, and in a V a stage's neighbour runs on
    its own rank. Such an op crosses no link: each receive from this rank gets the tensor of the send
    to it issued in the same call, in order. Returns the other ops and one handle of the local ones."""
    own = {id(op) for op in ops if op.group_peer == dist.get_rank(op.group)}
    if not own:
        return list(ops), []
    sends = [op for op in ops if id(op) in own and is_send(op)]
    recvs = [op for op in ops if id(op) in own and not is_send(op)]
    if len(sends) != len(recvs):
        raise ValueError(
            f"{len(sends)} sends to this rank itself but {len(recvs)} receives from it in one batch_p2p call: "
            "a P2P op with one's own rank crosses no link, and must be paired within the call"
        )
    with torch.no_grad():
        for send, recv in zip(sends, recvs):
            recv.tensor.copy_(send.tensor)
    return [op for op in ops if id(op) not in own], [LocalHandle([op for op in ops if id(op) in own])]
