"""When a send's payload was ready on the sender's device (paper §6.1: per-link delays).

On a GPU the host issues a send long before its payload exists: the producing kernels may still be
queued, and the send's own kernel starts only once they ran. Timing a link from the host's call
would read a busy sender queue as a slow link. So a send issued from CUDA tensors marks its
payload's readiness with an event on the issuing stream (the send is ordered after it), and one
thread per transport stamps the host time at which each such event completed, polling ``query()``
(never synchronising). :class:`~titan_morph.comm.records.MessageRecord` ``ready`` carries the stamp,
and a delay runs from ``max(accepted, ready)``.

A stamp is late by at most the polling interval plus the time the thread waits for the GIL
(``sys.getswitchinterval()``, 5 ms, while another thread runs pure Python): it errs towards a
later readiness, so a delay is never inflated by it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Protocol

from titan_morph.comm.machine.devices import StreamMarks, bind_device

__all__ = ["DeviceStamps", "ReadyStamp"]

POLL_S = 100e-6


class Event(Protocol):
    def record(self, stream: Any = None) -> None: ...

    def query(self) -> bool: ...


class ReadyStamp:
    """One marked point of the device queue; ``t_s``: when it was seen complete (``time.monotonic()``)."""

    __slots__ = ("event", "t_s")

    def __init__(self, event: Event) -> None:
        self.event: Event = event
        self.t_s: float | None = None


class DeviceStamps:
    """Marks points of the issuing stream and stamps when the device passed each (see the module
    docstring). ``marks`` defaults to torch's CUDA events on ``device`` (tests pass fakes)."""

    def __init__(self, device: Any = None, *, marks: StreamMarks[Event] | None = None, poll_s: float = POLL_S) -> None:
        marks = marks or StreamMarks.cuda(device)
        self.device = device
        self._new_event, self._stream, self._now, self.poll_s = marks.new_event, marks.stream, marks.now, poll_s
        self._pending: deque[ReadyStamp] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def mark(self) -> ReadyStamp:
        """A point of the current stream, after everything queued on it so far."""
        event = self._new_event()
        event.record(self._stream())
        stamp = ReadyStamp(event)
        with self._cond:
            if self._closed:
                return stamp
            self._pending.append(stamp)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="titan_morph-ready-stamps", daemon=True)
                self._thread.start()
            self._cond.notify()
        return stamp

    def poll(self) -> int:
        """Stamp the marks the device has passed, oldest first (one stream: in order); how many."""
        done = 0
        while True:
            with self._cond:
                if not self._pending or not self._pending[0].event.query():
                    return done
                stamp = self._pending.popleft()
            stamp.t_s = self._now()
            done += 1

    def _run(self) -> None:
        bind_device(self.device)
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
            if self.poll() == 0:
                time.sleep(self.poll_s)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(1.0)
