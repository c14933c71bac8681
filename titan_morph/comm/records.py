"""What the transports record about each pipeline message, and the bookkeeping they share.

A :class:`MessageRecord` is one message as one side saw it, with times in ms since the pipeline's
common epoch (:mod:`titan_morph.comm.clock`). The monitor turns a step's records into per-link
delivery delays (the ``c_i`` of Eq. 1); the runtime turns them into TensorBoard figures.
:class:`MessageBook` is the base of every transport that keeps records: the pipeline position it
serves, its clock, per-(link, direction) sequence numbers and the record buffer.
"""

from __future__ import annotations

import atexit
import dataclasses
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

__all__ = ["CommTimeoutError", "MessageBook", "MessageRecord", "UndeliveredError", "close_at_exit", "op_nbytes"]


class CommTimeoutError(TimeoutError):
    """A pipeline message did not complete within its bound (names link, direction and peer)."""


class UndeliveredError(RuntimeError):
    """Sends nobody waited failed; a draining ``close`` raises it once it is done, naming rank, link,
    direction and message of each (its cause: the first failure), so no failed send goes unreported."""


@dataclass
class MessageRecord:
    """One pipeline message as seen by one side; times are ms since the pipeline's epoch.

    Sender: ``issued`` (batch_p2p called, or the earlier device time the caller hinted with
    ``hint_issue``), ``accepted`` (after head-of-line blocking), ``planned`` (intended delivery,
    ``accepted + delay_ms`` or later for FIFO), ``released`` (handed to the inner transport),
    ``completed`` (its wait returned). Receiver: ``issued`` (recv posted), ``planned`` (the sender's
    planned delivery, from its notice), ``notified`` (sender's commit notice seen), ``arrived`` (the
    data was in this rank's receive path, stamped by the transport itself -- a receive watcher, a
    delegate -- whether or not the consumer was waiting; None where the transport cannot tell, e.g.
    plain torch.distributed), ``waited`` (the consumer began waiting for it), ``completed`` (the
    consumer's wait observed it: later than ``arrived`` whenever the consumer was busy).

    Sender on CUDA: ``ready``, when the device had the payload (the producing work ended), where it
    is known (:mod:`titan_morph.comm.machine.stamps`).
    Delivery delay of message ``seq`` = receiver ``arrived`` - sender ``max(accepted, ready)``; without an
    arrival stamp it is ``completed`` - ``accepted`` when the consumer was already waiting.
    ``path`` names the transport that carried it (``"emulated"``, ``"delegate"``, ``"torch"``);
    sequence numbers count per path and (link, direction), so a send matches its receive by
    (path, link, direction, seq).
    """

    side: str
    link: int
    direction: str
    seq: int
    nbytes: int
    step: int
    peer_stage: int
    issued: float
    accepted: float | None = None
    planned: float | None = None
    delay_ms: float | None = None
    released: float | None = None
    notified: float | None = None
    arrived: float | None = None
    waited: float | None = None
    completed: float | None = None
    ready: float | None = None  # sender, CUDA: the payload was ready on the device (comm.machine.stamps)
    status: str = "pending"  # pending | done | down | error
    path: str = ""

    @property
    def blocked_ms(self) -> float:
        return 0.0 if self.accepted is None else self.accepted - self.issued

    @property
    def key(self) -> tuple[str, int, str, int]:
        """(path, link, direction, seq): equal for a send and its receive."""
        return (self.path, self.link, self.direction, self.seq)


def op_nbytes(ops: list[dist.P2POp]) -> int:
    """Payload size of a message in bytes."""
    return sum(op.tensor.numel() * op.tensor.element_size() for op in ops)


# Module-level: the interpreter-exit hook below must find every open transport of the process.
_live: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _close_live() -> None:
    """Transports with threads or processes still open at interpreter exit are closed without
    draining: a thread caught inside a C++ call at shutdown aborts the process."""
    for t in list(_live):
        try:
            t.close(timeout=t.exit_timeout_s, drain=False)
        except Exception:
            pass


def close_at_exit(transport: Any, closing: bool = False) -> None:
    """Close ``transport`` (``close(timeout=transport.exit_timeout_s, drain=False)``) at interpreter
    exit unless it was closed before; ``closing``: it is being closed now, stop tracking it."""
    if closing:
        _live.discard(transport)
    else:
        _live.add(transport)


