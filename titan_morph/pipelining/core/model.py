"""Cost model and operation vocabulary of one pipeline iteration (paper Table 1).

Everything the planner, generator, simulator and exact solver need to agree on lives here:
per-stage compute times, per-link delays, microbatch count, activation-memory budget, and the
names of operations. Pure Python on purpose: the scheduler core must not import torch.

Conventions (shared by every module, keep them stable):

* Stages are ``0 .. S-1``, ranks ``0 .. R-1``. With one stage per rank (``stages_per_rank = 1``,
  the default) rank ``r`` runs stage ``r``. With two (``stages_per_rank = 2``, the V placement of
  ZB-V and DualPipeV, S = 2R) rank ``r`` runs stages ``r`` and ``2R-1-r``: the pipeline goes down the
  ranks and back up, and the last rank's two stages pass data locally.
* *Link* ``i`` is the physical link between ranks ``i`` and ``i+1`` (``R-1`` links). A hop of the
  pipeline (stage ``s`` to ``s+1``) uses the link between the ranks of its stages, or none when both
  are on one rank; in the V each link carries two hops in each direction.
* Operation kinds: ``F`` forward, ``I`` backward for inputs (the paper's *B*), ``W`` backward
  for weights, and ``B`` = full backward (I and W fused, as in classic 1F1B).
  The letters follow torch's ``_ComputationType`` string forms (``F``, ``I``, ``W``, ``B``).
* Dependencies: ``F[s,m]`` needs ``F[s-1,m]`` delivered over the hop ``s-1``; ``I[s,m]`` (or
  ``B[s,m]``) needs ``F[s,m]`` done and, unless ``s`` is last, ``I[s+1,m]`` delivered over the hop
  ``s``; ``W[s,m]`` needs ``I[s,m]`` done. A rank runs one operation at a time; its order
  interleaves the ops of its stages (ops then carry their stage: ``Op("F", 3, 5)`` prints ``5F3``,
  torch's action notation). Per microbatch a stage runs either a fused ``B`` or ``I`` and ``W``.
* torch's runtime files the last stage's losses (and outputs) in the order its forwards run and
  reads microbatch m's loss at position m, so a plan runs that stage's forwards in microbatch
  order (:func:`validate_orders`). Microbatches have equal costs, so any order can be renamed into
  one that does at no cost (:func:`relabel_microbatches`).
* Memory: ``memory[r]`` bounds the microbatches whose ``F`` has started on a stage of rank ``r``
  and whose ``I`` (or ``B``) has not finished, summed over the rank's stages. Because a rank is
  sequential this is a property of the order alone: every prefix of the order ending in an ``F``
  has ``#F - #I <= memory[r]``.
* Times are milliseconds (floats); a delay of ``math.inf`` means the link is down.
* Links: per link and direction, a latency ``delays[i]`` plus a per-message transmit time
  ``transmit[i]`` (message size / rate). A link sends one message at a time per direction, in the
  order they were issued: a message issued at ``t`` arrives at ``max(t, when the previous one
  finished transmitting) + transmit + latency``. ``transmit = 0`` (the default) is the paper's
  delay-only model, where any number of messages are in flight at once.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

KINDS = ("F", "I", "W", "B")
_OP_RE = re.compile(r"^(\d*)([FIWB])(\d+)$")


@dataclass(frozen=True, order=True)
class Op:
    """One computation of one microbatch: ``Op("F", 3)`` prints as ``F3`` (the rank's only stage);
    with the stage given, ``Op("F", 3, 5)`` prints as ``5F3`` (torch's ``_Action`` notation)."""

    kind: str
    mb: int
    stage: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"op kind must be one of {KINDS}, got {self.kind!r}")
        if self.mb < 0:
            raise ValueError(f"op microbatch must be >= 0, got {self.mb}")
        if self.stage is not None and self.stage < 0:
            raise ValueError(f"op stage must be >= 0, got {self.stage}")

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}" if self.stage is None else f"{self.stage}{self.kind}{self.mb}"

    @classmethod
    def parse(cls, text: str) -> Op:
        """Parse ``"F3"`` / ``"I0"`` / ``"W12"`` / ``"B1"``, or with a stage in front: ``"5F3"``."""
        match = _OP_RE.match(text.strip())
        if match is None:
            raise ValueError(
                f"cannot parse op {text!r}: expected [stage] then a kind in {KINDS} then a microbatch id,"
                " e.g. 'F3' or '5F3'"
            )
        stage = int(match.group(1)) if match.group(1) else None
        return cls(match.group(2), int(match.group(3)), stage)


