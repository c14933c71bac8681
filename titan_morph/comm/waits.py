"""Waits that never hold the host on the device queue (paper §5.3: the failover must act first).

On NCCL, ``Work.wait()`` without a timeout only orders the current stream after the operation and
returns at once; ``Work.wait(timeout)`` would block the host until the operation completes and,
when the timeout expires, let NCCL abort the communicator itself; and ``is_completed()`` is true
only once the device has run everything queued before the operation. So a bounded wait on NCCL
(:func:`stream_wait`) is stream-ordered: ``work.wait()``, and the operation is handed to the
:class:`DeviceWatch`, one thread that polls ``is_completed()`` of the operations still on the
device, stamps when each completed (:class:`DeviceOp`) and reports one that outlasted its bound
(the ``[comm]`` bound, counted from the wait) to its owner, which tears the link down and raises
its error at the training thread's next call. The host thus runs ahead of the device as with plain
torch, and a stalled link is still found, by a thread that holds nothing.

A stall found after the operation was handed to the device cannot be undone under the work already
queued behind it (a receive's consumer then reads what the receive buffer holds): its owner stops
the step with the link named rather than go on with wrong data (``auto`` re-sends what it can:
:mod:`titan_morph.comm.failover.resend`).

On gloo a receive never reports completion before ``wait`` (it has no progress thread for it), so
gloo works keep their bounded ``wait(timeout)``; :func:`poll_until` remains for the few waits that
must know the outcome on the host (a probe of a new group, draining copies before unmapping).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["DeviceOp", "DeviceWatch", "device_watch", "on_nccl", "poll_until", "stream_wait"]

POLL_FIRST_S = 20e-6
POLL_MAX_S = 1e-3


def poll_until(
    done: Callable[[], bool],
    deadline: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    first_s: float = POLL_FIRST_S,
    max_s: float = POLL_MAX_S,
) -> bool:
    """Poll ``done()`` until it is true (True) or ``clock()`` passes ``deadline`` (False); never sleeps
    past the deadline, and checks once more at it."""
    delay = first_s
    while True:
        if done():
            return True
        now = clock()
        if now >= deadline:
            return bool(done())
        sleep(min(delay, deadline - now))
        delay = min(2 * delay, max_s)


def on_nccl(group: Any) -> bool:
    """Whether ``group``'s (None: the default group's) point-to-point traffic runs on NCCL, whose
    works report completion without ``wait`` and whose bounded ``wait`` blocks the host."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available() or not dist.is_initialized():
        return False
    if group is None:  # a P2POp without a group runs on the default one
        group = dist.group.WORLD
    try:
        return "nccl" in str(dist.get_backend(group)).lower()
    except (RuntimeError, ValueError):
        return False


class Completable(Protocol):
    """What the watch needs of a ``dist.Work``."""

    def is_completed(self) -> bool: ...

    def wait(self) -> Any: ...


class DeviceOp:
    """One operation handed to the device: ``landed_at`` (``time.monotonic()``) once it completed
    there, ``stalled_s`` once it outlasted its bound first. ``landed()``: True, False (stalled), or
    None (still queued)."""

    def __init__(self, work: Completable) -> None:
        self.work = work
        self.landed_at: float | None = None
        self.stalled_s: float | None = None
        self._stamps: list[Callable[[float], None]] = []
        self._lock = threading.Lock()

    def landed(self) -> bool | None:
        if self.stalled_s is not None:
            return False
        return True if self.landed_at is not None else None

    def when_landed(self, stamp: Callable[[float], None]) -> None:
        """Call ``stamp(landed_at)`` once the op completed on the device (at once when it has)."""
        with self._lock:
            if self.landed_at is None:
                self._stamps.append(stamp)
                return
        stamp(self.landed_at)

    def _land(self, t: float) -> None:
        with self._lock:
            self.landed_at, stamps, self._stamps = t, self._stamps, []
        for stamp in stamps:
            stamp(t)


class DeviceWatch:
    """Polls the operations on the device (see the module docstring): each :meth:`watch` entry until
    ``is_completed()`` (it lands) or its bound passes (``stalled(waited_s)`` runs, once, on the
    watch's thread, which therefore must not block long). :meth:`poll` is one round (the thread's,
    or a test's with ``thread=False``)."""

    def __init__(
        self, *, thread: bool = True, clock: Callable[[], float] = time.monotonic, poll_s: float = POLL_MAX_S
    ) -> None:
        self.clock, self.poll_s, self._thread_wanted = clock, poll_s, thread
        self._entries: list[tuple[DeviceOp, float, float, Callable[[float], None]]] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, op: DeviceOp, bound_s: float, stalled: Callable[[float], None]) -> None:
        """Watch ``op`` from now for at most ``bound_s`` seconds."""
        now = self.clock()
        with self._cond:
            self._entries.append((op, now, now + bound_s, stalled))
            if self._thread_wanted and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="titan_morph-device-watch", daemon=True)
                self._thread.start()
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._entries)

    def poll(self) -> int:
        """One round: land the completed, report the overdue; returns how many are left."""
        with self._cond:
            entries = list(self._entries)
        done: set[int] = set()
        for op, since, deadline, stalled in entries:
            now = self.clock()
            if op.landed_at is not None or op.work.is_completed():
                if op.landed_at is None:
                    op._land(now)
                done.add(id(op))
            elif now >= deadline:
                op.stalled_s = now - since
                done.add(id(op))
                stalled(now - since)
        with self._cond:
            self._entries = [e for e in self._entries if id(e[0]) not in done]
            return len(self._entries)

    def _run(self) -> None:
        delay = POLL_FIRST_S
        while True:
            with self._cond:
                while not self._entries:
                    self._cond.wait()
                    delay = POLL_FIRST_S
            left = self.poll()
            time.sleep(delay if left else 0.0)
            delay = min(2 * delay, self.poll_s)


_watch: DeviceWatch | None = None
_watch_lock = threading.Lock()


def device_watch() -> DeviceWatch:
    """This process's watch (its thread starts with the first operation watched)."""
    global _watch
    with _watch_lock:
        if _watch is None:
            _watch = DeviceWatch()
        return _watch


def stream_wait(
    op: DeviceOp, bound_s: float, stalled: Callable[[float], None], watch: DeviceWatch | None = None
) -> None:
    """The bounded wait of an NCCL operation: ``wait()`` orders the current stream after it (raising an
    error NCCL already knows), and the watch takes it from there (see the module docstring)."""
    op.work.wait()
    (watch or device_watch()).watch(op, bound_s, stalled)
