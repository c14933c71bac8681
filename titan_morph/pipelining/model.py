"""Cost model and operation vocabulary of one pipeline iteration (paper Table 1).

Everything the planner, generator, simulator and exact solver need to agree on lives here:
per-stage compute times, per-link delays, microbatch count, activation-memory budget, and the
names of operations. Pure Python on purpose: the scheduler core must not import torch.

Conventions (shared by every module, keep them stable):

* Stages are ``0 .. S-1``; *link* ``i`` joins stage ``i`` and ``i+1`` (``S-1`` links).
* Operation kinds: ``F`` forward, ``I`` backward for inputs (the paper's *B*), ``W`` backward
  for weights, and ``B`` = full backward (I and W fused, as in classic 1F1B).
  The letters follow torch's ``_ComputationType`` string forms (``F``, ``I``, ``W``, ``B``).
* Dependencies: ``F[s,m]`` needs ``F[s-1,m]`` delivered over link ``s-1``; ``I[s,m]`` (or
  ``B[s,m]``) needs ``F[s,m]`` done and, unless ``s`` is last, ``I[s+1,m]`` delivered over link
  ``s``; ``W[s,m]`` needs ``I[s,m]`` done. A stage runs one operation at a time.
* Memory: ``memory[s]`` bounds the microbatches whose ``F`` has started on stage ``s`` and whose
  ``I`` (or ``B``) has not finished. Because a stage is sequential this is a property of the
  order alone: every prefix of the order ending in an ``F`` has ``#F - #I <= memory[s]``.
* Times are milliseconds (floats); a delay of ``math.inf`` means the link is down.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

KINDS = ("F", "I", "W", "B")
_OP_RE = re.compile(r"^([FIWB])(\d+)$")


@dataclass(frozen=True, order=True)
class Op:
    """One computation of one microbatch on a stage: ``Op("F", 3)`` prints as ``F3``."""

    kind: str
    mb: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"op kind must be one of {KINDS}, got {self.kind!r}")
        if self.mb < 0:
            raise ValueError(f"op microbatch must be >= 0, got {self.mb}")

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}"

    @classmethod
    def parse(cls, text: str) -> Op:
        """Parse ``"F3"`` / ``"I0"`` / ``"W12"`` / ``"B1"``."""
        match = _OP_RE.match(text.strip())
        if match is None:
            raise ValueError(f"cannot parse op {text!r}: expected a kind in {KINDS} then a microbatch id, e.g. 'F3'")
        return cls(match.group(1), int(match.group(2)))


Order = tuple[Op, ...]
"""The sequence of operations one stage executes in one iteration."""


def _per_stage(name: str, value: float | Sequence[float], n: int) -> tuple[float, ...]:
    values = [float(value)] * n if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != n:
        raise ValueError(f"{name} needs {n} values (one per stage), got {len(values)}")
    for v in values:
        if not (v >= 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be finite and >= 0 ms, got {v}")
    return tuple(values)


@dataclass(frozen=True)
class CostModel:
    """Per-stage compute times, per-link delays, N microbatches and the memory budget.

    ``fwd``/``bwd``/``wgt`` are t^F_i, t^B_i (input backward, op ``I``), t^W_i in ms.
    ``delays[i]`` is c_i on link i (both directions) in ms. ``memory[i]`` is M_i, the most
    microbatches in flight on stage i; ``None`` means unbounded.
    """

    stages: int
    microbatches: int
    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    wgt: tuple[float, ...]
    delays: tuple[float, ...] = field(default=())
    memory: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stages, int) or self.stages < 1:
            raise ValueError(f"stages must be an integer >= 1, got {self.stages!r}")
        if not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise ValueError(f"microbatches must be an integer >= 1, got {self.microbatches!r}")
        s = self.stages
        object.__setattr__(self, "fwd", _per_stage("fwd", self.fwd, s))
        object.__setattr__(self, "bwd", _per_stage("bwd", self.bwd, s))
        object.__setattr__(self, "wgt", _per_stage("wgt", self.wgt, s))
        delays = tuple(float(d) for d in (self.delays or (0.0,) * (s - 1)))
        if len(delays) != s - 1:
            raise ValueError(f"delays needs {s - 1} values (one per link between {s} stages), got {len(delays)}")
        for d in delays:
            if not d >= 0:  # inf (link down) is allowed here; NaN and negatives are not
                raise ValueError(f"delays must be >= 0 ms (inf = link down), got {d}")
        object.__setattr__(self, "delays", delays)
        if self.memory is not None:
            mem = (int(self.memory),) * s if isinstance(self.memory, int) else tuple(int(m) for m in self.memory)
            if len(mem) != s:
                raise ValueError(f"memory needs {s} values (one per stage), got {len(mem)}")
            for m in mem:
                if m < 1:
                    raise ValueError(f"memory must be >= 1 microbatch in flight per stage, got {m}")
            object.__setattr__(self, "memory", mem)

    @classmethod
    def uniform(
        cls,
        stages: int,
        microbatches: int,
        fwd: float | Sequence[float],
        bwd: float | Sequence[float],
        wgt: float | Sequence[float],
        delays: float | Sequence[float] | None = None,
        memory: int | Sequence[int] | None = None,
    ) -> CostModel:
        """Build from scalars or per-stage lists (scalars broadcast)."""
        if delays is None:
            delay_t: tuple[float, ...] = ()
        elif isinstance(delays, (int, float)):
            delay_t = (float(delays),) * (stages - 1)
        else:
            delay_t = tuple(float(d) for d in delays)
        return cls(stages, microbatches, fwd, bwd, wgt, delay_t, memory)  # type: ignore[arg-type]

    def with_delays(self, delays: Iterable[float]) -> CostModel:
        """The same model with other link delays (e.g. measured ones)."""
        return CostModel(self.stages, self.microbatches, self.fwd, self.bwd, self.wgt, tuple(delays), self.memory)

    def with_memory(self, memory: int | Sequence[int] | None) -> CostModel:
        """The same model with another memory budget (``None`` = unbounded)."""
        return CostModel(self.stages, self.microbatches, self.fwd, self.bwd, self.wgt, self.delays, memory)  # type: ignore[arg-type]

    def duration(self, stage: int, kind: str) -> float:
        """Execution time of one op of ``kind`` on ``stage`` (``B`` = I + W fused)."""
        if kind == "F":
            return self.fwd[stage]
        if kind == "I":
            return self.bwd[stage]
        if kind == "W":
            return self.wgt[stage]
        if kind == "B":
            return self.bwd[stage] + self.wgt[stage]
        raise ValueError(f"unknown op kind {kind!r}")

    def budget(self, stage: int) -> int:
        """M_i for ``stage``; N when unbounded (no stage can hold more than N microbatches)."""
        return self.microbatches if self.memory is None else min(self.memory[stage], self.microbatches)


def in_flight_peak(order: Sequence[Op]) -> int:
    """Largest number of microbatches in flight (F started, I/B not finished) along ``order``."""
    live = peak = 0
    for op in order:
        if op.kind == "F":
            live += 1
            peak = max(peak, live)
        elif op.kind in ("I", "B"):
            live -= 1
    return peak


def warmup_count(order: Sequence[Op]) -> int:
    """x_i: forwards a stage runs before its first backward (I or B)."""
    count = 0
    for op in order:
        if op.kind in ("I", "B"):
            break
        if op.kind == "F":
            count += 1
    return count


def validate_orders(model: CostModel, orders: Sequence[Sequence[Op]]) -> None:
    """Check every stage's order holds each op exactly once and stays within memory.

    Cross-stage feasibility (deadlock) is the simulator's job; this is the per-stage check.
    Raises ``ValueError`` naming the stage and the offending ops.
    """
    if len(orders) != model.stages:
        raise ValueError(f"expected {model.stages} stage orders, got {len(orders)}")
    n = model.microbatches
    for s, order in enumerate(orders):
        kinds = {op.kind for op in order}
        split = "I" in kinds or "W" in kinds
        if split and "B" in kinds:
            raise ValueError(f"stage {s}: mixes fused B with split I/W backward")
        needed = ("F", "I", "W") if split or not kinds else ("F", "B")
        expected = {Op(k, m) for k in needed for m in range(n)}
        seen: set[Op] = set()
        dups = sorted({op for op in order if op in seen or seen.add(op)})  # type: ignore[func-returns-value]
        if dups:
            raise ValueError(f"stage {s}: ops repeated: {', '.join(map(str, dups))}")
        missing = sorted(expected - seen)
        extra = sorted(seen - expected)
        if missing or extra:
            raise ValueError(
                f"stage {s}: order must hold each of {'/'.join(needed)} for microbatches 0..{n - 1} once;"
                f" missing [{', '.join(map(str, missing))}] unexpected [{', '.join(map(str, extra))}]"
            )
        pos = {op: k for k, op in enumerate(order)}
        bwd = "I" if split else "B"
        for m in range(n):
            if pos[Op(bwd, m)] < pos[Op("F", m)]:
                raise ValueError(f"stage {s}: {bwd}{m} comes before F{m}")
            if split and pos[Op("W", m)] < pos[Op("I", m)]:
                raise ValueError(f"stage {s}: W{m} comes before I{m}")
        peak = in_flight_peak(order)
        if peak > model.budget(s):
            raise ValueError(
                f"stage {s}: {peak} microbatches in flight exceeds the memory budget M_{s} = {model.budget(s)}"
            )


@dataclass(frozen=True)
class Plan:
    """A schedule as data: what the simulator, the exporter and the runtime all consume.

    ``warmup[i]`` is x_i, ``orders[i]`` stage i's operation order, ``model`` the profile the plan
    was made from, ``schedule`` the builder that made it (``1f1b``, ``zb-h2``, ``pipemorph``...).
    """

    schedule: str
    warmup: tuple[int, ...]
    orders: tuple[Order, ...]
    model: CostModel

    @property
    def slackness(self) -> tuple[int, ...]:
        """Δ_i = x_i − x_{i+1} per link (§4.1)."""
        return tuple(a - b for a, b in zip(self.warmup, self.warmup[1:]))

    @property
    def plan_id(self) -> str:
        """Content hash of the orders: equal ids on every rank mean the same plan."""
        import hashlib

        text = "|".join(",".join(map(str, order)) for order in self.orders)
        return hashlib.sha1(f"{self.schedule}:{text}".encode()).hexdigest()[:12]

    def orders_json(self) -> dict[str, list[str]]:
        """``{"0": ["F0", "F1", "I0", "W0", ...], ...}`` per rank."""
        return {str(s): [str(op) for op in order] for s, order in enumerate(self.orders)}