class MessageBook:
    """Base of the transports that serve one pipeline stage and record its messages.

    One stage per pipeline rank: ``stage`` is this rank's index in ``group`` and the pipeline has
    ``num_stages`` ranks; link ``i`` joins stages ``i`` and ``i+1``. Times are ms since ``epoch`` (a
    ``time.monotonic()`` value, the same instant on every rank: :func:`~titan_morph.comm.clock.sync_clock`).
    Records are kept (the newest ``max_records``) when ``record`` is true; the runtime takes them
    after every step.
    """

    path = ""
    name = ""
    exit_timeout_s = 1.0  # bound of the close at interpreter exit (see ``_close_at_exit``)

    def __init__(
        self,
        *,
        stage: int,
        num_stages: int,
        group: dist.ProcessGroup | None,
        epoch: float,
        record: bool = True,
        max_records: int = 200_000,
    ) -> None:
        kind = type(self).__name__
        if num_stages < 2:
            raise ValueError(f"{kind} needs num_stages >= 2 (a pipeline link), got {num_stages}")
        if not 0 <= stage < num_stages:
            raise ValueError(f"{kind}: stage must be in 0..{num_stages - 1}, got {stage}")
        if max_records < 1:
            raise ValueError(f"{kind}: max_records must be >= 1, got {max_records}")
        if not dist.is_initialized():
            raise RuntimeError(f"{kind} needs torch.distributed to be initialized")
        pipeline = group if group is not None else dist.group.WORLD
        assert pipeline is not None  # torch.distributed is initialized (checked above)
        self.group = pipeline
        rank, size = dist.get_rank(self.group), dist.get_world_size(self.group)
        if size != num_stages or rank != stage:
            raise ValueError(
                f"{kind} expects one stage per pipeline rank: group rank {rank} of {size}, "
                f"got stage={stage} num_stages={num_stages}"
            )
        self.stage, self.num_stages, self.epoch = stage, num_stages, float(epoch)
        self.rank = dist.get_rank()
        self.record = record
        self.step = 0
        self._group_name = self.group.group_name
        self._lock = threading.Lock()
        self._records: deque[MessageRecord] = deque(maxlen=max_records)
        self._send_seq: dict[tuple[int, str], int] = {}
        self._recv_seq: dict[tuple[int, str], int] = {}

    def where(self) -> str:
        """``stage S (rank R)``: how errors name this end of a link."""
        return f"stage {self.stage} (rank {self.rank})"

    def now_ms(self) -> float:
        """Milliseconds since the pipeline's epoch."""
        return (time.monotonic() - self.epoch) * 1e3

    def set_step(self, step: int) -> None:
        """Current training step (stamped on records, read by step-keyed traces); call before each step."""
        self.step = int(step)

    def _mine(self, op: dist.P2POp) -> bool:
        """Whether ``op`` travels on this pipeline's group (other groups' ops pass through)."""
        return op.group.group_name == self._group_name

    def _partition(
        self, ops: list[dist.P2POp], passthrough: Callable[[list[dist.P2POp], str | None], list[Any]], desc: str | None
    ) -> tuple[list[dist.P2POp], list[Any]]:
        """This pipeline's ops, and the handles of the others, issued at once through ``passthrough``."""
        mine = [op for op in ops if self._mine(op)]
        others = [op for op in ops if not self._mine(op)]
        return mine, (passthrough(others, desc) if others else [])

    def _close_at_exit(self, closing: bool = False) -> None:
        """Track this transport for the close at interpreter exit (``closing``: stop tracking)."""
        close_at_exit(self, closing)

    def restart_numbering(self, link: int) -> None:
        """Number the messages of ``link`` from 0 again (both ends, between steps: a path the link
        comes back to after a failure, whose counts no longer match)."""
        with self._lock:
            for table in (self._send_seq, self._recv_seq):
                for d in ("fwd", "bwd"):
                    table.pop((link, d), None)

    def _next(self, table: dict[tuple[int, str], int], link: int, direction: str) -> int:
        seq = table.get((link, direction), 0)
        table[(link, direction)] = seq + 1
        return seq

    def _new_record(
        self, side: str, link: int, direction: str, seq: int, ops: list[dist.P2POp], *, keep: bool = True
    ) -> MessageRecord:
        """A record of one message; kept at once, or (``keep=False``) only once :meth:`_keep` is called
        (a send that may still fail before it is handed over)."""
        peer = link + 1 if (side == "send") == (direction == "fwd") else link
        rec = MessageRecord(side, link, direction, seq, op_nbytes(ops), self.step, peer, self.now_ms(), path=self.path)
        if keep:
            self._keep(rec)
        return rec

    def _keep(self, rec: MessageRecord) -> None:
        if self.record:
            self._records.append(rec)

    def records(self) -> list[MessageRecord]:
        """Snapshot of all message records so far (copies; both sides of this rank)."""
        with self._lock:
            return [dataclasses.replace(r) for r in self._records]

    def take_records(self) -> list[MessageRecord]:
        """Records so far, then forget them (per-step metrics without unbounded growth).

        A message still in flight is returned now and updated no further in this list."""
        with self._lock:
            out = list(self._records)
            self._records.clear()
        return out
