"""The search's yardstick (:mod:`driver`): what a candidate schedule is scored by, and the best so far.

A candidate is either a point of the Alg. 3/4 generator's space (:class:`Knobs`, scored from the
generator's run) or fixed per-rank orders (scored by :func:`timeline.time_codes`). The score is
the makespan under one link model, or the mean over static delay scenarios (:mod:`robust`), with
the sum of stage finish times as tie-break. :class:`SearchState` holds the best schedule that both
workers (:mod:`knobs`, :mod:`tabu`) offer their candidates to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from titan_morph.pipelining.core.codes import CHUNK, Code
from titan_morph.pipelining.core.layout import layout
from titan_morph.pipelining.core.links import LinkModel, StaticDelays
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.schedules.event_loop import run_generator
from titan_morph.pipelining.timing.timeline import Timeline, static_transmit, time_codes

__all__ = ["Knobs", "Objective", "SearchState", "Topology", "better", "finish_sum", "EPS", "RNG_SEED"]

EPS = 1e-9
"""Relative tolerance of score comparisons."""
RNG_SEED = 20260113
"""Seed of the workers' fixed-seed random generators (the search is deterministic)."""


@dataclass(frozen=True, order=True)
class Knobs:
    """One point of the generator's space: per stage x_s, per rank the in-flight cap and the policy
    bits, and the index of the delay vector the generator plans against (0 = the model's delays)."""

    warmup: tuple[int, ...]
    limit: tuple[int, ...]
    policy: tuple[int, ...]
    plan: int = 0


class Objective:
    """Scores candidates: the makespan under one link model, or the mean over delay scenarios.
    Every generator run and every timing counts as one evaluation (``evaluations``)."""

    def __init__(
        self,
        model: CostModel,
        links: LinkModel | None,
        depth: int | None,
        scenarios: Sequence[Sequence[float]] | None,
        plan_vectors: Sequence[Sequence[float]],
    ) -> None:
        self.model = model
        self.links = links
        self.depth = depth
        self.caps = tuple(model.budget(r) for r in range(model.ranks))
        self.topo = Topology(model)
        self.plan_models = [model.with_delays(v) for v in plan_vectors]
        self.static: list[tuple[tuple[float, ...], tuple[float, ...]]] | None
        self.transmit = static_transmit(model, links)  # per-message transmit times of static runs
        if scenarios is not None:
            self.static = [(tuple(v), tuple(v)) for v in scenarios]
        elif depth is None and (links is None or isinstance(links, StaticDelays)):
            cf = model.delays if links is None else links.fwd
            cb = model.delays if links is None else links.fwd if links.bwd is None else links.bwd
            self.static = [(tuple(cf), tuple(cb))]
        else:
            self.static = None
        # One static vector equal to the planning delays: the generator's timeline is the score.
        self.own_timeline = (
            self.static is not None
            and len(self.static) == 1
            and self.static[0] == (model.delays, model.delays)
            and self.transmit == (model.transmit, model.transmit)
            and len(self.plan_models) == 1
            and self.plan_models[0].delays == model.delays
        )
        self.evaluations = 0

    def knobs(self, k: Knobs, record: bool = False) -> tuple[tuple[float, float], list[list[Code]] | None]:
        """Generate the schedule of ``k``: ((score, secondary), orders). With the generator's own
        timeline the secondary is unknown (``inf``) and orders come only with ``record``."""
        self.evaluations += 1
        if self.own_timeline:
            ms, codes = run_generator(self.model, k.warmup, k.limit, k.policy, record=record)
            return (ms, math.inf), codes
        _, codes = run_generator(self.plan_models[k.plan], k.warmup, k.limit, k.policy)
        if codes is None:
            return (math.inf, math.inf), None
        return self._score(codes), codes

    def orders(self, codes: Sequence[Sequence[Code]]) -> tuple[float, float]:
        """(score, Σ stage finish times) of fixed orders; ``inf`` on deadlock."""
        self.evaluations += 1
        return self._score(codes)

    def _score(self, codes: Sequence[Sequence[Code]]) -> tuple[float, float]:
        if self.static is None:
            tl = time_codes(self.model, codes, links=self.links, depth=self.depth)
            return tl.makespan, finish_sum(tl)
        total = second = 0.0
        for delays in self.static:
            tl = time_codes(self.model, codes, delays=delays, transmit=self.transmit)
            if tl.stuck is not None:
                return math.inf, math.inf
            total += tl.makespan
            second += finish_sum(tl)
        k = len(self.static)
        return total / k, second / k

    def scored_timeline(
        self, codes: Sequence[Sequence[Code]], which: int, resume: tuple[Timeline, int, int] | None = None
    ) -> tuple[tuple[float, float], Timeline]:
        """(score, secondary) and the detailed timeline under scenario ``which`` (cycled): one
        evaluation. ``resume``: the timeline of these orders before a move on one rank
        (:func:`timeline.time_codes`), used with a single scenario."""
        self.evaluations += 1
        if self.static is None:
            tl = time_codes(self.model, codes, links=self.links, depth=self.depth, detail=True)
            return (tl.makespan, finish_sum(tl)), tl
        if len(self.static) == 1:
            tl = time_codes(
                self.model, codes, delays=self.static[0], transmit=self.transmit, detail=True, resume=resume
            )
            return (tl.makespan, finish_sum(tl)) if tl.stuck is None else (math.inf, math.inf), tl
        pick = which % len(self.static)
        total = second = 0.0
        chosen: Timeline | None = None
        for k, delays in enumerate(self.static):
            tl = time_codes(self.model, codes, delays=delays, transmit=self.transmit, detail=k == pick)
            if tl.stuck is not None:
                return (math.inf, math.inf), tl
            if k == pick:
                chosen = tl
            total += tl.makespan
            second += finish_sum(tl)
        assert chosen is not None
        n = len(self.static)
        return (total / n, second / n), chosen

    def tail_delays(self, which: int) -> tuple[Sequence[float], Sequence[float]]:
        """Static per-link delays (fwd, bwd) the move estimates assume (scenario ``which``), each
        plus the link's transmit time (a message's cost when it does not queue)."""
        static = self.static
        cf, cb = (self.model.delays, self.model.delays) if static is None else static[which % len(static)]
        tf, tb = self.transmit
        return [c + t for c, t in zip(cf, tf)], [c + t for c, t in zip(cb, tb)]


