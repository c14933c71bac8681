"""The partition planner's implementation: the problem (:class:`PartitionProblem`), the planners
a split is timed by, and the search over splits. :mod:`partition` is its public face (the API and
the command line) and says what is minimised and how; :mod:`bounds` holds the bounds and
the enumeration of splits. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from titan_morph.pipelining.core.model import CostModel, Plan
from titan_morph.pipelining.core.values import parse_list
from titan_morph.pipelining.partition.bounds import ChainSplits, FoldSplits, prefix_sums
from titan_morph.pipelining.schedules.baselines import V_SCHEDULES, schedule_key, warmup_for, zbv_memory
from titan_morph.pipelining.search.builders import build
from titan_morph.pipelining.timing.bounds import lower_bound_ms
from titan_morph.pipelining.timing.simulate import makespan

__all__ = [
    "LayerCost",
    "PartitionProblem",
    "PartitionResult",
    "SplitDoesNotFit",
    "SplitPlan",
    "default_caps",
    "even_split",
    "evaluate_split",
    "partition",
    "problem_from_dict",
    "stage_ranges",
]

SPLIT_WORK = 32_000
"""Default cap on the splits bounded: this / S (each bound costs O(S))."""
EVALUATION_WORK = 50_000
"""Default cap on the candidate planner's runs: this / (3·S·N scheduled ops), at least 16; about
a second of planning on the reference box."""
REFINE = 2
"""Default number of best candidates the final planner (the full search) plans."""
_FIRST_PASS = 1e-3  # the first threshold: the least bound + 0.1 %, doubling the margin each pass
_REL = 1e-9
_VISITS_PER_SPLIT = 20  # splits the V's walk may visit and drop, per split it may yield
_SEARCHED = ("pipemorph", "pipemorph-v")


class SplitDoesNotFit(ValueError):
    """A split (or every split) needs more memory than a rank has."""


def _number(value: object, name: str, *, positive: bool = False) -> float:
    """One finite number >= 0 (> 0 with ``positive``), via the one list parser."""
    (got,) = parse_list([value], float, name=name, low=0.0)
    if positive and not got > 0:
        raise ValueError(f"{name}: {got:g} is out of range: values must be > 0")
    return got


@dataclass(frozen=True)
class LayerCost:
    """One layer (or the embedding, or the output and loss): op times at speed 1 (ms) and bytes."""

    name: str
    fwd: float
    bwd: float
    wgt: float
    param_bytes: float = 0.0
    act_bytes: float = 0.0

    def __post_init__(self) -> None:
        for key in ("fwd", "bwd", "wgt", "param_bytes", "act_bytes"):
            object.__setattr__(self, key, _number(getattr(self, key), f"{self.name}.{key}"))


@dataclass(frozen=True)
class PartitionProblem:
    """What to split and on what (module docstring). ``memory``: bytes per rank, None = unbounded;
    ``delays``/``transmit``: ms per link between ranks (R − 1 values, empty = 0); ``max_in_flight``:
    a cap on every rank's microbatches in flight whatever its bytes (a run's memory budget)."""

    layers: tuple[LayerCost, ...]
    rank_speed: tuple[float, ...]
    microbatches: int
    schedule: str = "pipemorph"
    delays: tuple[float, ...] = ()
    transmit: tuple[float, ...] = ()
    memory: tuple[float, ...] | None = None
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "schedule", schedule_key(self.schedule))
        speeds = tuple(_number(v, "rank_speed", positive=True) for v in self.rank_speed)
        if not speeds:
            raise ValueError("rank_speed: needs one value per rank (at least one)")
        object.__setattr__(self, "rank_speed", speeds)
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise ValueError(f"microbatches must be an integer >= 1, got {self.microbatches!r}")
        if len(self.layers) < self.stages:
            raise ValueError(
                f"layers: {len(self.layers)} layer(s) cannot fill {self.stages} stages (each stage needs at least one)"
            )
        links = self.ranks - 1
        for key in ("delays", "transmit"):
            values = parse_list(list(getattr(self, key)), float, name=key, count=links or None, low=0.0)
            if values and len(values) != links:
                raise ValueError(f"{key} needs {links} values (one per link between {self.ranks} ranks)")
            object.__setattr__(self, key, values or (0.0,) * links)
        if self.memory is not None:
            mem = parse_list(list(self.memory), float, name="memory", count=self.ranks, low=0.0)
            if len(mem) != self.ranks:
                raise ValueError(f"memory needs 1 or {self.ranks} values (bytes per rank), got {len(mem)}")
            object.__setattr__(self, "memory", mem)

    @property
    def ranks(self) -> int:
        return len(self.rank_speed)

    @property
    def stages_per_rank(self) -> int:
        return 2 if self.schedule in V_SCHEDULES else 1

    @property
    def stages(self) -> int:
        return self.ranks * self.stages_per_rank

    def rank_of(self, stage: int) -> int:
        """The rank that runs ``stage`` (the V: rank r runs r and 2R−1−r)."""
        return stage if stage < self.ranks else 2 * self.ranks - 1 - stage

    @cached_property
    def _sums(self) -> dict[str, list[float]]:
        keys = ("fwd", "bwd", "wgt", "param_bytes", "act_bytes")
        out = {k: prefix_sums([getattr(layer, k) for layer in self.layers]) for k in keys}
        out["work"] = prefix_sums([layer.fwd + layer.bwd + layer.wgt for layer in self.layers])
        return out

    @cached_property
    def _need(self) -> tuple[int, ...]:
        """Microbatches in flight the schedule needs per rank, whatever the times."""
        if self.stages_per_rank == 2 or self.schedule == "pipemorph":
            return (self.stages_per_rank,) * self.ranks
        return warmup_for(self.schedule, CostModel.uniform(self.stages, self.microbatches, 1.0, 1.0, 1.0))

    def _span(self, key: str, start: int, stop: int) -> float:
        p = self._sums[key]
        return p[stop] - p[start]

    def in_flight_cap(self, rank: int, ranges: Sequence[tuple[int, int]]) -> int | None:
        """M_r for a rank holding these layer ranges, or None when they do not fit its memory."""
        full = self.microbatches * self.stages_per_rank
        if self.max_in_flight is not None:
            full = min(full, self.max_in_flight)
        if self.memory is None:
            return full
        room = self.memory[rank] - sum(self._span("param_bytes", a, b) for a, b in ranges)
        act = max(self._span("act_bytes", a, b) for a, b in ranges)
        if room < 0:
            return None
        cap = full if act <= 0 else min(full, int(room / act))
        return cap if cap >= self._need[rank] else None

    def _fits(self, rank: int, ranges: tuple[tuple[int, int], ...]) -> bool:
        return self.in_flight_cap(rank, ranges) is not None

    def check_split(self, layers_per_stage: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """The layer ranges of a split; ``ValueError`` when it does not cover the layers once."""
        split = tuple(layers_per_stage)
        if len(split) != self.stages or any(not isinstance(c, int) or c < 1 for c in split):
            raise ValueError(f"layers_per_stage needs {self.stages} integers >= 1 (one per stage), got {list(split)}")
        if sum(split) != len(self.layers):
            raise ValueError(f"layers_per_stage {list(split)} holds {sum(split)} layers, the costs {len(self.layers)}")
        return stage_ranges(split)

    def cost_model(self, layers_per_stage: Sequence[int]) -> CostModel:
        """The planner's cost model of a split: stage times on their ranks, M_r from the bytes."""
        ranges = self.check_split(layers_per_stage)
        speed = [self.rank_speed[self.rank_of(s)] for s in range(self.stages)]
        times = {k: [self._span(k, a, b) / v for (a, b), v in zip(ranges, speed)] for k in ("fwd", "bwd", "wgt")}
        memory: tuple[int, ...] | None = None
        if self.memory is None and self.max_in_flight is not None:
            memory = (min(self.microbatches * self.stages_per_rank, self.max_in_flight),) * self.ranks
        if self.memory is not None:
            caps = []
            for r in range(self.ranks):
                own = [ranges[s] for s in range(self.stages) if self.rank_of(s) == r]
                cap = self.in_flight_cap(r, own)
                if cap is None:
                    raise SplitDoesNotFit(
                        f"memory: rank {r} cannot hold layers {_names(self, own)} with the"
                        f" {self._need[r]} microbatch(es) in flight {self.schedule} needs"
                        f" ({self.memory[r]:g} bytes)"
                    )
                caps.append(cap)
            memory = tuple(caps)
        model = CostModel.uniform(
            self.stages,
            self.microbatches,
            times["fwd"],
            times["bwd"],
            times["wgt"],
            self.delays,
            memory,
            self.stages_per_rank,
            self.transmit,
        )
        if memory is None and self.schedule == "pipemorph-v":
            model = model.with_memory(self._zbv_memory)
        return model

    @cached_property
    def _zbv_memory(self) -> tuple[int, ...]:
        """pipemorph-v's budget without a memory: what ZB-V holds for this R and N (equal stage
        times; the plan CLI measures it on the stage times, which differs only when N < 2R)."""
        return zbv_memory(CostModel.uniform(self.stages, self.microbatches, 1.0, 1.0, 1.0, stages_per_rank=2))

    def split_space(self) -> ChainSplits | FoldSplits:
        """The bound and enumeration of :mod:`bounds` for this problem."""
        hops = [c + t for c, t in zip(self.delays, self.transmit)]
        p = self._sums
        if self.stages_per_rank == 1:
            return ChainSplits(p["fwd"], p["work"], self.rank_speed, hops, self.microbatches, self._fits)
        return FoldSplits(p["fwd"], p["work"], self.rank_speed, hops, self.microbatches, self._fits)


