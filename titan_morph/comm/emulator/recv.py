"""The receive side of the link emulator (:mod:`titan_morph.comm.emulator.transport`): posted receives and
the per-(link, direction) watcher threads that take them in posting order.

A watcher waits for the sender's commit notice of each receive (in ``poll_s`` slices that re-check
the link model for a down link and the transport for ``close``), then for the data unless the
consumer is already waiting for it, so ``MessageRecord.arrived`` is the true arrival.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Protocol

import torch
import torch.distributed as dist

from titan_morph.comm.emulator.notices import NoticeBoard
from titan_morph.comm.machine.devices import bind_device
from titan_morph.comm.records import CommTimeoutError, MessageRecord
from titan_morph.comm.transport import Handle
from titan_morph.pipelining.core.links import LinkDownError, LinkModel

__all__ = ["Receiver", "RecvHandle", "RecvWatcher"]


class Receiver(Protocol):
    """What the receive side needs of its emulator."""

    epoch: float
    step: int
    poll_s: float
    down_grace_s: float
    notices: NoticeBoard
    device: torch.device | None
    """The rank's CUDA device when the bytes move on NCCL (the watcher waits there), else None."""

    @property
    def links(self) -> LinkModel: ...

    @property
    def closed(self) -> bool: ...

    @property
    def timeout_s(self) -> float: ...

    def now_ms(self) -> float: ...

    def where(self) -> str: ...


class RecvHandle:
    """A posted receive. Its link's watcher waits for the sender's notice (``_await_notice``); the
    data is then waited, and ``arrived`` stamped, by the consumer if it was already waiting (one
    thread wake at arrival, as without a watcher) or else by the watcher (``_take_data``). ``wait``
    raises LinkDownError/RuntimeError from either, or CommTimeoutError, instead of hanging."""

    def __init__(
        self, owner: Receiver, ops: list[dist.P2POp], handles: list[Handle], key: str, record: MessageRecord
    ) -> None:
        self.owner, self.ops, self.handles, self.key, self.record = owner, ops, handles, key, record
        self._done = False
        # When the link model delivers the message (time.monotonic() s), known once the sender's
        # notice is read: a device clock (titan_morph.runtime.testbed) starts the consuming op then.
        self.due_s: float | None = None
        self.settled = threading.Event()  # set by the watcher: notice handled (data too unless ``_by_consumer``)
        self.error: BaseException | None = None
        self.wait_started: float | None = None  # first consumer wait (monotonic s): down-link grace
        self._lock = threading.Lock()
        self._by_consumer = False  # the consumer was waiting when the notice came: it takes the data
        self._refused = False  # the notice says the sender refused it (a placeholder travels)

    def wait(self, timeout: float | None = None) -> bool:
        if self._done:
            return True
        owner, rec = self.owner, self.record
        bound = owner.timeout_s if timeout is None else timeout
        deadline = time.monotonic() + bound
        with self._lock:
            if self.wait_started is None:
                self.wait_started = time.monotonic()
                rec.waited = owner.now_ms()
        if not self.settled.wait(max(0.0, bound)):
            rec.status = "error"
            raise CommTimeoutError(
                f"{owner.where()}: receive of message {rec.seq} on link {rec.link} ({rec.direction}) from stage "
                f"{rec.peer_stage} did not arrive within {bound:.3g} s (posted at {rec.issued:.1f} ms, "
                f"step {rec.step}; no notice from the sender)"
            )
        if self.error is None and self._by_consumer and rec.arrived is None:
            try:
                self._take_data(max(0.0, deadline - time.monotonic()))
            except BaseException as e:
                self.error = e
        if rec.arrived is not None and rec.completed is None:
            rec.completed = owner.now_ms()
        if self.error is not None:
            raise self.error
        self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done

    def _await_notice(self) -> None:
        """Run by the link's watcher: wait for the sender's notice (in ``poll_s`` slices; gives up on
        ``close``, or once the consumer has waited ``down_grace_s`` on a link the model says is
        down); then wait for the data (certain to come) unless the consumer is waiting already."""
        owner, rec = self.owner, self.record
        down_since: float | None = None
        while True:
            if owner.closed:
                raise RuntimeError(
                    f"EmulatedTransport closed before message {rec.seq} on link {rec.link} ({rec.direction}) "
                    f"arrived from stage {rec.peer_stage}"
                )
            value = owner.notices.wait(rec.link, rec.direction, self.key, owner.poll_s)
            if value is not None:
                break
            if math.isinf(owner.links.delay_ms(rec.link, rec.direction, owner.now_ms(), owner.step)):
                down_since = time.monotonic() if down_since is None else down_since
                waiting = self.wait_started
                if waiting is not None and time.monotonic() - max(down_since, waiting) >= owner.down_grace_s:
                    rec.status = "down"
                    raise LinkDownError(
                        rec.link, rec.direction, f": nothing arrived from stage {rec.peer_stage} (message {rec.seq})"
                    )
            else:
                down_since = None
        rec.notified = owner.now_ms()
        status, sent, *planned = value.split(":")
        sent_bytes = int(sent)
        if planned:  # the link model's delivery time, set by the sender
            rec.planned = float(planned[0])
            self.due_s = owner.epoch + rec.planned / 1e3
        if sent_bytes != rec.nbytes:
            rec.status = "error"
            raise RuntimeError(
                f"link {rec.link} ({rec.direction}) message {rec.seq}: stage {rec.peer_stage} sent {sent_bytes} bytes "
                f"but this stage posted {rec.nbytes}; both sides must group ops into messages identically"
            )
        self._refused = status == "down"
        with self._lock:
            self._by_consumer = self.wait_started is not None
        if not self._by_consumer:
            self._take_data(owner.timeout_s)

    def _take_data(self, timeout_s: float) -> None:
        """Block on the inner receive (its notice was seen: the data comes at ≈ the delivery time)."""
        owner, rec = self.owner, self.record
        deadline = time.monotonic() + timeout_s
        for h in self.handles:
            h.wait(max(0.0, deadline - time.monotonic()))
        rec.arrived = owner.now_ms()
        if self._refused:  # the sender refused it; its placeholder kept the wire in step
            rec.status = "down"
            raise LinkDownError(rec.link, rec.direction, f": stage {rec.peer_stage} could not send message {rec.seq}")
        rec.status = "done"


class RecvWatcher(threading.Thread):
    """Handles one (link, direction)'s posted receives in posting order as their notices and data
    arrive, whatever the consumer is doing, so ``MessageRecord.arrived`` is the true arrival."""

    def __init__(self, owner: Receiver, link: int, direction: str) -> None:
        super().__init__(name=f"titan_morph-recv-link{link}-{direction}", daemon=True)
        self.owner = owner
        self.pending: deque[RecvHandle] = deque()
        self.cond = threading.Condition()

    def put(self, handle: RecvHandle) -> None:
        with self.cond:
            self.pending.append(handle)
            self.cond.notify()

    def stop(self) -> None:
        """Wake an idle watcher after ``owner.closed`` was set (a busy one sees it within ``poll_s``)."""
        with self.cond:
            self.cond.notify()

    def run(self) -> None:
        bind_device(self.owner.device)
        owner = self.owner
        while True:
            with self.cond:
                while not self.pending and not owner.closed:
                    self.cond.wait()
                if not self.pending:
                    return
                handle = self.pending.popleft()
            try:
                handle._await_notice()
            except BaseException as e:  # re-raised by the consumer's wait()
                handle.error = e
            handle.settled.set()
