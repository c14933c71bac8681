"""The pluggable point-to-point transport of the pipeline runtime (issue 4 item 2; paper §5).

Every pipeline send/recv the schedule issues goes through one :class:`Transport`:
``batch_p2p(ops) -> handles``, each handle having ``wait(timeout)``. The default,
:class:`TorchTransport`, is torch.distributed itself (exactly torch's ``_batch_p2p``). The link
emulator (``titan_morph.comm.emulator``) wraps any transport; the delegated data plane (issue 5)
will be another implementation of the same protocol.

Topology used to name traffic (one stage per rank): pipeline-group rank ``r`` runs stage ``r``;
link ``i`` joins stages ``i`` and ``i+1``; direction ``"fwd"`` carries activations ``i → i+1`` and
``"bwd"`` gradients ``i+1 → i`` (the same convention as ``titan_morph.pipelining.links``).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch.distributed as dist
from torch.distributed.pipelining import schedules as _schedules

# torch's own implementation, captured before anyone (use_transport) swaps the module attribute.
_torch_batch_p2p = _schedules._batch_p2p
if getattr(_torch_batch_p2p, "__titan_morph_transport__", False):  # pragma: no cover - import order guard
    raise RuntimeError("titan_morph.comm.transport imported while torch's _batch_p2p is swapped")


@runtime_checkable
class Handle(Protocol):
    """One in-flight operation; torch's ``_wait_batch_p2p`` calls ``wait()`` on it."""

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (at most ``timeout`` s; None = the transport's default bound)."""
        ...


@runtime_checkable
class Transport(Protocol):
    """What the pipeline runtime needs from a data plane (swapped in by ``use_transport``)."""

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        """Issue ``ops`` (sends and/or receives); per-peer order of sends must be preserved."""
        ...

    def close(self) -> None:
        """Finish or abandon outstanding work and release threads/resources (idempotent)."""
        ...


class TorchHandle:
    """Adapts a ``dist.Work`` to :class:`Handle` (timeout in seconds instead of a timedelta).

    Note: on gloo a receive wait that times out closes the pair to the peer, so a timeout here is
    terminal for that peer, never a poll.
    """

    __slots__ = ("work",)

    def __init__(self, work: dist.Work) -> None:
        self.work = work

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            return bool(self.work.wait())
        return bool(self.work.wait(datetime.timedelta(seconds=max(0.0, timeout))))

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())


class TorchTransport:
    """torch.distributed as the transport: the same calls torch's ``_batch_p2p`` makes
    (homogeneous batches as individual isend/irecv, mixed ones via ``batch_isend_irecv``)."""

    name = "default"

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        return [TorchHandle(w) for w in _torch_batch_p2p(list(ops), desc=desc)]

    def close(self) -> None:
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


def op_nbytes(ops: Sequence[dist.P2POp]) -> int:
    """Payload size of a message in bytes."""
    return sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
