"""Tensor parallelism inside a pipeline stage: the stage as the pipeline sees it, from its lanes.

With TP degree T every stage runs on T ranks, and rank t of stage s talks to rank t of stage s+1:
one *lane* per TP rank, each with its own messages on its own path. The ranks of a stage meet in
their TP collectives inside every op, so the stage runs at its slowest lane: a lane whose link is
slow delays every lane's next op, and a lane whose rank computes slowly holds the others in the
collectives. :func:`slowest_lane` folds the T rows of one stage into the one row the monitor reads,
per message and per kind the slowest lane's figures; every rank of the stage folds the same rows,
so all lanes take each decision (a re-plan, a delegation, a re-partition) together. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from titan_morph.monitor.profile import MessageStamp, StepProfile

__all__ = ["slowest_lane", "stages_of_lanes"]

Kinds = dict[str, tuple[float, int]]


def _later(a: MessageStamp, b: MessageStamp) -> MessageStamp:
    """The stamp of the lane the stage waited for: the later acceptance (a send) or arrival (a
    receive; the wait's return where no arrival was stamped); a finite time over NaN."""

    def at(m: MessageStamp) -> float:
        t = m.t1 if m.side == "send" or not math.isnan(m.t1) else m.t3
        return -math.inf if math.isnan(t) else t

    return b if at(b) > at(a) else a


def _slowest_kinds(rows: Sequence[Kinds]) -> Kinds:
    """Per op kind, the lane with the most time in it."""
    kinds = sorted({k for row in rows for k in row})
    return {k: max((row.get(k, (0.0, 0)) for row in rows), key=lambda tn: tn[0]) for k in kinds}


def slowest_lane(lanes: Sequence[StepProfile]) -> StepProfile:
    """One stage's TP lanes (its ranks' rows of one step, one plan) as one row: per message (side,
    path, link, direction, sequence number) the lane the stage waited for; per op kind the slowest
    lane's compute; the stage's start as its first lane's and its end as its last lane's; the most
    blocking, lateness and failovers of any lane. One lane is returned as it is."""
    if not lanes:
        raise ValueError("slowest_lane: a stage needs at least one lane")
    if len(lanes) == 1:
        return lanes[0]
    first = lanes[0]
    messages: dict[tuple[str, str, int, str, int], MessageStamp] = {}
    for lane in lanes:
        for m in lane.messages:
            key = (m.side, *m.key)
            messages[key] = _later(messages[key], m) if key in messages else m
    stages = sorted({s for lane in lanes for s in lane.stage_compute})
    return StepProfile(
        first.stage,
        first.step,
        min(lane.start_ms for lane in lanes),
        max(lane.end_ms for lane in lanes),
        _slowest_kinds([lane.compute for lane in lanes]),
        list(messages.values()),
        sent_ms=max(lane.sent_ms for lane in lanes),
        dropped=sum(lane.dropped for lane in lanes),
        plan=first.plan,
        blocked_ms=max(lane.blocked_ms for lane in lanes),
        send_late_ms=max(lane.send_late_ms for lane in lanes),
        sends=max(lane.sends for lane in lanes),
        failovers=max(lane.failovers for lane in lanes),
        stage_compute={s: _slowest_kinds([lane.stage_compute.get(s, {}) for lane in lanes]) for s in stages},
    )


def stages_of_lanes(rows: Sequence[StepProfile], lanes: int) -> list[StepProfile]:
    """The rows of every lane of every stage (stage-major: stage s's lane t at ``s * lanes + t``)
    as one row per stage (:func:`slowest_lane`)."""
    if lanes < 1 or len(rows) % lanes:
        raise ValueError(f"stages_of_lanes: {len(rows)} rows are not whole stages of {lanes} lane(s)")
    return [slowest_lane(rows[i : i + lanes]) for i in range(0, len(rows), lanes)]
