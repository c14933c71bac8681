"""How long each stage op took on the device: one timing interface, three clocks (paper §6.1).

The monitor's stage times, the plans built from measured times and the Eq. 1 tolerances all rest on
per-op compute times. Host times around a GPU op measure its launch, not its compute (kernels run
asynchronously), so the clock follows the device:

* ``cuda`` (:class:`EventTimer`): a CUDA event pair per op on the stage's stream, never waited on
  while the step runs; at the step's end the host polls the last op's event (``query()``, never a
  device synchronise, bounded by the ``[comm]`` timeout) until the device has run the step, so the
  step's record and the per-step exchange carry its own op times and detection does not lag a
  step. Times map to the host clock through a reference event recorded at the step's start (its
  host time is a lower bound: a busy queue shifts every op of the step alike, durations are exact).
* ``testbed`` (:class:`DeviceClockTimer`): the synthetic testbed's device clock
  (:class:`~titan_morph.runtime.testbed.DeviceClock`), the CPU stand-in for the same events.
* ``host`` (:class:`HostTimer`): ``time.monotonic()`` around the call, right on a CPU where the
  call is the compute.

``morph/op_clock`` in TensorBoard says which one a run used (:data:`CLOCK_CODES`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from titan_morph.comm.machine.devices import StreamMarks
from titan_morph.runtime.testbed import DeviceClock

__all__ = ["CLOCK_CODES", "EventTimer", "HostTimer", "OpSpan", "OpTimer", "DeviceClockTimer", "op_timer"]

CLOCK_CODES = {"host": 0.0, "testbed": 1.0, "cuda": 2.0}
"""``morph/op_clock``: 0 host times, 1 the testbed's device clock, 2 CUDA events."""


@dataclass(frozen=True)
class OpSpan:
    """One op on the device timeline: kind (F, I, W, B), microbatch, stage, start and end as
    ``time.monotonic()`` seconds of this rank."""

    kind: str
    mb: int
    stage: int
    start_s: float
    end_s: float

    @property
    def ms(self) -> float:
        return (self.end_s - self.start_s) * 1e3


class OpTimer(Protocol):
    """Times a stage's ops: ``begin`` before the call, ``end`` after it; ``end`` returns the span
    when it is known at once, else None and :meth:`collect` returns it later, without blocking."""

    clock: str

    def start_step(self) -> None:
        """A step begins (before its first op)."""
        ...

    def begin(self) -> Any: ...

    def end(self, token: Any, kind: str, mb: int, stage: int) -> OpSpan | None: ...

    def collect(self) -> list[OpSpan]:
        """Spans of earlier ``end`` calls that have become known since the last call."""
        ...

    def settle(self, timeout_s: float) -> list[OpSpan]:
        """At a step's end: :meth:`collect` once the device has run every op ended so far, waiting
        at most ``timeout_s`` (what is still queued then comes with a later call)."""
        ...


class HostTimer:
    """``time.monotonic()`` around the call (CPU compute)."""

    clock = "host"

    def start_step(self) -> None:
        pass

    def begin(self) -> float:
        return time.monotonic()

    def end(self, token: float, kind: str, mb: int, stage: int) -> OpSpan:
        return OpSpan(kind, mb, stage, token, time.monotonic())

    def collect(self) -> list[OpSpan]:
        return []

    def settle(self, timeout_s: float) -> list[OpSpan]:
        return []


class DeviceClockTimer:
    """The synthetic testbed's device clock: the padded op's device start and end."""

    clock = "testbed"

    def __init__(self, device_clock: DeviceClock) -> None:
        self.device_clock = device_clock

    def start_step(self) -> None:
        pass

    def begin(self) -> None:
        return None

    def end(self, token: None, kind: str, mb: int, stage: int) -> OpSpan:
        return OpSpan(kind, mb, stage, self.device_clock.last_begin, self.device_clock.device_end)

    def collect(self) -> list[OpSpan]:
        return []

    def settle(self, timeout_s: float) -> list[OpSpan]:
        return []


class Event(Protocol):
    """What the timer needs of ``torch.cuda.Event(enable_timing=True)``."""

    def record(self, stream: Any = None) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end_event: Any) -> float: ...


class EventTimer:
    """CUDA events on the stage's stream (see the module docstring). ``marks`` defaults to torch's
    CUDA events on ``device``; tests pass a fake device clock's."""

    clock = "cuda"

    def __init__(self, device: Any = None, *, marks: StreamMarks[Event] | None = None) -> None:
        marks = marks or StreamMarks.cuda(device, enable_timing=True)
        self._new_event, self._stream, self._now = marks.new_event, marks.stream, marks.now
        self._ref: tuple[Event, float] | None = None
        self._pending: deque[tuple[tuple[Event, float], str, int, int, Event, Event]] = deque()

    def _record(self) -> Event:
        event = self._new_event()
        event.record(self._stream())
        return event

    def start_step(self) -> None:
        self._ref = (self._record(), self._now())

    def begin(self) -> Event:
        if self._ref is None:
            self.start_step()
        return self._record()

    def end(self, token: Event, kind: str, mb: int, stage: int) -> None:
        assert self._ref is not None
        self._pending.append((self._ref, kind, mb, stage, token, self._record()))
        return None

    def pending(self) -> int:
        return len(self._pending)

    def settle(self, timeout_s: float) -> list[OpSpan]:
        deadline = time.monotonic() + timeout_s
        pause = 5e-5
        # the last op's end event completes after every earlier one (one stream): poll it, no synchronise
        while self._pending and not self._pending[-1][5].query() and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)
        return self.collect()

    def collect(self) -> list[OpSpan]:
        out = []
        while self._pending and self._pending[0][5].query():  # in stream order: the oldest ends first
            (ref, ref_s), kind, mb, stage, start, end = self._pending.popleft()
            out.append(
                OpSpan(kind, mb, stage, ref_s + ref.elapsed_time(start) / 1e3, ref_s + ref.elapsed_time(end) / 1e3)
            )
        return out


def op_timer(device_clock: DeviceClock | None, device: Any) -> OpTimer:
    """The clock of a stage's ops: the testbed's when its ops are padded, CUDA events on a GPU,
    else the host's."""
    if device_clock is not None:
        return DeviceClockTimer(device_clock)
    if device is not None and getattr(device, "type", str(device).split(":")[0]) == "cuda":
        return EventTimer(device)
    return HostTimer()
