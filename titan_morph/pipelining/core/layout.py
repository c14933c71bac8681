"""Where stages run, as the tables the generator, the timing routine and the search index by, and
how their messages travel (:class:`Sends`, :func:`arrival`).

The stage tables depend only on the pipeline's shape (stages, stages per rank), so they are built
once per shape (:func:`layout`) instead of on every generator run and every timing: the search runs
both hundreds of times per plan. The arrival rule of the link model (:mod:`links`) is written once
here, for the generator (Alg. 3/4) and the timing routine alike, so both time a message the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from titan_morph.pipelining.core.links import LinkModel, LinkQueue
from titan_morph.pipelining.core.model import CostModel

__all__ = ["Layout", "Route", "Sends", "arrival", "layout", "queued_sends", "static_sends"]

Route = tuple[int, int] | None
"""Where a message travels: ``(link, direction)`` (0 = fwd, 1 = bwd), or None (local hop, or no peer)."""


@dataclass(frozen=True)
class Layout:
    """Per stage its rank, its chunk (index among its rank's stages) and the routes of its F's and
    its I's message (:meth:`model.CostModel.routes`); per rank its stages in chunk order."""

    rank_of: tuple[int, ...]
    chunk_of: tuple[int, ...]
    stages_of: tuple[tuple[int, ...], ...]
    route_f: tuple[Route, ...]
    route_b: tuple[Route, ...]


def layout(model: CostModel) -> Layout:
    """The tables of ``model``'s shape (cached)."""
    return _layout(model.stages, model.stages_per_rank)


@lru_cache(maxsize=64)
def _layout(stages: int, stages_per_rank: int) -> Layout:
    shape = CostModel.uniform(stages, 1, 0.0, 0.0, 0.0, stages_per_rank=stages_per_rank)
    stages_of = tuple(shape.rank_stages(r) for r in range(shape.ranks))
    chunk_of = [0] * stages
    for own in stages_of:
        for k, s in enumerate(own):
            chunk_of[s] = k
    route_f, route_b = shape.routes()
    return Layout(tuple(shape.rank_of(s) for s in range(stages)), tuple(chunk_of), stages_of, route_f, route_b)


@dataclass(frozen=True)
class Sends:
    """How each stage's messages travel in one run: per stage s, the message its F sends to stage
    s+1 (``*_f``) and the one its I sends to stage s−1 (``*_b``).

    ``direct[s]``: the message arrives at its send time + ``delay[s]`` (a static link without a
    transmit time, or a local hop); otherwise :func:`arrival` times it, through ``queue[s]`` when
    the run has link queues, else on wire ``wire_of[s]`` with transmit time ``tau[s]``. ``wire``
    holds, per wire (2·link + direction), when it is free; the run updates it. ``queued``: the run
    sends through link queues; ``on_wires``: some link has a transmit time (static runs only).
    """

    delay_f: list[float]
    delay_b: list[float]
    direct_f: list[bool]
    direct_b: list[bool]
    queue_f: list[LinkQueue | None]
    queue_b: list[LinkQueue | None]
    tau_f: list[float]
    tau_b: list[float]
    wire_f: list[int]
    wire_b: list[int]
    wire: list[float]
    queued: bool
    on_wires: bool

    def tables(
        self,
    ) -> tuple[
        list[float], list[float], list[bool], list[bool], list[LinkQueue | None], list[LinkQueue | None],
        list[float], list[float], list[int], list[int], list[float],
    ]:  # fmt: skip
        """The per-stage tables in field order (delay, direct, queue, tau, wire_of; fwd then bwd; then
        ``wire``), for a hot loop to bind to locals in one line."""
        return (
            self.delay_f, self.delay_b, self.direct_f, self.direct_b, self.queue_f, self.queue_b,
            self.tau_f, self.tau_b, self.wire_f, self.wire_b, self.wire,
        )  # fmt: skip


def static_sends(
    lay: Layout,
    num_links: int,
    delays: tuple[Sequence[float], Sequence[float]],
    transmit: tuple[Sequence[float], Sequence[float]] | None,
) -> Sends:
    """:class:`Sends` of static links: per-link (fwd, bwd) ``delays`` and ``transmit`` times (None:
    none). The bandwidth model sends one message at a time per wire, in issue order."""
    cf, cb = delays
    df = [0.0 if rt is None else (cb if rt[1] else cf)[rt[0]] for rt in lay.route_f]
    db = [0.0 if rt is None else (cb if rt[1] else cf)[rt[0]] for rt in lay.route_b]
    none: list[LinkQueue | None] = [None] * len(lay.rank_of)
    zeros, keys = [0.0] * len(lay.rank_of), [0] * len(lay.rank_of)
    tf, tb = transmit if transmit is not None else ((), ())
    if not any(t > 0 for t in tf) and not any(t > 0 for t in tb):  # the delay-only model
        direct = [True] * len(lay.rank_of)
        return Sends(df, db, direct, direct, none, none, zeros, zeros, keys, keys, [], False, False)

    def per_stage(routes: Sequence[Route]) -> tuple[list[float], list[int]]:
        taus = [0.0 if rt is None else (tb if rt[1] else tf)[rt[0]] for rt in routes]
        return taus, [0 if rt is None else 2 * rt[0] + rt[1] for rt in routes]

    txf, wf = per_stage(lay.route_f)
    txb, wb = per_stage(lay.route_b)
    wire = [-math.inf] * (2 * num_links)
    direct_f, direct_b = [not t > 0 for t in txf], [not t > 0 for t in txb]
    return Sends(df, db, direct_f, direct_b, none, none, txf, txb, wf, wb, wire, False, True)


def queued_sends(lay: Layout, links: LinkModel, depth: int | None) -> Sends:
    """:class:`Sends` through one :class:`links.LinkQueue` per (link, direction), shared by every
    hop that crosses the link in that direction (per-link FIFO; ``depth``: blocking, as in
    :class:`links.LinkQueue`). A local hop (the V's) takes no link and arrives as it is sent."""
    queues = [(LinkQueue(links, k, "fwd", depth), LinkQueue(links, k, "bwd", depth)) for k in range(links.num_links)]
    qf = [None if rt is None else queues[rt[0]][rt[1]] for rt in lay.route_f]
    qb = [None if rt is None else queues[rt[0]][rt[1]] for rt in lay.route_b]
    zeros, keys = [0.0] * len(lay.rank_of), [0] * len(lay.rank_of)
    direct_f, direct_b = [q is None for q in qf], [q is None for q in qb]
    return Sends(zeros, zeros, direct_f, direct_b, qf, qb, zeros, zeros, keys, keys, [], True, False)


def arrival(
    ready: float,
    queue: LinkQueue | None,
    wire: list[float],
    index: int,
    tau: float,
    delay: float,
    t0: float,
    step: int,
) -> tuple[float, float]:
    """(arrival, acceptance) of a message sent at ``ready`` (ms since the step started at ``t0``).

    Through a link ``queue``: its delivery and the time it accepted the message (later than
    ``ready`` when a blocking queue is full: head-of-line blocking). Otherwise on wire ``index``,
    one message at a time in issue order: transmission from max(``ready``, wire free) for ``tau``,
    the wire then busy until its end, and the latency ``delay`` after it (:mod:`links`: delivery =
    start + tau + c). A message that is neither (:attr:`Sends.direct_f`) arrives at ``ready +
    delay``; callers keep that case inline, as it is the search's hot path.
    """
    if queue is not None:
        sent = queue.send(t0 + ready, step)
        return sent.delivered - t0, sent.accepted - t0
    done = (ready if ready > wire[index] else wire[index]) + tau
    wire[index] = done
    return done + delay, ready