def _names(problem: PartitionProblem, ranges: Sequence[tuple[int, int]]) -> str:
    return " + ".join(f"{problem.layers[a].name}..{problem.layers[b - 1].name}" for a, b in ranges)


@dataclass(frozen=True)
class SplitPlan:
    """A split and its planned schedule: ``makespan_ms`` is the plan's simulated makespan,
    ``lower_bound_ms`` the closed-form bound of any schedule for the split, ``searched`` whether
    the final planner's search made the plan."""

    layers_per_stage: tuple[int, ...]
    model: CostModel
    plan: Plan
    makespan_ms: float
    lower_bound_ms: float
    searched: bool = False

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        """Per stage, the half-open range of layer indices it holds."""
        return stage_ranges(self.layers_per_stage)


@dataclass(frozen=True)
class PartitionResult:
    """The best split found, the even split for comparison (None when it does not fit), whether
    the search over splits was complete, and a lower bound on every split under any schedule."""

    best: SplitPlan
    even: SplitPlan | None
    exact: bool
    bound_ms: float
    splits_considered: int = 0
    evaluations: int = 0
    candidates: tuple[tuple[tuple[int, ...], float], ...] = field(default=())

    @property
    def speedup(self) -> float | None:
        """Even split's makespan / the best split's."""
        if self.even is None or self.best.makespan_ms <= 0:
            return None
        return self.even.makespan_ms / self.best.makespan_ms


