"""Congestion that comes and goes: a time-keyed schedule applied to a lab while a job runs.

The schedule is a CSV file ``time_s,from,to,nic,rate_mbit`` (a header line and ``#`` comments are
allowed). ``rate_mbit`` is a limit in Mbit/s for traffic ``from`` -> ``to`` on ``nic`` (0 removes
it), or the word ``break`` or ``heal`` for the path between the two nodes, both directions::

    time_s,from,to,nic,rate_mbit
    5,0,1,data,100
    15,0,1,data,0
    20,1,2,data,break
    30,1,2,data,heal

:class:`Controller` applies the rows at their times (seconds after :meth:`Controller.start`) from
a thread, logging each as it happens.
"""

from __future__ import annotations

import csv
import io
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from titan_morph.netlab.lab import NICS, Lab, LabError
from titan_morph.netlab.shape import break_path, heal, shape

__all__ = ["Controller", "Event", "apply", "check_events", "node_index", "parse_schedule", "read_schedule"]

ACTIONS = ("break", "heal")


@dataclass(frozen=True)
class Event:
    """One row: at ``time_s``, set ``src`` -> ``dst`` on ``nic`` to ``rate_mbit`` (None with an action)."""

    time_s: float
    src: int
    dst: int
    nic: str
    rate_mbit: float | None = None
    action: str = ""

    def __str__(self) -> str:
        if self.action:
            return f"t={self.time_s:g}s {self.action} {self.src}<->{self.dst} on {self.nic}"
        what = f"{self.rate_mbit:g} mbit" if self.rate_mbit else "unshaped"
        return f"t={self.time_s:g}s {self.src}->{self.dst} on {self.nic}: {what}"


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
            if float(t) < 0:
                raise ValueError("time_s must be >= 0")
            if rate in ACTIONS:
                events.append(Event(float(t), node_index(src), node_index(dst), nic, action=rate))
            elif float(rate) >= 0:
                events.append(Event(float(t), node_index(src), node_index(dst), nic, float(rate)))
            else:
                raise ValueError("rate_mbit must be >= 0, 'break' or 'heal'")
        except (ValueError, LabError) as err:
            raise LabError(f"{where}:{lineno}: {err}") from None
    return sorted(events, key=lambda e: e.time_s)


def read_schedule(path: str | Path) -> list[Event]:
    try:
        return parse_schedule(Path(path).read_text(), str(path))
    except OSError as err:
        raise LabError(f"schedule {path}: {err.strerror}") from None


def check_events(lab: Lab, events: list[Event]) -> None:
    """Every event names two different nodes of ``lab`` (before anything runs)."""
    for e in events:
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


class Controller:
    """Applies ``events`` to ``lab`` at their times from a daemon thread; :meth:`stop` ends it at once."""

    def __init__(self, lab: Lab, events: list[Event], log: TextIO | None = None) -> None:
        check_events(lab, events)
        self.lab, self.events = lab, events
        self.log = log if log is not None else sys.stderr
        self.applied: list[Event] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="netlab-schedule", daemon=True)

    def start(self) -> Controller:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        for event in self.events:
            if self._stop.wait(max(0.0, self._start + event.time_s - time.monotonic())):
                return
            try:
                apply(self.lab, event)
                self.applied.append(event)
                print(f"netlab: schedule: {event}", file=self.log, flush=True)
            except LabError as err:
                print(f"netlab: schedule: {event}: failed: {err}", file=self.log, flush=True)

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