def finish_sum(tl: Timeline) -> float:
    """Σ of the ranks' finish times (the secondary score); ``inf`` when the orders deadlock."""
    return sum(e[-1] for e in tl.end if e) if tl.stuck is None else math.inf


class Topology:
    """Where stages run, for the order moves: per stage its rank and its code offset (CHUNK·chunk),
    per hop the static delay of its message (0 on the V's local hop)."""

    def __init__(self, model: CostModel) -> None:
        lay = layout(model)
        self.last = model.stages - 1
        self.rank = lay.rank_of
        self.stages = lay.stages_of
        self.offset = [CHUNK * k for k in lay.chunk_of]
        self.route_f, self.route_b = lay.route_f, lay.route_b

    def stage(self, r: int, code: int) -> int:
        return self.stages[r][code // CHUNK]

    def hop_delays(self, delays: tuple[Sequence[float], Sequence[float]]) -> tuple[list[float], list[float]]:
        """Per stage: the delay of its F's message and of its I's message under (fwd, bwd) link delays."""
        cf, cb = delays
        df = [0.0 if rt is None else (cb if rt[1] else cf)[rt[0]] for rt in self.route_f]
        db = [0.0 if rt is None else (cb if rt[1] else cf)[rt[0]] for rt in self.route_b]
        return df, db


def better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Lexicographic (score, secondary) comparison with a float tolerance (``inf`` = unknown)."""
    tol = EPS * max(1.0, abs(b[0])) if math.isfinite(b[0]) else 0.0
    if a[0] < b[0] - tol:
        return True
    if a[0] > b[0] + tol or not math.isfinite(a[1]):
        return False
    return not math.isfinite(b[1]) or a[1] < b[1] - EPS * max(1.0, abs(b[1]))


class SearchState:
    """Best schedule so far (shared by the workers) and the knob memo."""

    def __init__(self, objective: Objective) -> None:
        self.obj = objective
        self.best: tuple[float, float] = (math.inf, math.inf)
        self.best_codes: list[list[Code]] | None = None
        self.best_knobs: Knobs | None = None
        self.best_by = ""
        self.outside = 0  # bumped when the best comes from anything but the order worker
        self.memo: dict[Knobs, float] = {}

    def offer(self, score: tuple[float, float], codes: list[list[Code]] | None, knobs: Knobs | None, by: str) -> None:
        """Take ``score`` as the new best if it is better (orders regenerated from knobs if needed)."""
        if not better(score, self.best):
            return
        if codes is None:
            assert knobs is not None
            _, codes = self.obj.knobs(knobs, record=True)
            self.obj.evaluations -= 1  # regenerating a schedule already scored is not a new evaluation
            assert codes is not None
            score = (score[0], self.obj._score(codes)[1])
        self.best, self.best_codes, self.best_knobs, self.best_by = score, codes, knobs, by
        if by != "orders":
            self.outside += 1

    def eval_knobs(self, k: Knobs, by: str) -> float:
        """Score of knobs ``k`` (memoised), offered as a new best."""
        if k in self.memo:
            return self.memo[k]
        score, codes = self.obj.knobs(k)
        self.memo[k] = score[0]
        if math.isfinite(score[0]):
            self.offer(score, codes, k, by)
        return score[0]