def stage_ranges(layers_per_stage: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """Half-open layer ranges per stage: (2, 3) -> ((0, 2), (2, 5))."""
    out, start = [], 0
    for count in layers_per_stage:
        out.append((start, start + count))
        start += count
    return tuple(out)


def even_split(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage as even as counts go, the first stages taking the remainder."""
    if stages < 1 or layers < stages:
        raise ValueError(f"cannot split {layers} layer(s) into {stages} non-empty stage(s)")
    q, r = divmod(layers, stages)
    return tuple(q + (s < r) for s in range(stages))


def _plan(problem: PartitionProblem, model: CostModel, bound: float, final: bool) -> tuple[Plan, float, bool]:
    """The candidate planner (``final`` False) or the final planner (module docstring): the plan,
    its simulated makespan and whether the search made it. ``ValueError``: the schedule does not fit."""
    name = problem.schedule
    plan = build(name, model)
    span = makespan(model, plan.orders)
    if name not in _SEARCHED or span <= bound * (1 + _REL):
        return plan, span, False
    plan = build(name, model, search=True, **({} if final else {"iterations": 0}))
    return plan, makespan(model, plan.orders), final


def evaluate_split(problem: PartitionProblem, layers_per_stage: Sequence[int], *, final: bool = True) -> SplitPlan:
    """Plan one split with the final planner (``final=False``: the candidate planner).
    Raises :class:`SplitDoesNotFit` when a rank's memory cannot hold it."""
    model = problem.cost_model(layers_per_stage)
    bound = lower_bound_ms(model)
    try:
        plan, span, searched = _plan(problem, model, bound, final)
    except ValueError as exc:
        raise SplitDoesNotFit(f"memory: {exc}") from None
    return SplitPlan(tuple(layers_per_stage), model, plan, span, bound, searched)


def default_caps(problem: PartitionProblem) -> tuple[int, int]:
    """``max_splits`` and ``max_evaluations`` when not given: a fixed amount of work per size."""
    ops = 3 * problem.stages * problem.microbatches
    return max(200, SPLIT_WORK // problem.stages), max(16, EVALUATION_WORK // ops)


def partition(
    problem: PartitionProblem,
    *,
    refine: int = REFINE,
    max_splits: int | None = None,
    max_evaluations: int | None = None,
    tolerance: float = 0.0,
) -> PartitionResult:
    """The split with the shortest planned makespan (module docstring), and the even split's.

    ``max_splits``/``max_evaluations`` cap the search's work (default :func:`default_caps`; the
    result depends only on the inputs and these); ``tolerance`` stops it once no unseen split can be
    faster by more than this fraction (0 = exact for the candidate planner).
    """
    splits_cap, evaluations_cap = default_caps(problem)
    max_splits = splits_cap if max_splits is None else max_splits
    max_evaluations = evaluations_cap if max_evaluations is None else max_evaluations
    if refine < 1 or max_splits < 1 or max_evaluations < 1:
        raise ValueError("refine, max_splits and max_evaluations must be >= 1")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    space = problem.split_space()
    floor = space.floor()
    if math.isinf(floor):
        raise SplitDoesNotFit(f"memory: no split of the {len(problem.layers)} layers fits every rank's memory")
    seen: set[tuple[int, ...]] = set()
    planned: list[SplitPlan] = []
    best: SplitPlan | None = None
    least = math.inf  # the least closed-form bound of a split seen
    unseen = floor  # every split not yet enumerated has a bound >= this
    considered = evaluations = passes = 0
    cut = False
    while not cut:
        threshold = floor * (1 + _FIRST_PASS * 2**passes) if passes < 40 else math.inf
        if best is not None:
            threshold = min(threshold, best.makespan_ms / (1 + tolerance))
        batch: list[tuple[float, tuple[int, ...], CostModel]] = []
        for _, split in space.splits(threshold, limit=_VISITS_PER_SPLIT * max_splits):
            if split in seen:
                continue
            if considered >= max_splits:
                cut = True
                break
            seen.add(split)
            considered += 1
            try:
                model = problem.cost_model(split)
            except SplitDoesNotFit:
                continue
            batch.append((max(lower_bound_ms(model), space.bound(split)), split, model))
        cut = cut or space.truncated
        if not cut:
            unseen = threshold  # every split under it was enumerated
        batch.sort(key=lambda item: (item[0], item[1]))
        for bound, split, model in batch:
            least = min(least, bound)
            if best is not None and bound >= best.makespan_ms * (1 - _REL):
                continue
            if evaluations >= max_evaluations:
                cut = True
                continue
            evaluations += 1
            try:
                plan, span, _ = _plan(problem, model, bound, final=False)
            except ValueError:
                continue  # the schedule's warm-up exceeds the budget of this split
            got = SplitPlan(split, model, plan, span, bound)
            planned.append(got)
            if best is None or span < best.makespan_ms:
                best = got
        if best is not None and not cut and threshold >= best.makespan_ms / (1 + tolerance) * (1 - _REL):
            break
        if math.isinf(threshold) and best is None:
            raise SplitDoesNotFit(
                f"memory: no split of the {len(problem.layers)} layers fits every rank's memory with the"
                f" in-flight microbatches {problem.schedule} needs"
            )
        passes += 1
    if best is None:
        raise SplitDoesNotFit(f"memory: no split fits within the first {considered} splits tried")
    planned.sort(key=lambda p: (p.makespan_ms, p.layers_per_stage))
    chosen: SplitPlan | None = None
    for cand in planned[:refine]:
        if chosen is not None and cand.lower_bound_ms >= chosen.makespan_ms * (1 - _REL):
            continue  # no schedule of this split can beat the one chosen
        final = cand
        if cand.makespan_ms > cand.lower_bound_ms * (1 + _REL):
            plan, span, searched = _plan(problem, cand.model, cand.lower_bound_ms, final=True)
            final = SplitPlan(cand.layers_per_stage, cand.model, plan, span, cand.lower_bound_ms, searched)
        if chosen is None or final.makespan_ms < chosen.makespan_ms:
            chosen = final
    assert chosen is not None
    even: SplitPlan | None = None
    try:
        even_layers = even_split(len(problem.layers), problem.stages)
        even = chosen if even_layers == chosen.layers_per_stage else evaluate_split(problem, even_layers)
    except SplitDoesNotFit:
        pass
    if even is not None and even.makespan_ms <= chosen.makespan_ms:
        chosen = even  # a tie keeps the even split: moving layers would gain nothing
    return PartitionResult(
        best=chosen,
        even=even,
        exact=not cut and tolerance == 0,
        bound_ms=min(least, unseen, chosen.makespan_ms),
        splits_considered=considered,
        evaluations=evaluations,
        candidates=tuple((p.layers_per_stage, p.makespan_ms) for p in planned[:refine]),
    )


_LAYER_KEYS = ("name", "fwd", "bwd", "wgt", "param_bytes", "act_bytes")


def problem_from_dict(data: Mapping[str, Any], *, microbatches: int, **options: Any) -> PartitionProblem:
    """A :class:`PartitionProblem` from the CLI's JSON form (module docstring); ``options`` are the
    other fields (``schedule``, ``delays``, ``transmit``, ``memory``, and ``rank_speed`` or
    ``ranks`` when the data has no speeds: all 1). ``ValueError`` names the bad key."""
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a JSON object with 'layers' and 'rank_speed', got {type(data).__name__}")
    unknown = sorted(set(data) - {"layers", "rank_speed"})
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}: the file holds 'layers' and 'rank_speed'")
    raw = data.get("layers")
    if not isinstance(raw, list) or not raw:
        raise ValueError("layers: needs a non-empty list of {name, fwd, bwd, wgt[, param_bytes, act_bytes]}")
    layers = []
    for k, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise ValueError(f"layers[{k}]: expected an object, got {type(item).__name__}")
        bad = sorted(set(item) - set(_LAYER_KEYS))
        missing = [key for key in ("fwd", "bwd", "wgt") if key not in item]
        if bad or missing:
            raise ValueError(
                f"layers[{k}]: unknown key(s) {bad} / missing {missing}: a layer has {', '.join(_LAYER_KEYS)}"
            )
        name = str(item.get("name", f"layers[{k}]"))
        numbers = {key: item.get(key, 0.0) for key in _LAYER_KEYS[1:]}
        layers.append(LayerCost(name, **{key: _number(v, f"layers[{k}].{key}") for key, v in numbers.items()}))
    ranks = options.pop("ranks", None)
    speeds = options.pop("rank_speed", None)
    if speeds is None:
        speeds = data.get("rank_speed", [1.0] * (ranks or 1))
    if not isinstance(speeds, (list, tuple)):
        raise ValueError(f"rank_speed: expected a list of numbers (one per rank), got {type(speeds).__name__}")
    if ranks is not None and len(speeds) == 1:
        speeds = list(speeds) * ranks
    if ranks is not None and len(speeds) != ranks:
        raise ValueError(f"rank_speed needs {ranks} values (one per rank), got {len(speeds)}")
    return PartitionProblem(tuple(layers), tuple(speeds), microbatches, **options)
