"""The data path of the delegated transport: messages into and out of the delegates' shared-memory rings.

A send takes the next slot of its delegate's ring for its size (waiting, bounded, while every slot
is still in flight), copies the payload in and raises FILLED; a receive waits (bounded) for the
delegate's arrival report and copies the slot out, then releases it (CONSUMED). On CUDA the copies
run on streams and a slot is released once its copy's event completed (:class:`DeferredReleases`).
Which delegate carries a message and when it goes on the wire is the transport's business.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from titan_morph.comm.delegate import worker as wire
from titan_morph.comm.delegate.pool import DelegateEnd, DelegateError, DelegatePool
from titan_morph.comm.delegate.shm import CONSUMED, FILLED, FREED, NBYTES, READY, Segment, layout, pack, unpack
from titan_morph.comm.records import CommTimeoutError, MessageRecord
from titan_morph.comm.waits import poll_until

__all__ = ["Completion", "DeferredReleases", "Placed", "RecvHandle", "SendHandle", "SlotPath"]


def _locate(error: BaseException, where: str) -> None:
    """Prefix ``error``'s message with ``where`` (rank, link, message, slot) before it is re-raised
    as it is: its type is kept, so a caller still catches what torch raised (a meta tensor's
    ``NotImplementedError``, a ``torch.OutOfMemoryError``), and its traceback still ends in torch."""
    error.args = (f"{where}: {error.args[0]}" if error.args else where, *error.args[1:])


class Completion(Protocol):
    """A device event as the releases poll it (``torch.cuda.Event``)."""

    def query(self) -> bool: ...


class DeferredReleases:
    """Receive slots whose host→device copy is still queued on the device, in issue order.

    Each entry is released (its ``release`` callback run, which writes CONSUMED) once its event has
    completed. :meth:`poll` only queries events (``event.query()``), so nothing here ever blocks
    the host on the device queue; it is called by the reader thread and by every later call.
    """

    def __init__(self) -> None:
        self._items: deque[tuple[Completion, Callable[[], None]]] = deque()
        self._lock = threading.Lock()

    def add(self, event: Completion, release: Callable[[], None]) -> None:
        with self._lock:
            self._items.append((event, release))

    def pending(self) -> int:
        return len(self._items)

    def poll(self) -> int:
        """Release every slot whose copy has completed, oldest first; returns how many."""
        done = 0
        with self._lock:
            while self._items and self._items[0][0].query():
                _, release = self._items.popleft()
                release()
                done += 1
        return done


class Clock(Protocol):
    """What the data path needs of its transport: the common clock, the current bound, its name."""

    epoch: float

    @property
    def timeout_s(self) -> float: ...

    def now_ms(self) -> float: ...

    def where(self) -> str: ...


@dataclass(frozen=True)
class Placed:
    """Where a send's payload now is, and when its copy began and ended waiting for a free slot."""

    seg_id: int
    slot: int
    nbytes: int
    event: torch.cuda.Event | None
    t0: float
    t1: float


class SendHandle:
    """A send is complete once its bytes are in shared memory (CUDA: once the side-stream copy ran)."""

    due_s = None

    def __init__(self, ops: list[dist.P2POp], record: MessageRecord, event: torch.cuda.Event | None = None) -> None:
        self.ops, self.record, self.event = ops, record, event

    def wait(self, timeout: float | None = None) -> bool:
        if self.event is not None:  # CUDA: the compute stream must not reuse the source too early
            torch.cuda.current_stream().wait_event(self.event)
        return True

    def is_completed(self) -> bool:
        return self.event is None or bool(self.event.query())  # type: ignore[no-untyped-call]  # untyped in torch


class RecvHandle:
    """Waits (bounded) for the delegate's READY and copies the slot into the receive buffers."""

    due_s = None  # the delegate delivers on its own clock: the arrival is stamped, not predicted

    def __init__(
        self, path: SlotPath, ops: list[dist.P2POp], dg: DelegateEnd, local: int, record: MessageRecord
    ) -> None:
        self.path, self.ops, self.dg, self.local, self.record = path, ops, dg, local, record
        self._done = False
        self._lock = threading.Lock()  # one taker: the consumer, or a failover settling the message

    def wait(self, timeout: float | None = None) -> bool:
        with self._lock:
            if not self._done:
                self.path.take(self.dg, self.local, self.ops, self.record, timeout)
                self._done = True
            return True

    def is_completed(self) -> bool:
        return self._done


