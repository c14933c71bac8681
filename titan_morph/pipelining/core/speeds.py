"""The compute model: one definition of how slow each pipeline rank computes, shared by the simulator
and the emulator, as :mod:`links` is for the links.

A rank's *compute factor* multiplies the time of every op it runs: factor 2 makes its F, I and W
take twice their time at speed 1 (its speed is 1 / factor). The synthetic testbed pads each op to
its configured time x the factor of its rank (:mod:`titan_morph.runtime.testbed`), the real model
sleeps after each op for (factor - 1) x the op's measured time (:mod:`titan_morph.runtime.slowdown`),
and the simulator times the same plan on the stage times x the factors of their ranks
(:meth:`ComputeModel.scale`), so measured and predicted step times are comparable.

Factors are keyed by the training step (TorchTitan's count, from 1) and constant within a step:
compute slowdowns (a throttled or shared device, a co-located job) last seconds, not milliseconds,
and a step-keyed factor is what a plan made at a step boundary can react to. Models:

* :class:`StaticFactors`: one factor per rank;
* :class:`RandomFactors`: each rank whose ``maxima`` is above 1 draws its factor per step from
  U(1, maxima[r]), from a stream seeded by (seed, rank, step), so every rank and the simulator see
  the same factor for a step whatever else ran;
* :class:`TraceFactors`: piecewise-constant factors per rank from trace rows ``step, rank,
  compute_factor`` (before a rank's first row its factor is 1), alone or beside link rows in one
  file (:mod:`.trace_rows`);
* :class:`WindowedFactors`: any of them between a first and a last step (1 outside).

Pure Python, no torch.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.core.trace_rows import read_trace_rows

__all__ = [
    "ComputeModel",
    "RandomFactors",
    "StaticFactors",
    "TRACE_COLUMNS",
    "TraceFactors",
    "WindowedFactors",
    "is_compute_trace",
]

TRACE_COLUMNS = ("step", "rank", "compute_factor")
"""The columns of a compute trace (a CSV file; one row per change of one rank's factor)."""


def _factor(value: float, what: str) -> float:
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{what}: compute factors must be finite and > 0 (2 = twice as slow), got {value:g}")
    return value


class ComputeModel:
    """Base class: the factor of every op of ``rank`` in ``step`` (1 = its speed-1 time)."""

    ranks: int

    def factor(self, rank: int, step: int) -> float:
        raise NotImplementedError

    def factors(self, step: int) -> tuple[float, ...]:
        """Every rank's factor in ``step``."""
        return tuple(self.factor(r, step) for r in range(self.ranks))

    def speeds(self, step: int) -> tuple[float, ...]:
        """Every rank's speed in ``step`` (1 / factor): the partition planner's ``rank_speed``."""
        return tuple(1.0 / f for f in self.factors(step))

    def scale(self, model: CostModel, step: int) -> CostModel:
        """``model`` with every stage's times x the factor of its rank in ``step``."""
        if model.ranks != self.ranks:
            raise ValueError(f"the compute model has {self.ranks} ranks, the cost model {model.ranks}")
        factors = self.factors(step)
        if all(f == 1.0 for f in factors):
            return model
        per_stage = [1.0] * model.stages
        for r, f in enumerate(factors):
            for s in model.rank_stages(r):
                per_stage[s] = f
        return replace(
            model,
            fwd=tuple(t * f for t, f in zip(model.fwd, per_stage)),
            bwd=tuple(t * f for t, f in zip(model.bwd, per_stage)),
            wgt=tuple(t * f for t, f in zip(model.wgt, per_stage)),
        )


@dataclass
class StaticFactors(ComputeModel):
    """One constant factor per rank."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        self.values = tuple(_factor(v, f"rank {r}") for r, v in enumerate(self.values))
        if not self.values:
            raise ValueError("compute factors: one value per rank needed, got none")
        self.ranks = len(self.values)

    def factor(self, rank: int, step: int) -> float:
        return self.values[rank]


@dataclass
class RandomFactors(ComputeModel):
    """Per step, rank r's factor ~ U(1, maxima[r]) where maxima[r] > 1 (module docstring)."""

    maxima: tuple[float, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        self.maxima = tuple(_factor(v, f"rank {r}") for r, v in enumerate(self.maxima))
        self.ranks = len(self.maxima)

    def factor(self, rank: int, step: int) -> float:
        top = self.maxima[rank]
        if top <= 1.0:
            return top
        return 1.0 + (top - 1.0) * random.Random(f"{self.seed}:compute:{rank}:{step}").random()


@dataclass
class TraceFactors(ComputeModel):
    """Piecewise-constant factors: ``events`` are (from step, rank, factor)."""

    ranks: int
    events: tuple[tuple[int, int, float], ...]
    _series: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for at, rank, value in sorted(self.events):
            if not 0 <= rank < self.ranks:
                raise ValueError(f"compute trace: rank {rank} is out of range 0..{self.ranks - 1}")
            if at < 1:
                raise ValueError(f"compute trace: step {at} is out of range (steps count from 1)")
            steps, values = self._series.setdefault(rank, ([], []))
            steps.append(at)
            values.append(_factor(value, f"compute trace, rank {rank} at step {at}"))

    def factor(self, rank: int, step: int) -> float:
        series = self._series.get(rank)
        if series is None:
            return 1.0
        k = bisect.bisect_right(series[0], step) - 1
        return series[1][k] if k >= 0 else 1.0

    @classmethod
    def from_csv(cls, path: str | Path, ranks: int) -> TraceFactors:
        """Read the rank rows (:mod:`.trace_rows`: the columns :data:`TRACE_COLUMNS`) of a trace."""
        found = read_trace_rows(path)
        if not found.ranks or not set(TRACE_COLUMNS) <= found.columns:
            got = sorted(found.columns)
            raise ValueError(f"compute trace {path}: needs the columns {', '.join(TRACE_COLUMNS)}; got {got}")
        events = []
        for line, row in found.ranks:
            try:
                events.append((int(row["step"]), int(row["rank"]), float(row["compute_factor"])))
            except (TypeError, ValueError):
                raise ValueError(f"compute trace {path}: line {line}: {dict(row)} is not step, rank, factor") from None
        return cls(ranks, tuple(events))


def is_compute_trace(path: str | Path) -> bool:
    """Whether the trace at ``path`` sets some rank's factor (it has rank rows, :mod:`.trace_rows`)."""
    found = read_trace_rows(path)
    return bool(found.ranks) and set(TRACE_COLUMNS) <= found.columns


@dataclass
class WindowedFactors(ComputeModel):
    """``inner`` from ``start_step`` to ``end_step`` (0 = to the end); factor 1 outside."""

    inner: ComputeModel
    start_step: int = 1
    end_step: int = 0

    def __post_init__(self) -> None:
        self.ranks = self.inner.ranks

    def factor(self, rank: int, step: int) -> float:
        if step < self.start_step or (self.end_step and step > self.end_step):
            return 1.0
        return self.inner.factor(rank, step)
