"""Where stages run, as the tables the generator, the timing routine and the search index by.

They depend only on the pipeline's shape (stages, stages per rank), so they are built once per
shape (:func:`layout`) instead of on every generator run and every timing: the search runs both
hundreds of times per plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from .model import CostModel

__all__ = ["Layout", "Route", "layout", "wires"]

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


def wires(
    lay: Layout, transmit: tuple[Sequence[float], Sequence[float]]
) -> tuple[list[float], list[float], list[int], list[int]] | None:
    """Per stage, the transmit time of its F's and its I's message under per-link (fwd, bwd)
    ``transmit`` times, and the index (2·link + direction) of the wire each uses; None when no link
    has a transmit time (the delay-only model)."""
    tf, tb = transmit
    if not any(t > 0 for t in tf) and not any(t > 0 for t in tb):
        return None

    def per_stage(routes: Sequence[Route]) -> tuple[list[float], list[int]]:
        taus = [0.0 if rt is None else (tb if rt[1] else tf)[rt[0]] for rt in routes]
        keys = [0 if rt is None else 2 * rt[0] + rt[1] for rt in routes]
        return taus, keys

    txf, wf = per_stage(lay.route_f)
    txb, wb = per_stage(lay.route_b)
    return txf, txb, wf, wb
