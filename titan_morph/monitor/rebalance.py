"""DP x PP: move microbatches between data-parallel replicas, in proportion to their speed (pure).

A slow rank slows its whole replica: every microbatch of the replica's pipeline passes through it,
and every replica waits for the slowest one at the gradient reduction. The topology orchestrator
(:mod:`.topology`) moves slow *links*; a slow device moves with its host, and re-partitioning one
replica would give the replicas different splits. What can move is work: the global batch stays
the same (the same samples per step), but a slow replica gets fewer of its microbatches.

**Measure.** Every rank's row of the world-wide exchange carries its op time per microbatch (F + B +
W, on the op clock: :func:`~.compute.op_time_ms`). The ranks of one stage hold the same layers in
every replica, so their op times compare directly: a rank's *relative speed* in a step is the
fastest op time of its stage over the replicas / its own (1 for the fastest, 0.5 for a rank twice
as slow as its stage's fastest replica). No baseline is needed, and a replica slower from the first
step (a slower device) is seen at once.

**Detect** with the compute detector's hysteresis (:class:`~.compute.SpeedDetector`:
``detect_consecutive``, ``recover_consecutive``, ``detect_margin``, ``recover_ratio``), one state
per rank of the world: a rank turns slow, changes speed or recovers only after that many steps, so
a noisy step moves nothing. The first step observed (start-up) is not measured.

**Decide.** On a detector decision a replica's speed is its slowest rank's planned speed (its
pipeline's pace) and the microbatches go out by :func:`split_by_speed`: integers, at least one and
at most ``cap`` per replica, summing to the global batch, minimising the slowest replica's
microbatches / speed. Equal speeds give the even split back. Every rank gets the same rows, so
every rank reaches the same :class:`Rebalance` after the same step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from titan_morph.monitor.compute import SpeedDetector
from titan_morph.monitor.detect import DetectRule

__all__ = ["Rebalance", "Rebalancer", "even_counts", "pace", "relative_speeds", "split_by_speed"]


def even_counts(replicas: int, microbatches: int) -> tuple[int, ...]:
    """``microbatches`` for every one of ``replicas`` replicas."""
    return (microbatches,) * replicas


def pace(counts: Sequence[int], speeds: Sequence[float]) -> float:
    """The step's pace in microbatch times at speed 1: the slowest replica's microbatches / speed."""
    return max(n / v for n, v in zip(counts, speeds, strict=True))


def split_by_speed(speeds: Sequence[float], total: int, cap: int) -> tuple[int, ...]:
    """Microbatches per replica in proportion to ``speeds``: integers, each in 1..``cap``, summing to
    ``total``, with the least :func:`pace`. One at a time to the replica that would then finish
    first (the lower index on a tie), which is optimal for a maximum of increasing functions."""
    replicas = len(speeds)
    if replicas < 1 or any(v <= 0 for v in speeds):
        raise ValueError(f"split_by_speed: speeds must be > 0, got {list(speeds)}")
    if not replicas <= total <= replicas * cap:
        raise ValueError(f"split_by_speed: {total} microbatches cannot give {replicas} replicas 1..{cap} each")
    counts = [1] * replicas
    for _ in range(total - replicas):
        k = min((k for k in range(replicas) if counts[k] < cap), key=lambda k: ((counts[k] + 1) / speeds[k], k))
        counts[k] += 1
    return tuple(counts)


def relative_speeds(op_ms: Sequence[float | None], stages: int, replicas: int) -> list[float | None]:
    """Every world rank's relative speed (module docstring) from its op time; rank ``r`` holds stage
    ``r // replicas`` of replica ``r % replicas`` (TorchTitan's order). None where unknown."""
    if len(op_ms) != stages * replicas:
        raise ValueError(f"relative_speeds: {len(op_ms)} op times for {stages} stages x {replicas} replicas")
    out: list[float | None] = [None] * len(op_ms)
    for s in range(stages):
        ranks = range(s * replicas, (s + 1) * replicas)
        known = [op_ms[r] for r in ranks if op_ms[r]]
        fastest = min((t for t in known if t is not None), default=None)
        for r in ranks:
            t = op_ms[r]
            out[r] = fastest / t if fastest is not None and t else None
    return out


@dataclass(frozen=True)
class Rebalance:
    """Microbatches per replica changed after ``step``: from ``before`` to ``counts``, for the replica
    speeds ``speeds``, because of ``reasons`` (the detector's)."""

    step: int
    before: tuple[int, ...]
    counts: tuple[int, ...]
    speeds: tuple[float, ...]
    reasons: tuple[str, ...]

    def describe(self) -> str:
        was, now = pace(self.before, self.speeds), pace(self.counts, self.speeds)
        why = "; ".join(self.reasons)
        return (
            f"step {self.step}: against the fastest replica of each stage, {why} -> replica speeds"
            f" {list(self.speeds)}: microbatches per replica {list(self.before)} -> {list(self.counts)} (global"
            f" batch {sum(self.counts)} unchanged; the step is paced by microbatches / speed: {was:g} -> {now:g},"
            f" {was / now:.2f}x)"
        )


class Rebalancer:
    """See the module docstring. ``microbatches``: N, each replica's even share; ``cap``: the most one
    replica may run; ``counts``: the split the job starts with (None: even)."""

    def __init__(
        self,
        stages: int,
        replicas: int,
        microbatches: int,
        *,
        cap: int,
        rule: DetectRule | None = None,
        counts: Sequence[int] | None = None,
    ) -> None:
        self.stages, self.replicas = stages, replicas
        self.total = replicas * microbatches
        self.cap = cap
        self.counts: tuple[int, ...] = tuple(counts) if counts else even_counts(replicas, microbatches)
        if len(self.counts) != replicas or sum(self.counts) != self.total:
            raise ValueError(f"Rebalancer: {list(self.counts)} is not a split of {self.total} over {replicas} replicas")
        self.detector = SpeedDetector(stages * replicas, rule)
        self.measured: list[float | None] = [None] * (stages * replicas)
        self.rebalances = 0
        self._observed = 0

    def replica_speeds(self) -> tuple[float, ...]:
        """Every replica's planned speed: its slowest rank's."""
        planned = self.detector.speeds
        return tuple(min(planned[s * self.replicas + k] for s in range(self.stages)) for k in range(self.replicas))

    def observe(self, step: int, op_ms: Sequence[float | None]) -> Rebalance | None:
        """Take step ``step``'s op times (one per world rank); the new split, if it changes."""
        self._observed += 1
        if self._observed == 1:  # this launch's start-up step: not measured
            return None
        self.measured = relative_speeds(op_ms, self.stages, self.replicas)
        decision = self.detector.update(step, self.measured)
        if decision is None:
            return None
        speeds = self.replica_speeds()
        counts = split_by_speed(speeds, self.total, self.cap)
        if counts == self.counts:
            return None
        out = Rebalance(step, self.counts, counts, speeds, decision.reasons)
        self.counts = counts
        self.rebalances += 1
        return out

    def metrics(self) -> dict[str, float]:
        """TensorBoard scalars (identical on every rank)."""
        out: dict[str, float] = {"morph/rebalances": float(self.rebalances)}
        for k, (n, v) in enumerate(zip(self.counts, self.replica_speeds(), strict=True)):
            out[f"morph/microbatches/replica{k}"] = float(n)
            out[f"morph/replica_speed/replica{k}"] = v
        return out
