"""Congestion that comes and goes: a schedule applied to a lab while a job runs.

The schedule is a CSV file ``time_s,from,to,nic,rate_mbit`` (a header line and ``#`` comments are
allowed). ``rate_mbit`` is a limit in Mbit/s for traffic ``from`` -> ``to`` on ``nic`` (0 removes
it), or the word ``break`` or ``heal`` for the path between the two nodes, both directions.
``time_s`` is seconds after the start, or ``step=N``: when the job begins training step ``N``
(its step ``N - 1`` logged its loss), so an event meets the same training moment on a fast or a
slow machine::

    time_s,from,to,nic,rate_mbit
    5,0,1,data,100
    15,0,1,data,0
    step=3,1,2,data,break
    30,1,2,data,heal

:class:`Controller` applies the rows at their times (seconds after :meth:`Controller.start`, or
the job's step read by ``progress``, e.g. :class:`StepLog` on the log of the rank that logs the
loss) from a thread, in the file's time order for each kind, logging each as it happens.
"""

from __future__ import annotations

import csv
import io
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from titan_morph.netlab.lab import NICS, Lab, LabError
from titan_morph.netlab.shape import break_path, heal, shape

__all__ = [
    "Controller",
    "Event",
    "StepLog",
    "apply",
    "check_events",
    "node_index",
    "parse_schedule",
    "read_schedule",
]

ACTIONS = ("break", "heal")
STEP_PREFIX = "step="
LOSS_LINE = re.compile(rb"step:\s*(\d+)\s+loss:")  # TorchTitan's metrics line of a finished step
POLL_S = 0.1


@dataclass(frozen=True)
class Event:
    """One row: at ``time_s`` (or, when ``step`` > 0, when the job begins that step), set ``src`` ->
    ``dst`` on ``nic`` to ``rate_mbit`` (None with an action)."""

    time_s: float
    src: int
    dst: int
    nic: str
    rate_mbit: float | None = None
    action: str = ""
    step: int = 0

    def __str__(self) -> str:
        when = f"step {self.step}" if self.step else f"t={self.time_s:g}s"
        if self.action:
            return f"{when} {self.action} {self.src}<->{self.dst} on {self.nic}"
        what = f"{self.rate_mbit:g} mbit" if self.rate_mbit else "unshaped"
        return f"{when} {self.src}->{self.dst} on {self.nic}: {what}"


def node_index(text: str) -> int:
    """A node named ``3`` or ``n3``."""
    t = text.strip().removeprefix("n")
    if not t.isdigit():
        raise LabError(f"node {text!r}: a node number (0, 1, ...) or n0, n1, ...")
    return int(t)


def parse_schedule(text: str, where: str = "schedule") -> list[Event]:
    """The events of a schedule's text, by time; a bad row is one :class:`LabError` naming its line."""
    events = []
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), 1):
        cells = [c.strip() for c in row]
        if not cells or not cells[0] or cells[0].startswith("#") or (lineno == 1 and cells[0] == "time_s"):
            continue
        try:
            if len(cells) != 5:
                raise ValueError("expected 5 fields: time_s,from,to,nic,rate_mbit")
            t, src, dst, nic, rate = cells
            if nic not in NICS:
                raise ValueError(f"nic {nic!r}: one of {', '.join(NICS)}")
            step = 0
            if t.startswith(STEP_PREFIX):
                step = int(t[len(STEP_PREFIX) :]) if t[len(STEP_PREFIX) :].isdigit() else 0
                if step < 1:
                    raise ValueError(f"time_s {t!r}: step=N with a training step N >= 1")
                t = "0"
            if float(t) < 0:
                raise ValueError("time_s must be >= 0 seconds or step=N")
            if rate in ACTIONS:
                events.append(Event(float(t), node_index(src), node_index(dst), nic, action=rate, step=step))
            elif float(rate) >= 0:
                events.append(Event(float(t), node_index(src), node_index(dst), nic, float(rate), step=step))
            else:
                raise ValueError("rate_mbit must be >= 0, 'break' or 'heal'")
        except (ValueError, LabError) as err:
            raise LabError(f"{where}:{lineno}: {err}") from None
    return sorted(events, key=lambda e: (e.step, e.time_s))


def read_schedule(path: str | Path) -> list[Event]:
    try:
        return parse_schedule(Path(path).read_text(), str(path))
    except OSError as err:
        raise LabError(f"schedule {path}: {err.strerror}") from None


def check_events(lab: Lab, events: list[Event], progress: bool = True) -> None:
    """Every event names two different nodes of ``lab``, and step-keyed ones have a job to follow
    (``progress``), before anything runs."""
    for e in events:
        if e.step and not progress:
            raise LabError(f"schedule: {e}: a step-keyed row needs a job to follow (netlab run --schedule)")
        lab.check_node(e.src)
        lab.check_node(e.dst)
        if e.src == e.dst:
            raise LabError(f"schedule: {e}: a path joins two different nodes")


def apply(lab: Lab, event: Event) -> None:
    if event.action == "break":
        break_path(lab, event.src, event.dst, event.nic)
    elif event.action == "heal":
        heal(lab, event.src, event.dst, event.nic)
    else:
        shape(lab, event.src, event.dst, event.nic, event.rate_mbit or 0.0)


class StepLog:
    """The job's progress read from a log that carries TorchTitan's loss lines (``step: N loss: ...``,
    the rank that logs the loss): the step the job is in, one more than the last step logged."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset, self._done, self._rest = 0, 0, b""

    def __call__(self) -> int:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return self._done + 1  # not written yet
        self._offset += len(chunk)
        lines = (self._rest + chunk).split(b"\n")
        self._rest = lines.pop()  # a line still being written
        for line in lines:
            m = LOSS_LINE.search(line)
            if m:
                self._done = max(self._done, int(m.group(1)))
        return self._done + 1


class Controller:
    """Applies ``events`` to ``lab`` at their times (seconds since :meth:`start`, or the step
    ``progress()`` reports) from a daemon thread; :meth:`stop` ends it at once."""

    def __init__(
        self, lab: Lab, events: list[Event], log: TextIO | None = None, progress: Callable[[], int] | None = None
    ) -> None:
        check_events(lab, events, progress is not None)
        self.lab, self.events, self.progress = lab, events, progress
        self.log = log if log is not None else sys.stderr
        self.applied: list[Event] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="netlab-schedule", daemon=True)

    def start(self) -> Controller:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def _due(self, event: Event) -> bool:
        if event.step:
            return self.progress is not None and self.progress() >= event.step
        return time.monotonic() >= self._start + event.time_s

    def _run(self) -> None:
        pending = list(self.events)
        while pending:
            due = [e for e in pending if self._due(e)]
            for event in due:
                pending.remove(event)
                try:
                    apply(self.lab, event)
                    self.applied.append(event)
                    print(f"netlab: schedule: {event}", file=self.log, flush=True)
                except LabError as err:
                    print(f"netlab: schedule: {event}: failed: {err}", file=self.log, flush=True)
            if pending and self._stop.wait(POLL_S if not due else 0.0):
                return

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the last event; whether it has been applied."""
        self._thread.join(timeout_s)
        return self.done()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
