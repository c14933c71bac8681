"""One stage's measurements of one step, as a fixed-size row of floats for the cross-rank exchange.

The runtime all-gathers one row per pipeline rank after every step (one small collective on a CPU
group, no external service: the paper used Redis). The row carries everything the other ranks
need: the plan the rank ran (every rank checks that they agree), its compute times per op kind and,
when it runs several stages (the V), per stage, its send blocking and failovers (TensorBoard), and
one entry per pipeline message it sent or received in the step, with its size (the monitor's
delays and bandwidth, the latency figures). Times are ms on the pipeline's common clock
(:mod:`titan_morph.comm.clock`), so a receiver's arrival compares with the sender's acceptance on
another host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["MessageStamp", "StepProfile", "capacity", "row_width", "encode", "decode", "PATHS", "PROBE_PATH"]

PATHS = ("", "emulated", "delegate", "torch", "auto", "rate-probe")  # MessageRecord.path codes, and PROBE_PATH
PROBE_PATH = "rate-probe"
"""The path of a rate probe's messages (:func:`titan_morph.comm.recorded.probe_train`): they
measure a link's rate and are not pipeline traffic."""
PROBE_ROOM = 12
"""Room in a row for probe messages: a rank probes at most two links, three messages each way."""
_DIRS = ("fwd", "bwd")
_KINDS = ("F", "I", "W", "B")
_SCALARS = ("plan", "blocked_ms", "send_late_ms", "sends", "failovers")
# stage, step, start, end, nrows, sent_ms, nstages, scalars, (sum, count) per kind
_HEADER = 7 + len(_SCALARS) + 2 * len(_KINDS)
_STAGE = 1 + 2 * len(_KINDS)  # per stage of a rank with several: its index, (sum, count) per kind
_MSG = 9  # side, path, link, dir, seq, t1, t2, t3, nbytes
NAN = float("nan")


@dataclass(frozen=True)
class MessageStamp:
    """One message as seen by one side; times in ms on the common clock.

    Send: ``t1`` = accepted on the link (after any head-of-line blocking), ``t2`` = the link model's
    planned delivery (NaN without emulation). Receive: ``t1`` = arrival stamped by the transport
    independently of the consumer (NaN when it cannot, e.g. plain torch.distributed), ``t2`` = when
    the training thread began waiting for it, ``t3`` = when that wait returned. ``nbytes``: the
    payload's size (the monitor's bandwidth estimate, :mod:`.bandwidth`; 0 = unknown).
    """

    side: str  # "send" | "recv"
    path: str
    link: int
    direction: str
    seq: int
    t1: float = NAN
    t2: float = NAN
    t3: float = NAN
    nbytes: int = 0

    @property
    def key(self) -> tuple[str, int, str, int]:
        return (self.path, self.link, self.direction, self.seq)


@dataclass
class StepProfile:
    """What the rank running stage ``stage`` measured in step ``step`` (ms on the common clock).

    ``stage`` is the rank's index in the pipeline group: its stage with one stage per rank. A rank
    that runs several stages (the V) also reports ``stage_compute`` per pipeline stage; ``compute``
    is then its total over them.
    """

    stage: int
    step: int
    start_ms: float
    end_ms: float
    compute: dict[str, tuple[float, int]] = field(default_factory=dict)  # kind -> (total ms, ops)
    messages: list[MessageStamp] = field(default_factory=list)
    sent_ms: float = NAN  # when the stage entered the exchange (its overhead is measured from the last one)
    dropped: int = 0  # messages that did not fit the row (see capacity)
    plan: int = 0  # the plan id the stage ran, as an integer (12 hex digits: exact in a float64)
    blocked_ms: float = 0.0  # blocked issuing sends (head-of-line, back-pressure), all links
    send_late_ms: float = 0.0  # sum over sends: producing op's end to the send's issue
    sends: int = 0
    failovers: int = 0  # (link, direction) pairs this rank has failed over so far
    stage_compute: dict[int, dict[str, tuple[float, int]]] = field(default_factory=dict)  # stage -> kind -> ...

    def stage_times(self) -> dict[int, dict[str, tuple[float, int]]]:
        """Per pipeline stage run by this rank: kind -> (total ms, ops)."""
        return self.stage_compute if self.stage_compute else {self.stage: self.compute}

    @property
    def busy_ms(self) -> float:
        return sum(total for total, _ in self.compute.values())

    def mean_ms(self, kind: str) -> float | None:
        total, n = self.compute.get(kind, (0.0, 0))
        return total / n if n else None


