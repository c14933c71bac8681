"""New plans for detector decisions: Alg. 2 (+ the search) from measured times, latencies and
transmit times (the planner's bandwidth model, :mod:`titan_morph.pipelining.core.links`).

Stage times come from the profiles (median over a window of steps, so one noisy step does not
move the plan), rounded to 0.1 ms so that every rank builds exactly the same cost model from the
same gathered numbers. The search's work is a fixed number of iterations, not wall time, so the
plan is a pure function of its inputs (the runtime's per-step exchange checks that every rank runs
the same plan).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence

from titan_morph.monitor.profile import StepProfile
from titan_morph.pipelining.core.model import CostModel, Plan
from titan_morph.pipelining.search.builders import build
from titan_morph.pipelining.search.driver import iterations_for_ms

__all__ = ["MeasuredTimes", "adapted_plan", "search_iterations", "wire_capacity_ms"]


class MeasuredTimes:
    """Rolling per-stage (F, B, W) medians, B being the input-gradient op (I, or a fused B);
    ``stages_per_rank`` places the stages for the cost models built from them."""

    def __init__(
        self,
        num_stages: int,
        fallback: Sequence[tuple[float, float, float]],
        window: int = 8,
        stages_per_rank: int = 1,
    ) -> None:
        if len(fallback) != num_stages:
            raise ValueError(f"fallback needs {num_stages} (F, B, W) triples, got {len(fallback)}")
        self.fallback = tuple(tuple(float(x) for x in t) for t in fallback)
        self.stages_per_rank = stages_per_rank
        self._seen: list[dict[str, deque[float]]] = [
            {k: deque(maxlen=window) for k in "FBW"} for _ in range(num_stages)
        ]

    def add(self, profiles: Sequence[StepProfile]) -> None:
        for prof in profiles:
            for stage, compute in prof.stage_times().items():
                seen = self._seen[stage]
                for kind, target in (("F", "F"), ("I", "B"), ("B", "B"), ("W", "W")):
                    total, n = compute.get(kind, (0.0, 0))
                    if n:
                        seen[target].append(total / n)

    def times(self) -> tuple[tuple[float, float, float], ...]:
        out: list[tuple[float, float, float]] = []
        for seen, fallback in zip(self._seen, self.fallback, strict=True):
            f, b, w = (
                max(round(statistics.median(seen[kind]), 1) if seen[kind] else fallback[j], 0.1)
                for j, kind in enumerate("FBW")
            )
            out.append((f, b, w))
        return tuple(out)

    def model(
        self,
        microbatches: int,
        delays: Sequence[float] | None = None,
        memory: int | Sequence[int] | None = None,
        transmit: Sequence[float] | None = None,
    ) -> CostModel:
        """The measured times as a cost model with per-link latencies ``delays`` and per-message
        ``transmit`` times (None: the delay-only model); ``memory``: one in-flight cap for every
        rank, or one per rank."""
        times = self.times()
        return CostModel.uniform(
            len(times),
            microbatches,
            tuple(t[0] for t in times),
            tuple(t[1] for t in times),
            tuple(t[2] for t in times),
            delays=tuple(delays) if delays is not None else None,
            memory=memory,
            stages_per_rank=self.stages_per_rank,
            transmit=tuple(transmit) if transmit else None,
        )


def wire_capacity_ms(model: CostModel) -> tuple[float, ...]:
    """Per link, the transmit time per message the pipeline's pace leaves room for: the busiest
    rank's F + B + W per microbatch (at most one microbatch completes per such period), divided by
    the hops the link carries per direction (each sends one message per microbatch). A slower wire
    falls further behind with every microbatch (:mod:`.detect`)."""
    period = max(
        sum(model.fwd[q] + model.bwd[q] + model.wgt[q] for q in model.rank_stages(r)) for r in range(model.ranks)
    )
    return tuple(period / len(model.link_hops(link)) for link in range(model.num_links))


def search_iterations(
    model: CostModel, iterations: int, budget_ms: float, samples: Sequence[Sequence[float]] | None = None
) -> int:
    """The search's fixed work for ``model``: ``iterations`` when set (> 0), else the count that takes
    about ``budget_ms`` of CPU on the reference box over the robust search's ``samples`` (one delay
    vector when None) -- a pure function of the inputs, so every rank searches the same way and
    builds the same plan, whatever its load."""
    return iterations if iterations > 0 else iterations_for_ms(model, budget_ms, len(samples) if samples else 1)


def adapted_plan(
    model: CostModel,
    *,
    search: bool,
    depth: int | None,
    iterations: int,
    samples: Sequence[Sequence[float]] | None = None,
) -> Plan:
    """PipeMorph's plan for ``model``'s latencies and transmit times (PipeMorph-V with two stages
    per rank): Alg. 2 (Eq. 1 with latency + transmit), refined by the search when ``search`` (with
    ``iterations``; it times the FIFO wire of the bandwidth model); for ``samples`` (per-link
    latency vectors; non-blocking links) the plan with the lowest expected makespan over them."""
    name = "pipemorph" if model.stages_per_rank == 1 else "pipemorph-v"
    if not search:
        return build(name, model)
    if samples is not None and depth is None:
        return build(name, model, search=True, samples=samples, iterations=iterations)
    return build(name, model, search=True, depth=depth, iterations=iterations)