Order = tuple[Op, ...]
"""The sequence of operations one rank executes in one iteration."""

STAGES_PER_RANK = (1, 2)
"""Placements the planner knows: one stage per rank, or two in a V (ZB-V's and DualPipeV's)."""


def _per_rank(memory: int | Sequence[int] | None, ranks: int) -> tuple[int, ...] | None:
    """A memory budget as one value per rank (checked by :class:`CostModel`)."""
    if memory is None:
        return None
    return (memory,) * ranks if isinstance(memory, int) else tuple(memory)


def _per_link(value: float | Sequence[float] | None, links: int) -> tuple[float, ...]:
    """A per-link value as a tuple (a scalar broadcasts; None = empty, i.e. zeros; checked by CostModel)."""
    if value is None:
        return ()
    if isinstance(value, (int, float)):
        return (float(value),) * links
    return tuple(float(d) for d in value)


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

    ``fwd``/``bwd``/``wgt`` are t^F_s, t^B_s (input backward, op ``I``), t^W_s in ms, one per
    stage. ``delays[i]`` is c_i on link i (both directions) in ms, one per link between ranks.
    ``memory[r]`` is M_r, the most microbatches in flight on rank r (over its stages); ``None``
    means unbounded. ``stages_per_rank``: 1, or 2 for the V placement (module docstring).
    ``transmit[i]`` is the time link i needs to put one message on the wire (both directions,
    each a FIFO of its own), ms; empty = 0 on every link (the delay-only model).
    """

    stages: int
    microbatches: int
    fwd: tuple[float, ...]
    bwd: tuple[float, ...]
    wgt: tuple[float, ...]
    delays: tuple[float, ...] = field(default=())
    memory: tuple[int, ...] | None = None
    stages_per_rank: int = 1
    transmit: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.stages, int) or self.stages < 1:
            raise ValueError(f"stages must be an integer >= 1, got {self.stages!r}")
        if not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise ValueError(f"microbatches must be an integer >= 1, got {self.microbatches!r}")
        if self.stages_per_rank not in STAGES_PER_RANK:
            raise ValueError(
                f"stages_per_rank must be one of {STAGES_PER_RANK} (2 = the V placement), got {self.stages_per_rank!r}"
            )
        if self.stages % self.stages_per_rank:
            raise ValueError(
                f"stages = {self.stages} must be a multiple of stages_per_rank = {self.stages_per_rank}"
                " (every rank holds the same number of stages)"
            )
        s = self.stages
        links = self.num_links
        object.__setattr__(self, "fwd", _per_stage("fwd", self.fwd, s))
        object.__setattr__(self, "bwd", _per_stage("bwd", self.bwd, s))
        object.__setattr__(self, "wgt", _per_stage("wgt", self.wgt, s))
        delays = tuple(float(d) for d in (self.delays or (0.0,) * links))
        if len(delays) != links:
            raise ValueError(
                f"delays needs {links} values (one per link between {self.ranks} ranks), got {len(delays)}"
            )
        for d in delays:
            if not d >= 0:  # inf (link down) is allowed here; NaN and negatives are not
                raise ValueError(f"delays must be >= 0 ms (inf = link down), got {d}")
        object.__setattr__(self, "delays", delays)
        transmit = tuple(float(t) for t in (self.transmit or (0.0,) * links))
        if len(transmit) != links:
            raise ValueError(
                f"transmit needs {links} values (one per link between {self.ranks} ranks), got {len(transmit)}"
            )
        for t in transmit:
            if not (t >= 0 and math.isfinite(t)):
                raise ValueError(f"transmit must be finite and >= 0 ms per message, got {t}")
        object.__setattr__(self, "transmit", transmit)
        if self.memory is not None:
            r = self.ranks
            mem = (int(self.memory),) * r if isinstance(self.memory, int) else tuple(int(m) for m in self.memory)
            if len(mem) != r:
                raise ValueError(f"memory needs {r} values (one per rank), got {len(mem)}")
            least = self.stages_per_rank  # in the V a microbatch is held on both stages of a rank at once
            for m in mem:
                if m < least:
                    raise ValueError(f"memory must be >= {least} microbatch(es) in flight per rank, got {m}")
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
        stages_per_rank: int = 1,
        transmit: float | Sequence[float] | None = None,
    ) -> CostModel:
        """Build from scalars or per-stage lists (scalars broadcast); ``stages`` counts stages, not ranks."""
        links = stages // stages_per_rank - 1 if stages_per_rank in STAGES_PER_RANK else stages - 1
        delay_t = _per_link(delays, links)
        ranks = stages // stages_per_rank if stages_per_rank in STAGES_PER_RANK else stages
        return cls(
            stages,
            microbatches,
            _per_stage("fwd", fwd, stages),
            _per_stage("bwd", bwd, stages),
            _per_stage("wgt", wgt, stages),
            delay_t,
            _per_rank(memory, ranks),
            stages_per_rank,
            _per_link(transmit, links),
        )

    @property
    def ranks(self) -> int:
        """R: pipeline ranks (= stages with one stage per rank)."""
        return self.stages // self.stages_per_rank

    @property
    def num_links(self) -> int:
        """R − 1 physical links between adjacent ranks."""
        return self.stages // self.stages_per_rank - 1

    def rank_of(self, stage: int) -> int:
        """The rank that runs ``stage`` (V: ``s`` for s < R, else ``2R-1-s``)."""
        r = self.ranks
        return stage if stage < r else 2 * r - 1 - stage

    def rank_stages(self, rank: int) -> tuple[int, ...]:
        """The stages rank ``rank`` runs, in chunk order: ``(r,)``, or ``(r, 2R-1-r)`` in the V."""
        if self.stages_per_rank == 1:
            return (rank,)
        return (rank, 2 * self.ranks - 1 - rank)

    def hop_link(self, stage: int) -> int | None:
        """The link the hop from ``stage`` to ``stage + 1`` crosses; None when both run on one rank."""
        a, b = self.rank_of(stage), self.rank_of(stage + 1)
        return None if a == b else min(a, b)

    def link_hops(self, link: int) -> tuple[int, ...]:
        """The hops (by their first stage s: s -> s+1) that cross ``link``: ``(i,)``, or two in the V."""
        return tuple(s for s in range(self.stages - 1) if self.hop_link(s) == link)

    def routes(self) -> tuple[tuple[tuple[int, int] | None, ...], tuple[tuple[int, int] | None, ...]]:
        """Where each stage's outputs travel, as ``(link, direction)`` with direction 0 = ``"fwd"``
        (rank i to i+1) and 1 = ``"bwd"``, or None (local hop, or no successor): per stage s, the
        activation of its ``F`` (to s+1) and the gradient of its ``I``/``B`` (to s−1)."""
        fwd: list[tuple[int, int] | None] = []
        bwd: list[tuple[int, int] | None] = []
        for s in range(self.stages):
            for out, peer in ((fwd, s + 1), (bwd, s - 1)):
                if not 0 <= peer < self.stages or self.rank_of(peer) == self.rank_of(s):
                    out.append(None)
                else:
                    a, b = self.rank_of(s), self.rank_of(peer)
                    out.append((min(a, b), 0 if b > a else 1))
        return tuple(fwd), tuple(bwd)

    def with_delays(self, delays: Iterable[float]) -> CostModel:
        """The same model with other link delays (e.g. measured ones)."""
        return replace(self, delays=tuple(delays))

    def with_transmit(self, transmit: float | Iterable[float]) -> CostModel:
        """The same model with other per-message transmit times (a scalar broadcasts to every link)."""
        values = (float(transmit),) * self.num_links if isinstance(transmit, (int, float)) else tuple(transmit)
        return replace(self, transmit=values)

    @property
    def has_transmit(self) -> bool:
        """Does any link have a transmit time (the bandwidth model), or is it the delay-only model?"""
        return any(t > 0 for t in self.transmit)

    def with_memory(self, memory: int | Sequence[int] | None) -> CostModel:
        """The same model with another memory budget (``None`` = unbounded)."""
        return replace(self, memory=_per_rank(memory, self.ranks))

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

    def budget(self, rank: int) -> int:
        """M_r for ``rank``; when unbounded, all the microbatches of its stages (nothing holds more)."""
        full = self.microbatches * self.stages_per_rank
        return full if self.memory is None else min(self.memory[rank], full)


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


def warmup_count(order: Sequence[Op], stage: int | None = None) -> int:
    """x_s: forwards of ``stage`` before its first backward (I or B) in ``order`` (None: the only stage)."""
    count = 0
    for op in order:
        if stage is not None and op.stage != stage:
            continue
        if op.kind in ("I", "B"):
            break
        if op.kind == "F":
            count += 1
    return count


def warmup_counts(model: CostModel, orders: Sequence[Sequence[Op]]) -> tuple[int, ...]:
    """x_s of every stage, read from per-rank ``orders``."""
    if model.stages_per_rank == 1:
        return tuple(warmup_count(o) for o in orders)
    return tuple(warmup_count(orders[model.rank_of(s)], s) for s in range(model.stages))


def validate_orders(model: CostModel, orders: Sequence[Sequence[Op]], *, runnable: bool = True) -> None:
    """Check every rank's order: each op of its stages exactly once and within its memory budget.

    Per stage and microbatch: one ``F`` and either one fused ``B`` or one ``I`` then one ``W``, in
    that order. With one stage per rank ops may omit their stage; in the V they must name it. With
    ``runnable`` (default) also torch's runtime contract: the last stage's forwards in microbatch
    order (module docstring); ``runnable=False`` checks the structure alone (orders that are only
    timed). Cross-rank feasibility (deadlock) is the simulator's job. Raises ``ValueError`` naming
    the rank (and stage) and the offending ops, in one line.
    """
    v = model.stages_per_rank > 1
    if len(orders) != model.ranks:
        raise ValueError(f"expected {model.ranks} {'rank' if v else 'stage'} orders, got {len(orders)}")
    n = model.microbatches
    for r, order in enumerate(orders):
        where = f"rank {r}" if v else f"stage {r}"
        own = model.rank_stages(r)
        per_stage: dict[int, list[tuple[int, Op]]] = {s: [] for s in own}
        for pos, op in enumerate(order):
            stage = op.stage if op.stage is not None else (None if v else r)
            if stage not in per_stage:
                need = "name its stage (e.g. '5F3')" if stage is None else f"be on its stages {list(own)}"
                raise ValueError(f"{where}: op {op} must {need}")
            per_stage[stage].append((pos, op))
        for s, ops in per_stage.items():
            label = f"rank {r} stage {s}" if v else where
            counts = Counter((op.kind, op.mb) for _, op in ops)
            dups = sorted(f"{k}{m}" for (k, m), c in counts.items() if c > 1)
            if dups:
                raise ValueError(f"{label}: ops repeated: {', '.join(dups)}")
            at = {(op.kind, op.mb): p for p, op in ops}
            missing: list[str] = []
            extra = [str(op) for _, op in ops if op.mb >= n]
            for m in range(n):
                has = {k for k in KINDS if (k, m) in at}
                if "F" not in has:
                    missing.append(f"F{m}")
                if "B" in has and has & {"I", "W"}:
                    raise ValueError(f"{label}: microbatch {m} has both a fused B and split I/W backward")
                if "B" not in has:
                    missing += [f"{k}{m}" for k in ("I", "W") if k not in has]
            if missing or extra:
                raise ValueError(
                    f"{label}: order must hold F and either B or I and W for microbatches 0..{n - 1} once;"
                    f" missing [{', '.join(missing)}] unexpected [{', '.join(extra)}]"
                )
            for m in range(n):
                bwd = "B" if ("B", m) in at else "I"
                if at[(bwd, m)] < at[("F", m)]:
                    raise ValueError(f"{label}: {bwd}{m} comes before F{m}")
                if bwd == "I" and at[("W", m)] < at[("I", m)]:
                    raise ValueError(f"{label}: W{m} comes before I{m}")
        peak = in_flight_peak(order)
        if peak > model.budget(r):
            raise ValueError(
                f"{where}: {peak} microbatches in flight exceeds the memory budget M_{r} = {model.budget(r)}"
            )
    if runnable:
        seen = last_stage_forwards(model, orders)
        for a, b in zip(seen, seen[1:]):
            if b < a:
                last = model.stages - 1
                where = f"rank {model.rank_of(last)} stage {last}" if v else f"stage {last}"
                raise ValueError(
                    f"{where} (the last): F{b} runs after F{a}, but torch's runtime needs the last stage's"
                    " forwards in microbatch order (relabel_microbatches renames them at no cost)"
                )


def last_stage_forwards(model: CostModel, orders: Sequence[Sequence[Op]]) -> list[int]:
    """The microbatches of the last stage's forwards, in the order its rank runs them."""
    last = model.stages - 1
    rank = model.rank_of(last)
    return [op.mb for op in orders[rank] if op.kind == "F" and (rank if op.stage is None else op.stage) == last]