def capacity(microbatches: int, stages_per_rank: int = 1) -> int:
    """Messages a row holds: 4 per microbatch and stage (2 links x send/recv) plus room for re-posted
    ones (a receive that fails over to the delegates is recorded on both paths) and for a probe."""
    return (4 * stages_per_rank + 1) * microbatches + 8 + PROBE_ROOM


def row_width(microbatches: int, stages_per_rank: int = 1) -> int:
    """Floats per rank row."""
    return _HEADER + _STAGE * stages_per_rank + _MSG * capacity(microbatches, stages_per_rank)


def encode(profile: StepProfile, microbatches: int, stages_per_rank: int = 1) -> list[float]:
    """Pack ``profile`` into ``row_width(microbatches, stages_per_rank)`` floats; messages beyond
    the row's :func:`capacity` are left out (``profile.dropped`` counts them): statistics never stop
    training."""
    if len(profile.stage_compute) > stages_per_rank:
        raise ValueError(f"profile holds {len(profile.stage_compute)} stages; the row has room for {stages_per_rank}")
    width, room = row_width(microbatches, stages_per_rank), capacity(microbatches, stages_per_rank)
    messages = profile.messages[:room]
    profile.dropped = len(profile.messages) - len(messages)
    row = [NAN] * width
    row[:7] = [
        profile.stage,
        profile.step,
        profile.start_ms,
        profile.end_ms,
        len(messages),
        profile.sent_ms,
        len(profile.stage_compute),
    ]
    row[7 : 7 + len(_SCALARS)] = [
        float(profile.plan),
        profile.blocked_ms,
        profile.send_late_ms,
        float(profile.sends),
        float(profile.failovers),
    ]
    at = 7 + len(_SCALARS)
    for i, kind in enumerate(_KINDS):
        total, n = profile.compute.get(kind, (0.0, 0))
        row[at + 2 * i : at + 2 + 2 * i] = [total, float(n)]
    at = _HEADER
    for stage, compute in sorted(profile.stage_compute.items()):
        row[at] = float(stage)
        for i, kind in enumerate(_KINDS):
            total, n = compute.get(kind, (0.0, 0))
            row[at + 1 + 2 * i : at + 3 + 2 * i] = [total, float(n)]
        at += _STAGE
    at = _HEADER + _STAGE * stages_per_rank
    for m in messages:
        row[at : at + _MSG] = [
            0.0 if m.side == "send" else 1.0,
            float(PATHS.index(m.path) if m.path in PATHS else 0),
            float(m.link),
            float(_DIRS.index(m.direction)),
            float(m.seq),
            m.t1,
            m.t2,
            m.t3,
            float(m.nbytes),
        ]
        at += _MSG
    return row


def _compute(row: Sequence[float], at: int) -> dict[str, tuple[float, int]]:
    out = {}
    for i, kind in enumerate(_KINDS):
        total, n = row[at + 2 * i], int(row[at + 1 + 2 * i])
        if n:
            out[kind] = (float(total), n)
    return out


def decode(row: Sequence[float], stages_per_rank: int = 1) -> StepProfile:
    """Inverse of :func:`encode` (with the same ``stages_per_rank``)."""
    stage, step, start, end, nrows, sent, nstages = (row[i] for i in range(7))
    plan, blocked, late, sends, failovers = (row[7 + i] for i in range(len(_SCALARS)))
    compute = _compute(row, 7 + len(_SCALARS))
    stage_compute = {
        int(row[_HEADER + _STAGE * k]): _compute(row, _HEADER + _STAGE * k + 1) for k in range(int(nstages))
    }
    messages = []
    at = _HEADER + _STAGE * stages_per_rank
    for _ in range(int(nrows)):
        side, path, link, d, seq, t1, t2, t3, nbytes = row[at : at + _MSG]
        messages.append(
            MessageStamp(
                "send" if side == 0 else "recv",
                PATHS[int(path)],
                int(link),
                _DIRS[int(d)],
                int(seq),
                float(t1),
                float(t2),
                float(t3),
                int(nbytes),
            )
        )
        at += _MSG
    return StepProfile(
        int(stage),
        int(step),
        float(start),
        float(end),
        compute,
        messages,
        float(sent),
        plan=int(plan),
        blocked_ms=float(blocked),
        send_late_ms=float(late),
        sends=int(sends),
        failovers=int(failovers),
        stage_compute=stage_compute,
    )