class SlotPath:
    """The shared-memory rings of one pool's delegates, as the training thread uses them."""

    def __init__(self, clock: Clock, pool: DelegatePool, slots: int, device: torch.device | None) -> None:
        self.clock, self.pool, self.slots, self.device = clock, pool, slots, device
        self.releases = DeferredReleases()
        self._cuda_stream: torch.cuda.Stream | None = None
        self._copies: deque[Completion] = deque()  # send side: device→host copies into slots, in issue order

    def prepare_segment(self, seg: Segment) -> None:
        """Fault a new segment's pages in and, for a CUDA device, page-lock it: once, when it is made."""
        seg.touch()
        if self.device is not None and self.device.type == "cuda":
            seg.pin()

    def _segment_for(self, dg: DelegateEnd, nbytes: int) -> int:
        seg_id = dg.by_size.get(nbytes)
        if seg_id is None:
            where = f"{self.clock.where()}: {dg.describe()}"
            seg = Segment(f"{dg.prefix}t{len(dg.by_size)}", nbytes, self.slots, create=True, where=where)
            self.prepare_segment(seg)
            seg_id = dg.by_size[nbytes] = len(dg.by_size)
            dg.segments[seg_id], dg.cursor[seg_id] = seg, 0
            dg.command(wire.NEWSEG, seg_id, nbytes, self.slots)
        return seg_id

    # -- send -----------------------------------------------------------------------------------
    def put(self, dg: DelegateEnd, local: int, ops: list[dist.P2POp], rec: MessageRecord) -> Placed:
        """Copy the payload of ``ops`` into the next slot of ``dg`` as its local message ``local``.

        The slot's state (cursor, ownership) is committed only once the payload is in: a put that
        raises leaves it as it was."""
        tensors = [op.tensor for op in ops]
        offsets, total = layout(tensors)
        seg_id = self._segment_for(dg, total)
        seg = dg.segments[seg_id]
        slot = dg.cursor[seg_id] % self.slots
        t0 = t1 = time.monotonic()
        # free once the delegate freed the slot's last message (host-side count: on CUDA the FILLED
        # word is written later, by the side stream)
        if seg.flag(slot, FREED) != seg.issued[slot]:  # back-pressure: every slot still in flight
            self._wait_free(dg, seg, slot, rec)
            t1 = time.monotonic()
        seg.set_flag(slot, NBYTES, total)
        event = None
        if any(t.is_cuda for t in tensors):
            try:
                event = self._cuda_pack(seg, slot, tensors, offsets, local + 1)  # FILLED: stream-ordered, last
            except RuntimeError as e:  # torch's CUDA errors say neither rank nor link
                _locate(
                    e,
                    f"{self.clock.where()}: {dg.describe()}: device→host copy of message {rec.seq} into slot {slot} of "
                    f"{seg.name} failed",
                )
                raise
            self._track_copy(event)
        else:
            pack(seg.slot(slot), tensors, offsets)
        dg.cursor[seg_id] += 1
        seg.issued[slot] = local + 1
        if event is None:
            seg.set_flag(slot, FILLED, local + 1)
        return Placed(seg_id, slot, total, event, t0, t1)

    def _wait_free(self, dg: DelegateEnd, seg: Segment, slot: int, rec: MessageRecord) -> None:
        bound = self.clock.timeout_s
        deadline = time.monotonic() + bound
        delay = 50e-6
        while seg.flag(slot, FREED) != seg.issued[slot]:
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"{self.clock.where()}: send of message {rec.seq} on link {rec.link} ({rec.direction}) to "
                    f"stage {rec.peer_stage}: no free shared-memory slot within {bound:.3g} s "
                    f"({self.slots} slots of {dg.describe()} in flight)"
                )
            self.pool.check(dg)
            time.sleep(delay)
            delay = min(2 * delay, 1e-3)

    # -- receive ----------------------------------------------------------------------------------
    def take(
        self, dg: DelegateEnd, local: int, ops: list[dist.P2POp], rec: MessageRecord, timeout: float | None
    ) -> None:
        """Wait (bounded) for local message ``local`` of ``dg`` and copy it into the tensors of ``ops``."""
        clock = self.clock
        if rec.waited is None:
            rec.waited = clock.now_ms()
        bound = clock.timeout_s if timeout is None else timeout
        seg_id, slot, nbytes, t = self._await_arrival(dg, local, bound, rec)
        # the receive delegate's clock: CLOCK_MONOTONIC is shared by the processes of one host
        rec.arrived = (t - clock.epoch) * 1e3
        tensors = [op.tensor for op in ops]
        offsets, total = layout(tensors)
        seg = dg.segments[seg_id]
        if nbytes != total:
            rec.status = "error"
            raise RuntimeError(
                f"link {rec.link} ({rec.direction}) message {rec.seq}: stage {rec.peer_stage} sent {nbytes} bytes but "
                f"this stage posted {total} (tensors {[tuple(t.shape) for t in tensors]}); both sides must group "
                "ops into messages identically"
            )
        if seg.flag(slot, READY) != local + 1:
            raise DelegateError(f"{dg.describe()}: slot {slot} of {seg.name} is not READY for message {rec.seq}")
        value = local + 1
        if any(t.is_cuda for t in tensors):
            try:
                self._cuda_unpack(seg, slot, tensors, offsets, value)
            except RuntimeError as e:  # torch's CUDA errors say neither rank nor link
                rec.status = "error"
                _locate(
                    e,
                    f"{clock.where()}: {dg.describe()}: host→device copy of message {rec.seq} from slot {slot} of "
                    f"{seg.name} failed",
                )
                raise
        else:
            unpack(seg.slot(slot), tensors, offsets)
            seg.set_flag(slot, CONSUMED, value)
        rec.completed = clock.now_ms()
        rec.status = "done"

    def _await_arrival(
        self, dg: DelegateEnd, local: int, bound: float, rec: MessageRecord
    ) -> tuple[int, int, int, float]:
        deadline = time.monotonic() + bound
        cond = self.pool.cond
        with cond:
            while local not in dg.arrived:
                self.pool.check(dg)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    rec.status = "error"
                    raise CommTimeoutError(
                        f"{self.clock.where()}: receive of message {rec.seq} on link {rec.link} ({rec.direction}) "
                        f"from stage {rec.peer_stage} did not arrive within {bound:.3g} s "
                        f"(posted at {rec.issued:.1f} ms, step {rec.step}, via {dg.describe()})"
                    )
                cond.wait(min(remaining, 0.5))
            return dg.arrived.pop(local)

    # -- in-flight device copies -------------------------------------------------------------------
    def _track_copy(self, event: Completion) -> None:
        """Keep the send copy's event until it completed (pruned from the oldest on every send)."""
        copies = self._copies
        while copies and copies[0].query():
            copies.popleft()
        copies.append(event)

    def copies_pending(self) -> int:
        """Device copies into or out of the slots not yet known complete (send and receive side)."""
        while self._copies and self._copies[0].query():
            self._copies.popleft()
        return len(self._copies) + self.releases.pending()

    def drain(self, bound_s: float) -> bool:
        """Wait (polling, at most ``bound_s``) until no device copy still reads or writes a slot, so
        the segments can be unmapped; False when some did not complete in time."""

        def drained() -> bool:
            self.releases.poll()  # a receive slot's copy that completed is released on the way
            return self.copies_pending() == 0

        return poll_until(drained, time.monotonic() + bound_s)

    # -- CUDA -----------------------------------------------------------------------------------
    def _cuda_pack(
        self, seg: Segment, slot: int, tensors: list[torch.Tensor], offsets: list[int], flag: int
    ) -> torch.cuda.Event:
        """CUDA tensors device→host into the pinned slot on a side stream, CPU tensors by the host, then
        the stream-ordered FILLED write (enqueued last: nothing can fail after the delegate may see it)."""
        device = next(t.device for t in tensors if t.is_cuda)
        seg.pin()
        if self._cuda_stream is None:
            self._cuda_stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]  # untyped in torch
        stream = self._cuda_stream
        stream.wait_stream(torch.cuda.current_stream(device))
        view = seg.slot(slot)
        with torch.cuda.stream(stream), torch.no_grad():
            for t, off in zip(tensors, offsets):
                if t.numel():
                    n = t.numel() * t.element_size()
                    dst = view[off : off + n].view(t.dtype).view(t.shape)
                    dst.copy_(t, non_blocking=t.is_cuda)
                    if t.is_cuda:  # the caller's allocator must not reuse it before the copy ran
                        t.record_stream(stream)
            value = torch.full((1,), flag, dtype=torch.int64, device=device)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # untyped in torch
            seg.flag_view(slot, FILLED).copy_(value, non_blocking=True)  # lands after the data (same stream)
            event.record(stream)
        return event

    def _cuda_unpack(
        self, seg: Segment, slot: int, tensors: list[torch.Tensor], offsets: list[int], value: int
    ) -> None:
        """Host→device from the pinned slot on the current stream; the slot is released (CONSUMED) once
        that copy's event has completed, found by polling: the host never waits for the device."""
        seg.pin()
        unpack(seg.slot(slot), tensors, offsets, non_blocking=True)
        device = next(t.device for t in tensors if t.is_cuda)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # untyped in torch
        event.record(torch.cuda.current_stream(device))
        self.releases.add(event, lambda: seg.set_flag(slot, CONSUMED, value))