def relabel_microbatches(model: CostModel, orders: Sequence[Sequence[Op]]) -> tuple[Order, ...]:
    """The same schedule with microbatch ``m`` renamed to its position among the last stage's
    forwards, which then run in microbatch order (torch's contract, :func:`validate_orders`).
    Microbatches have equal costs, so every timing is unchanged; orders already in that form are
    returned as they are."""
    seen = last_stage_forwards(model, orders)
    if seen == sorted(seen):
        return tuple(tuple(order) for order in orders)
    rename = {m: k for k, m in enumerate(seen)}
    return tuple(tuple(Op(op.kind, rename.get(op.mb, op.mb), op.stage) for op in order) for order in orders)


@dataclass(frozen=True)
class Plan:
    """A schedule as data: what the simulator, the exporter and the runtime all consume.

    ``warmup[s]`` is x_s per stage, ``orders[r]`` rank r's operation order, ``model`` the profile
    the plan was made from, ``schedule`` the builder that made it (``1f1b``, ``zb-h2``,
    ``pipemorph``, ``zb-v``...).
    """

    schedule: str
    warmup: tuple[int, ...]
    orders: tuple[Order, ...]
    model: CostModel

    @property
    def slackness(self) -> tuple[int, ...]:
        """Δ_s = x_s − x_{s+1} per hop (§4.1): per link with one stage per rank."""
        return tuple(a - b for a, b in zip(self.warmup, self.warmup[1:]))

    @property
    def plan_id(self) -> str:
        """Content hash of the orders: equal ids on every rank mean the same plan."""
        import hashlib

        text = "|".join(",".join(map(str, order)) for order in self.orders)
        return hashlib.sha1(f"{self.schedule}:{text}".encode()).hexdigest()[:12]

    def orders_json(self) -> dict[str, list[str]]:
        """``{"0": ["F0", "F1", "I0", "W0", ...], ...}`` per rank (``"5F3"`` when ops name their stage)."""
        return {str(s): [str(op) for op in order] for s, order in enumerate(self.orders)}
