"""What one ``step()`` did on one rank: the runtime's per-step record.

The schedule fills a :class:`StepRecord` while the step runs (op timings, send lateness), then
adds what the transport saw (blocking, failovers, message records). It is this rank's input to the
per-step exchange (:mod:`.exchange`), which gives every rank every stage's view of the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from titan_morph.comm.records import MessageRecord

__all__ = ["StepRecord"]


@dataclass
class StepRecord:
    """One rank's step. Times: ``start_s`` is ``time.monotonic()``; ``op_ms`` are ms since it."""

    step: int  # 0-based count of this schedule's steps (TorchTitan's step is step + 1)
    plan_id: str
    iteration_ms: float
    planned_makespan_ms: float | None
    compute_ms: dict[str, float] = field(default_factory=dict)  # per op kind (F, I, W, B)
    # per stage and op kind: (total ms, ops); filled when the rank runs several stages (the V)
    stage_compute: dict[int, dict[str, tuple[float, int]]] = field(default_factory=dict)
    op_ms: list[tuple[str, int, float, float]] = field(default_factory=list)  # (kind, mb, start, end)
    start_s: float = 0.0
    blocked_ms: dict[int, float] = field(default_factory=dict)  # per link: blocked issuing sends this step
    # Per send: ms from the producing op's end (its device end on the testbed) to the send's issue.
    send_late_ms: list[float] = field(default_factory=list)
    failovers: int = 0  # (link, direction) pairs this rank has moved to the delegated path so far
    messages: list[MessageRecord] = field(default_factory=list)  # the transport's records of the step
    # The clock of compute_ms/op_ms (runtime.optime): "host", "testbed" or "cuda". With "cuda" the
    # op figures are read back at the step's end, once the device ran them (within the [comm] bound:
    # an op still queued then is filed with a later step).
    op_clock: str = "host"

    @property
    def busy_ms(self) -> float:
        return sum(self.compute_ms.values())

    @property
    def idle_ms(self) -> float:
        """Time this rank was not computing during the step (bubbles + blocking + comm waits)."""
        return max(0.0, self.iteration_ms - self.busy_ms)

    @property
    def end_s(self) -> float:
        return self.start_s + self.iteration_ms / 1e3
