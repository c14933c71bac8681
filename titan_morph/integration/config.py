"""The ``[morph]`` TOML section: titan_morph's options, merged into TorchTitan's JobConfig.

Loaded through ``[job] custom_config_module = "titan_morph.integration.config"``: TorchTitan's
``ConfigManager`` merges this module's ``JobConfig`` into its own, so ``[morph]``,
``[morph.inject]`` and ``[morph.synthetic]`` tables are read from the TOML file and
``--morph.key value`` / ``--morph.inject.key value`` override them on the command line.

The field types say what is allowed, and one validator (:func:`validate_morph`) reads them:

* ``Literal[...]`` for choices (``transport``, ``inject.mode``, ``inject.direction``);
* ``Annotated[int | float, Range(...)]`` for bounded numbers;
* ``Annotated[list[float] | list[int], Range(...), Per(...)]`` for per-link / per-stage lists,
  written as TOML lists (``[0, 0, 60]``), comma strings (``"0,0,60"``) or one number; on the
  command line ``--morph.inject.delays_ms 0,0,60`` or ``--morph.inject.delays_ms 30``;
* ``bool`` options take a value on the command line: ``--morph.monitor false`` (a bare
  ``--morph.monitor`` means true).

Lists are parsed by :func:`titan_morph.pipelining.values.parse_list` only. Errors are one
:class:`MorphConfigError` whose message starts with the key, e.g.
``morph.transport: 'bogus' is not one of default, delegate, auto``.

(No ``from __future__ import annotations`` here: TorchTitan's config merger and tyro inspect the
field types at runtime.)
"""

import csv
import difflib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Annotated, Any, Literal, get_args, get_origin

import tyro.conf
from tyro.constructors import PrimitiveConstructorSpec

from titan_morph.comm.collectives import PairDelays
from titan_morph.monitor.detect import DetectRule
from titan_morph.pipelining.links import (
    DIRECTIONS,
    LinkModel,
    RandomDelays,
    StaticDelays,
    TraceDelays,
    table3_trace,
)
from titan_morph.pipelining.values import parse_list

Transport = Literal["default", "delegate", "auto"]
Orchestrator = Literal["off", "pp", "any"]
InjectMode = Literal["none", "static", "random", "trace", "break"]
InjectDirection = Literal["both", "fwd", "bwd"]
TRANSPORTS: tuple[str, ...] = get_args(Transport)
ORCHESTRATORS: tuple[str, ...] = get_args(Orchestrator)
INJECT_MODES: tuple[str, ...] = get_args(InjectMode)
INJECT_DIRECTIONS: tuple[str, ...] = get_args(InjectDirection)
BUILTIN_TRACES = ("table3",)
MAX_DELEGATES_PER_LINK = 64
"""Delegate processes per link and direction the delegated transport accepts."""
ONE_MICROBATCH_PER_STAGE = ("1F1B",)
"""Schedules that need at least as many microbatches as stages (torch's Schedule1F1B refuses fewer)."""


class MorphConfigError(ValueError):
    """An option is invalid; the message starts with the key and says what is allowed."""


# --------------------------------------------------------------------------------------------
# Type metadata read by the validator and by tyro


@dataclass(frozen=True)
class Range:
    """Allowed values of a number, or of every element of a list.

    ``low <= v <= high`` (``low < v`` when ``low_open``); ``inf`` only when ``allow_inf``. ``delay``
    marks a delay in ms, also bounded by the run's delay limit (:func:`delay_limit_ms`).
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    allow_inf: bool = False
    delay: bool = False

    def describe(self, limit: float | None = None) -> str:
        high = self.high if limit is None else (limit if self.high is None else min(self.high, limit))
        low = "" if self.low is None else f"{'>' if self.low_open else '>='} {self.low:g}"
        top = "" if high is None else f"<= {high:g}"
        text = " and ".join(p for p in (low, top) if p)
        return text + (" (inf = link down)" if self.allow_inf else "")


@dataclass(frozen=True)
class Per:
    """A list with ``width`` values per pipeline ``unit`` ("link": S-1 of them; "stage": S).

    One group of ``width`` values stands for every link/stage. An empty list means "not set"
    unless ``required``. ``or_pairs``: when ``[morph.inject] rank_links`` names rank pairs, one value
    per pair instead of per link.
    """

    unit: Literal["link", "stage"]
    width: int = 1
    required: bool = False
    or_pairs: bool = False


@dataclass(frozen=True)
class RankPairs:
    """A list of rank pairs ``"a-b"`` (two different ranks below the world size, no pair twice)."""


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _bool_from_cli(args: list[str]) -> bool:
    if not args:
        return True
    word = args[0].strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"{args[0]!r} is not a boolean: write true or false")


_CLI_BOOL = PrimitiveConstructorSpec(
    nargs=(0, 1),
    metavar="[true|false]",
    instance_from_str=_bool_from_cli,
    is_instance=lambda value: isinstance(value, bool),
    str_from_instance=lambda value: ["true" if value else "false"],
)


def _cli_list(kind: type) -> PrimitiveConstructorSpec:
    """One command-line token, ``A,B,C`` (``;`` also separates), kept raw when it does not parse so
    that :func:`validate_morph` reports it with the key."""
    return PrimitiveConstructorSpec(
        nargs=1,
        metavar="A,B,..." if kind is float else "I,J,...",
        instance_from_str=lambda args: _coerce_list(args[0], kind),
        is_instance=lambda value: isinstance(value, (list, str)),
        str_from_instance=lambda value: [",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)],
    )


def _cli_pairs() -> PrimitiveConstructorSpec:
    """One command-line token ``A-B,C-D`` (kept raw; :func:`parse_rank_pairs` checks it with the key)."""
    return PrimitiveConstructorSpec(
        nargs=1,
        metavar="A-B,C-D,...",
        instance_from_str=lambda args: _coerce_pairs(args[0]),
        is_instance=lambda value: isinstance(value, (list, str)),
        str_from_instance=lambda value: [",".join(str(v) for v in value)],
    )


def _coerce_pairs(value: Any) -> Any:
    """``"0-1,2-3"``, ``["0-1", "2-3"]`` or ``[[0, 1], [2, 3]]`` as ``["0-1", "2-3"]``; anything that
    does not parse is returned unchanged (the validator reports it with the key)."""
    try:
        return [f"{a}-{b}" for a, b in parse_rank_pairs(value, "value")]
    except (ValueError, TypeError):
        return value


def parse_rank_pairs(spec: Any, key: str = "morph.inject.rank_links") -> tuple[tuple[int, int], ...]:
    """Rank pairs from ``"a-b,c-d"``, a list of ``"a-b"`` strings or a list of ``[a, b]`` lists.

    Each element is two different integers >= 0 (:func:`~titan_morph.pipelining.values.parse_list`
    with ``-`` as the separator); a pair may not appear twice (in either order).
    """
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return ()
    if isinstance(spec, str):
        items: list[Any] = [part for part in spec.replace(";", ",").split(",")]
    elif isinstance(spec, Sequence):
        items = list(spec)
    else:
        raise ValueError(f"{key}: {spec!r} is not a list of rank pairs such as 0-1,2-3")
    pairs: list[tuple[int, int]] = []
    for item in items:
        try:
            a, b = parse_list(
                item if isinstance(item, (str, list, tuple)) else str(item), int, name=key, sep="-", low=0
            )
        except ValueError as err:
            raise ValueError(f"{key}: {item!r} is not a rank pair a-b of two ranks >= 0 ({err})") from None
        if a == b:
            raise ValueError(f"{key}: {item!r} joins rank {a} to itself; a pair needs two different ranks")
        if (min(a, b), max(a, b)) in {(min(p), max(p)) for p in pairs}:
            raise ValueError(f"{key}: pair {a}-{b} is listed twice")
        pairs.append((a, b))
    return tuple(pairs)


Bool = Annotated[bool, tyro.conf.FlagConversionOff, _CLI_BOOL]
FloatList = Annotated[list[float], _cli_list(float)]
IntList = Annotated[list[int], _cli_list(int)]


def _coerce_list(value: Any, kind: type) -> Any:
    """A TOML list, a comma/semicolon string or a scalar as ``list[kind]``; nested lists are
    flattened (``[[F, B, W], ...]``). Anything that does not parse is returned unchanged."""
    if isinstance(value, str):
        value = value.replace(";", ",")
    elif isinstance(value, Sequence) and any(isinstance(v, (list, tuple)) for v in value):
        value = [x for v in value for x in (v if isinstance(v, (list, tuple)) else (v,))]
    try:
        return list(parse_list(value, kind, name="value", allow_inf=True))
    except ValueError:
        return value


def _unwrap(ftype: Any) -> tuple[Any, tuple[Any, ...]]:
    """(base type, metadata) of ``Annotated[base, *metadata]`` (nested Annotated flattened)."""
    meta: tuple[Any, ...] = ()
    while get_origin(ftype) is Annotated:
        args = get_args(ftype)
        ftype, meta = args[0], meta + tuple(args[1:])
    return ftype, meta


def _coerce_fields(obj: Any) -> None:
    """Turn list-typed fields given as strings or scalars (TOML, Python) into lists."""
    for f in fields(obj):
        base, _ = _unwrap(f.type)
        if get_origin(base) is list:
            setattr(obj, f.name, _coerce_list(getattr(obj, f.name), get_args(base)[0]))


# --------------------------------------------------------------------------------------------
# The [morph] tables

DelayList = Annotated[FloatList, Range(0, allow_inf=True, delay=True), Per("link", or_pairs=True)]
RankPairList = Annotated[list[str], _cli_pairs(), RankPairs()]
PlanDelayList = Annotated[FloatList, Range(0, delay=True), Per("link")]
StageMsList = Annotated[FloatList, Range(0), Per("stage", required=True)]


@dataclass
class Inject:
    """``[morph.inject]``: emulated communication stragglers on pipeline links (paper §7).

    Link ``i`` joins stage ``i`` and ``i+1``; a run with PP degree S has S-1 links.
    """

    mode: InjectMode = "none"
    """none | static (fixed ``delays_ms``) | random (§7.2: N(mean, std) re-drawn every
    U(interval) ms) | trace (replay ``trace_file``, e.g. the paper's Table 3) | break (the default
    path of ``links`` fails for real from ``start_step`` to ``end_step``: its process group is torn
    down on one side; needs ``transport = "auto"``, which moves the links to the delegates)."""

    delays_ms: DelayList = field(default_factory=list)
    """static mode: per-link delay in ms, e.g. [0, 0, 60] (one value per link; a single value
    applies to every link; "inf" takes a link down). Bounded by the delay limit. With
    ``rank_links``: one value per rank pair (finite)."""

    rank_links: RankPairList = field(default_factory=list)
    """static mode: slow pairs of ranks ("hosts": one rank per host), e.g. "0-1" or "0-1,2-3".
    Every kind of traffic that crosses a pair waits ``delays_ms`` (one value per pair): pipeline
    sends between the two ranks and the data-parallel collectives whose ring uses the pair. The
    ranks are the ones the run starts with; after a topology move they name the same hosts. []
    = ``delays_ms`` are per pipeline link."""

    direction: InjectDirection = "both"
    """Which messages are delayed: both | fwd (activations i->i+1) | bwd (gradients i+1->i)."""

    start_step: Annotated[int, Range(1)] = 1
    """First training step (1-based) with injected delays."""

    end_step: Annotated[int, Range(0)] = 0
    """Last training step with injected delays (0 = until the end of training)."""

    links: Annotated[IntList, Range(0)] = field(default_factory=list)
    """random mode: ids of the links that straggle; break mode: the links that fail, e.g. [0, 2]
    ([] = every link)."""

    random_mean_ms: Annotated[float, Range(0, delay=True)] = 0.0
    """random mode: mean of the per-link delay in ms."""

    random_std_ms: Annotated[float, Range(0, delay=True)] = 0.0
    """random mode: standard deviation of the per-link delay in ms (draws are clipped at 0)."""

    random_interval_ms: Annotated[FloatList, Range(0, low_open=True)] = field(default_factory=lambda: [100.0, 200.0])
    """random mode: [low, high] ms; a link's delay is re-drawn after U(low, high) ms."""

    seed: int = 0
    """random mode: seed; every rank (and the simulator) sees the same delays for a seed."""

    trace_file: str = ""
    """trace mode: CSV with columns step|time_ms, link, delay_ms[, direction]; or "table3" for the
    built-in (rescaled) Table 3 trace of the paper."""

    def __post_init__(self) -> None:
        _coerce_fields(self)
        self.rank_links = _coerce_pairs(self.rank_links)


@dataclass
class Synthetic:
    """``[morph.synthetic]``: a synthetic-compute testbed replacing the model's stages.

    Each stage sleeps/computes for the given times and exchanges ``hidden``-wide activations, so
    schedules can be studied with exact, controllable F/B/W costs.
    """

    enabled: Bool = False
    """Replace the model stages by synthetic ones."""

    fwd_ms: StageMsList = field(default_factory=lambda: [10.0])
    """Forward time per microbatch in ms: one value for every stage, or one per stage [10, 10, 12, 10]."""

    bwd_ms: StageMsList = field(default_factory=lambda: [10.0])
    """Input-gradient backward (I / the paper's B) time per microbatch in ms (same format)."""

    wgt_ms: StageMsList = field(default_factory=lambda: [10.0])
    """Weight-gradient backward (W) time per microbatch in ms (same format)."""

    hidden: Annotated[int, Range(16)] = 64
    """Model width (float32 elements per token sent between stages) of the ``synthetic`` model
    flavor (``[model] flavor = "synthetic"``): a multiple of 16 (one attention head per 16)."""

    def __post_init__(self) -> None:
        _coerce_fields(self)


@dataclass
class Morph:
    """``[morph]``: titan_morph's straggler-resilient pipeline options.

    The schedule itself is chosen by ``[parallelism] pipeline_parallel_schedule`` (e.g. "1F1B",
    "GPipe", "ZBH1", "ZBH2", "Morph1F1B", "PipeMorph").
    """

    memory_budget: Annotated[int, Range(0)] = 0
    """Most microbatches whose activations a stage may hold at once (M_i, Alg. 1's x_max);
    0 = auto (the PP degree, i.e. 1F1B's footprint). Must be >= the PP degree; values above the
    number of microbatches are clipped to it."""

    stage_times_ms: Annotated[FloatList, Range(0), Per("stage", width=3)] = field(default_factory=list)
    """Per-stage compute times used for planning (Eq. 1, Alg. 2): [F, B, W] in ms for every
    stage, or 3 x S values, one triple per stage ([F0, B0, W0, F1, B1, W1, ...]; the string
    "F,B,W;F,B,W;..." also works). [] = profile them during the first ``profile_steps`` steps."""

    plan_delays_ms: PlanDelayList = field(default_factory=list)
    """Per-link delays in ms that PipeMorph plans for from the start, e.g. [0, 0, 60] (one value per
    link, or one for all; finite); [] = none: the initial plan is Alg. 1 and adaptation measures
    the delays later. When set, the initial plan is Alg. 2 for these delays (+ the search when
    ``search``)."""

    plan_delays_std_ms: PlanDelayList = field(default_factory=list)
    """Standard deviation of the planned delays in ms (one per link, or one for all): PipeMorph's
    initial plan is then made for the distribution N(plan_delays_ms, this), minimising the expected
    makespan over ``plan_samples`` sampled delay vectors (needs ``search``); [] = plan for the fixed
    ``plan_delays_ms``."""

    plan_samples: Annotated[int, Range(0, 1024)] = 16
    """Delay vectors a plan for varying delays is evaluated on (common to all candidates): for
    ``plan_delays_std_ms``, and when the monitor re-plans links whose measured delays vary from step
    to step (their recent samples; slow links on the delegates, with ``search``). 0 = always plan
    for one delay vector."""

    plan_seed: int = 0
    """Seed of the sampled delay vectors of ``plan_delays_std_ms`` (the same on every rank)."""

    profile_steps: Annotated[int, Range(1)] = 2
    """Training steps profiled (per-op compute times) before the initial plan is rebuilt from the
    measured times, when ``stage_times_ms`` is empty and ``plan_delays_ms`` is set (needs
    ``monitor``)."""

    search: Bool = False
    """Refine PipeMorph's plan by the simulator-guided search (warm-ups, in-flight caps and op
    orders), seeded with Alg. 1/2 and every baseline that fits the memory budget."""

    search_iterations: Annotated[int, Range(0)] = 0
    """The search's work, in iterations: it fixes the plan (the same on every rank), and more never
    gives a worse one. 0 = as many as take about ``search_budget_ms`` of CPU on the reference box."""

    search_budget_ms: Annotated[float, Range(0, low_open=True)] = 200.0
    """The search's work in ms of CPU when ``search_iterations`` is 0, converted into a fixed number
    of iterations (so the plan does not depend on the machine's load)."""

    transport: Transport = "default"
    """Pipeline send/recv path: default (torch.distributed P2P) | delegate (via host-side delegate
    processes, §5: never blocks the compute stream) | auto (default, switched to delegate on links
    detected as slow)."""

    link_queue_depth: Annotated[int, Range(1)] = 2
    """Default-transport model: messages in flight per link and direction before a sender blocks
    (head-of-line blocking, §2.3). Used by the link emulator and the simulator."""

    delegates_per_link: Annotated[int, Range(1, MAX_DELEGATES_PER_LINK)] = 1
    """Delegate processes per link and direction when the delegate transport is used (1..64)."""

    detect_consecutive: Annotated[int, Range(1)] = 3
    """k: a link is declared slow after k consecutive steps above its Eq. 1 tolerance."""

    recover_consecutive: Annotated[int, Range(1)] = 5
    """m: a slow link is declared healthy after m consecutive steps below the recovery threshold."""

    detect_margin: Annotated[float, Range(0)] = 0.1
    """A step counts as slow when a link's delay exceeds its Eq. 1 tolerance by this fraction
    (0.1 = 10 % above)."""

    recover_ratio: Annotated[float, Range(0, 1, low_open=True)] = 0.5
    """A step counts as healthy when a slow link's delay is below this fraction of its tolerance."""

    adapt: Bool = True
    """Re-plan at step boundaries when links turn slow or recover (Alg. 2); false keeps the initial
    plan (Alg. 1) for the whole run."""

    monitor: Bool = True
    """Profile every step of titan_morph's schedules (PipeMorph, ZBH1, ZBH2, Morph1F1B): per-op
    compute times and per-link delivery delays, exchanged over a CPU group and written to
    TensorBoard (``morph/delay_ms/link<i>``...). Required by ``adapt``."""

    detect_min_ms: Annotated[float, Range(0)] = 5.0
    """Delays at or below this never count as slow, whatever the plan's tolerance (host and network
    jitter)."""

    adapt_memory_budget: Annotated[int, Range(0)] = 0
    """In-flight microbatch cap of adapted plans when slow links are delegated (``transport`` auto or
    delegate): 0 = none, the paper's §4.2 relaxation (activations may move to host memory). With
    the default transport adapted plans keep ``memory_budget``. Else >= the pipeline degree."""

    orchestrator: Orchestrator = "off"
    """DP x PP topology orchestrator (§6, Fig. 13): off (the rank layout never changes; DP
    collective delays are still measured) | pp (a data-parallel pair of ranks detected slow is moved
    onto a pipeline link, Falcon's re-assignment) | any (onto a pipeline link, or between two ranks
    that exchange no traffic when the layout has such places). A move checkpoints the run and
    ./run_train.sh's launcher restarts it with the new rank order. Acts only with DP x PP
    (pipeline_parallel_degree and data_parallel_shard_degree > 1); there it needs a titan_morph
    schedule, ``monitor`` and [checkpoint] enable = true."""

    dp_detect_min_ms: Annotated[float, Range(0)] = 5.0
    """Per-hop DP collective delays at or below this never count as slow (the DP pairs' Eq. 1
    tolerance is 0: nothing absorbs a collective's delay)."""

    inject: Inject = field(default_factory=Inject)
    synthetic: Synthetic = field(default_factory=Synthetic)

    def __post_init__(self) -> None:
        _coerce_fields(self)


@dataclass
class JobConfig:
    """Merged into TorchTitan's JobConfig by ``job.custom_config_module``."""

    morph: Morph = field(default_factory=Morph)


def _bool_fields(cls: type = Morph, prefix: str = "morph") -> set[str]:
    """Dotted names of every boolean option below ``cls`` (``morph.adapt``, ``morph.synthetic.enabled``)."""
    names = set()
    for f in fields(cls):
        base, _ = _unwrap(f.type)
        if is_dataclass(base):
            names |= _bool_fields(base, f"{prefix}.{f.name}")  # type: ignore[arg-type]
        elif base is bool:
            names.add(f"{prefix}.{f.name}")
    return names


def expand_negated_flags(argv: Sequence[str]) -> list[str]:
    """``--morph.no-adapt`` (TorchTitan's spelling of a false boolean flag) -> ``--morph.adapt false``.

    The ``[morph]`` booleans take a value on the command line; this keeps the ``--...no-<name>``
    form working too. Other arguments are returned unchanged.
    """
    known = _bool_fields()
    out: list[str] = []
    for arg in argv:
        head, _, name = arg[2:].rpartition(".") if arg.startswith("--morph.") else ("", "", "")
        plain = name[3:] if name.startswith(("no-", "no_")) else ""
        key = f"{head}.{plain.replace('-', '_')}"
        out.extend([f"--{key}", "false"] if plain and key in known else [arg])
    return out


# --------------------------------------------------------------------------------------------
# Validation


def _fail(key: str, value: Any, problem: str) -> MorphConfigError:
    return MorphConfigError(f"{key}: {value!r} {problem}")


def check_unknown_keys(table: Mapping[str, Any], cls: type = Morph, prefix: str = "morph") -> None:
    """Reject keys of a raw TOML table that the dataclass ``cls`` does not define (recursively).

    With ``cls`` = the whole job config class and ``prefix`` = "" it checks every section of a
    TOML file.
    """
    known = {f.name: f for f in fields(cls)}
    where = f"[{prefix}]" if prefix else "the top level"
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else key
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise MorphConfigError(f"{name}: unknown key{hint}; allowed keys in {where} are {', '.join(sorted(known))}")
        ftype, _ = _unwrap(known[key].type)
        if is_dataclass(ftype):
            if not isinstance(value, Mapping):
                raise _fail(name, value, f"must be a table [{name}]")
            check_unknown_keys(value, ftype, name)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Layout:
    """What the pipeline-dependent checks need: pipeline ranks (``stages``, None = unknown), the
    delay limit, and the stages per rank (1; 2 in a V; None = unknown): per-link options have one
    value per link between ranks, per-stage options one per stage."""

    stages: int | None = None
    delay_limit_ms: float | None = None
    stages_per_rank: int | None = 1
    pairs: int | None = None  # rank pairs of [morph.inject] rank_links (per-pair lists)

    def count(self, per: Per) -> int | None:
        if per.or_pairs and self.pairs:
            return self.pairs
        if self.stages is None:
            return None
        if per.unit == "link":
            return self.stages - 1
        return None if self.stages_per_rank is None else self.stages * self.stages_per_rank


def _list_values(key: str, value: Any, kind: type, rng: Range, per: Per | None, layout: _Layout) -> tuple:
    """Parse and check one list-typed option; returns its values (one group per link/stage when
    ``per`` and the layout is known; a lone group is repeated)."""
    limit = layout.delay_limit_ms if rng.delay else None
    try:
        values = parse_list(_coerce_list(value, kind), kind, name=key, allow_inf=rng.allow_inf)
    except ValueError as err:
        raise MorphConfigError(str(err)) from None
    high = limit if rng.high is None else (rng.high if limit is None else min(rng.high, limit))
    for v in values:
        below = rng.low is not None and (v <= rng.low if rng.low_open else v < rng.low)
        above = high is not None and v > high and not (rng.allow_inf and math.isinf(v))
        if below or above:
            shown = value if isinstance(value, (int, float)) else v
            reason = f"; {_limit_reason(limit)}" if above and limit is not None and high == limit else ""
            raise _fail(key, shown, f"is out of range: must be {rng.describe(limit)}{reason}")
    if per is None:
        return values
    if not values:
        if per.required:
            raise _fail(key, value, f"needs at least {per.width} value(s)")
        return values
    groups = layout.count(per)
    unit = "rank pair" if per.or_pairs and layout.pairs else per.unit
    what = f"one per {unit}" if per.width == 1 else f"one group of {per.width} per {unit}"
    if groups is None:
        if len(values) % per.width:
            raise _fail(key, value, f"needs a multiple of {per.width} values ({what}), got {len(values)}")
        return values
    if len(values) == per.width:
        return values * groups
    if len(values) != per.width * groups:
        raise _fail(
            key,
            value,
            f"needs {per.width} or {per.width * groups} values ({what}, {groups} {unit}s), got {len(values)}",
        )
    return values


def _limit_reason(limit: float) -> str:
    return (
        f"the delay limit {limit:g} ms is [comm] train_timeout_seconds x 1000 / microbatches "
        "(a step may wait out the delay once per microbatch)"
    )


def _check_value(key: str, value: Any, ftype: Any, layout: _Layout) -> None:
    """Check ``value`` against its field type (Literal, bool, int, float, str, list, dataclass)."""
    base, meta = _unwrap(ftype)
    rng = next((m for m in meta if isinstance(m, Range)), Range())
    per = next((m for m in meta if isinstance(m, Per)), None)
    if is_dataclass(base):
        if not is_dataclass(value):
            raise _fail(key, value, f"must be a table [{key}]")
        for f in fields(value):
            _check_value(f"{key}.{f.name}", getattr(value, f.name), f.type, layout)
    elif get_origin(base) is Literal:
        if value not in get_args(base):
            raise _fail(key, value, f"is not one of {', '.join(get_args(base))}")
    elif base is bool:
        if not isinstance(value, bool):
            raise _fail(key, value, "is not a boolean: write true or false (unquoted in TOML)")
    elif base in (int, float):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (base is int and not isinstance(value, int)):
            raise _fail(key, value, f"must be {'an integer' if base is int else 'a number'}")
        _list_values(key, value, float, rng, None, layout)
    elif base is str:
        if not isinstance(value, str):
            raise _fail(key, value, "must be a string")
    elif any(isinstance(m, RankPairs) for m in meta):
        try:
            parse_rank_pairs(value, key)
        except ValueError as err:
            raise MorphConfigError(str(err)) from None
    elif get_origin(base) is list:
        _list_values(key, value, get_args(base)[0], rng, per, layout)


def _field_type(cls: type, name: str) -> Any:
    return next(f.type for f in fields(cls) if f.name == name)


def _values(obj: Any, name: str, layout: _Layout, key: str) -> tuple:
    """The parsed values of list-typed field ``name`` of ``obj`` (checked against its type)."""
    base, meta = _unwrap(_field_type(type(obj), name))
    rng = next((m for m in meta if isinstance(m, Range)), Range())
    per = next((m for m in meta if isinstance(m, Per)), None)
    return _list_values(key, getattr(obj, name), get_args(base)[0], rng, per, layout)


def _trace_path(spec: str) -> str:
    return spec if spec in BUILTIN_TRACES else os.path.expanduser(spec)


def _short_row(path: str) -> str:
    """Where a trace CSV has a row with fewer fields than its header ('' if none)."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    header = len(rows[0]) if rows else 0
    for line, row in enumerate(rows[1:], 2):
        if row and len(row) < header:
            return f"line {line} has {len(row)} fields, the header has {header}"
    return ""


def _check_trace(inj: Inject, links: int | None, limit: float | None) -> None:
    key = "morph.inject.trace_file"
    if not inj.trace_file:
        raise _fail(key, inj.trace_file, f"is empty: trace mode needs a CSV path or one of {', '.join(BUILTIN_TRACES)}")
    path = _trace_path(inj.trace_file)
    if path in BUILTIN_TRACES:
        return
    if not os.path.isfile(path):
        raise _fail(key, inj.trace_file, "file not found")
    if links is None:
        return
    try:
        trace = TraceDelays.from_csv(path, links)
    except (ValueError, KeyError, TypeError) as err:
        short = _short_row(path) if isinstance(err, TypeError) else ""
        raise _fail(key, inj.trace_file, short or str(err)) from None
    worst = max((e.delay_ms for e in trace.events if math.isfinite(e.delay_ms)), default=0.0)
    if limit is not None and worst > limit:
        raise _fail(key, inj.trace_file, f"has a delay of {worst:g} ms; {_limit_reason(limit)}")


def validate_morph(
    morph: Morph,
    pp_degree: int | None = None,
    *,
    delay_limit_ms: float | None = None,
    stages_per_rank: int | None = 1,
    world_size: int | None = None,
) -> None:
    """Check every ``[morph]`` option; raise one :class:`MorphConfigError` for the first bad one.

    ``pp_degree`` (ranks R, links R-1) enables the checks that depend on the pipeline layout
    (list lengths, link ids, memory budget); ``stages_per_rank`` (2 for a V schedule; None when
    unknown) sets how many values per-stage options take; ``delay_limit_ms`` bounds every injected
    or planned delay (see :func:`delay_limit_ms`); ``world_size`` bounds the ranks of
    ``rank_links``. Without them only layout-independent checks run.
    """
    try:
        rank_pairs = parse_rank_pairs(morph.inject.rank_links)
    except ValueError as err:
        raise MorphConfigError(str(err)) from None
    layout = _Layout(pp_degree, delay_limit_ms, stages_per_rank, pairs=len(rank_pairs) or None)
    _check_value("morph", morph, Morph, layout)  # every field against its type
    _check_rank_links(morph.inject, rank_pairs, layout, world_size)
    stages = pp_degree or 1
    links = None if pp_degree is None else max(pp_degree - 1, 0)

    for name in ("memory_budget", "adapt_memory_budget"):
        value = getattr(morph, name)
        if value != 0 and value < stages:
            raise _fail(
                f"morph.{name}",
                value,
                f"must be 0 or >= the pipeline degree ({stages}): every stage needs one in-flight "
                "microbatch more than the next (Alg. 1)",
            )
    if morph.adapt and not morph.monitor:
        raise _fail("morph.adapt", morph.adapt, "needs morph.monitor = true (adaptation acts on the monitor's data)")
    if _values(morph, "plan_delays_std_ms", layout, "morph.plan_delays_std_ms"):
        if not _values(morph, "plan_delays_ms", layout, "morph.plan_delays_ms"):
            raise _fail("morph.plan_delays_std_ms", morph.plan_delays_std_ms, "needs plan_delays_ms (the mean delays)")
        if not morph.search:
            raise _fail(
                "morph.plan_delays_std_ms",
                morph.plan_delays_std_ms,
                "needs morph.search = true (a plan for a distribution of delays is searched for)",
            )

    inj = morph.inject
    if inj.end_step != 0 and inj.end_step < inj.start_step:
        raise _fail(
            "morph.inject.end_step", inj.end_step, f"must be 0 (never stop) or >= start_step ({inj.start_step})"
        )
    if inj.mode == "static" and not _values(inj, "delays_ms", layout, "morph.inject.delays_ms"):
        raise _fail(
            "morph.inject.delays_ms", inj.delays_ms, "is empty: static mode needs per-link delays, e.g. [0, 0, 60]"
        )
    if links is not None and any(link >= links for link in _values(inj, "links", layout, "morph.inject.links")):
        raise _fail("morph.inject.links", inj.links, f"has a link id out of range: link ids are 0..{links - 1}")
    interval = _values(inj, "random_interval_ms", layout, "morph.inject.random_interval_ms")
    if len(interval) != 2 or interval[0] > interval[1]:
        raise _fail(
            "morph.inject.random_interval_ms", inj.random_interval_ms, "must be [low, high] ms with low <= high"
        )
    spread = inj.random_mean_ms + 3 * inj.random_std_ms
    if delay_limit_ms is not None and inj.mode == "random" and spread > delay_limit_ms:
        raise _fail(
            "morph.inject.random_std_ms",
            inj.random_std_ms,
            f"with random_mean_ms = {inj.random_mean_ms:g}: mean + 3 std = {spread:g} ms is out of range"
            f"; {_limit_reason(delay_limit_ms)}",
        )
    if inj.mode == "trace":
        _check_trace(inj, links, delay_limit_ms)
    if inj.mode == "break" and morph.transport != "auto":
        raise _fail(
            "morph.inject.mode",
            inj.mode,
            f"needs morph.transport = auto (got {morph.transport!r}): break mode fails links' default path for "
            "real, and only auto moves them to the delegates",
        )

    if morph.synthetic.hidden % 16:
        raise _fail("morph.synthetic.hidden", morph.synthetic.hidden, "must be a multiple of 16")


def _check_rank_links(inj: Inject, pairs: tuple[tuple[int, int], ...], layout: _Layout, world: int | None) -> None:
    """``rank_links``: ranks below the world size, static mode, both directions, finite delays."""
    if not pairs:
        return
    key = "morph.inject.rank_links"
    if world is not None:
        for a, b in pairs:
            if max(a, b) >= world:
                raise _fail(key, inj.rank_links, f"names rank {max(a, b)}: ranks are 0..{world - 1} ({world} ranks)")
    if inj.mode != "static":
        raise _fail(key, inj.rank_links, f"needs mode = static (one delays_ms value per pair), got mode = {inj.mode!r}")
    if inj.direction != "both":
        raise _fail(key, inj.rank_links, "delays both directions of a pair: set direction = both")
    delays = _values(inj, "delays_ms", layout, "morph.inject.delays_ms")
    if any(math.isinf(d) for d in delays):
        raise _fail("morph.inject.delays_ms", inj.delays_ms, "has inf: a rank pair cannot go down (finite delays)")


def world_size_of(job_config: Any) -> int:
    """Ranks of a job: the product of its parallel degrees (a shard degree of -1 counts as 1)."""
    par = job_config.parallelism
    size = 1
    for name in ("pipeline_parallel_degree", "data_parallel_replicate_degree", "data_parallel_shard_degree"):
        size *= max(int(getattr(par, name)), 1)
    return size * max(int(par.tensor_parallel_degree), 1) * max(int(par.context_parallel_degree), 1)


def dp_degree(job_config: Any) -> int:
    """Data-parallel replicas of each pipeline stage (shard x replicate degrees; -1 counts as 1)."""
    par = job_config.parallelism
    return max(int(par.data_parallel_shard_degree), 1) * max(int(par.data_parallel_replicate_degree), 1)


def _check_orchestrator(job_config: Any, morph: Morph) -> None:
    """``orchestrator`` moves ranks of a DP x PP job through a checkpoint: it needs the monitor and a
    titan_morph schedule (the one per-step exchange carries the DP measurements). Without DP x PP
    there is nothing to move and the option has no effect."""
    par = job_config.parallelism
    if morph.orchestrator == "off" or par.pipeline_parallel_degree < 2 or dp_degree(job_config) < 2:
        return
    key, value = "morph.orchestrator", morph.orchestrator
    if not morph.monitor:
        raise _fail(key, value, "needs morph.monitor = true (the moves act on the monitor's DP measurements)")
    if par.pipeline_parallel_schedule.lower() in ("1f1b", "gpipe"):
        raise _fail(
            key,
            value,
            f"needs a titan_morph schedule (PipeMorph, ZBH1, ZBH2, Morph1F1B), got {par.pipeline_parallel_schedule!r}",
        )
    if not job_config.checkpoint.enable:
        raise _fail(
            key,
            value,
            "needs [checkpoint] enable = true: the run is checkpointed and restarted with the new rank order",
        )


def microbatches(job_config: Any) -> int:
    """N = ``[training] local_batch_size`` / ``[parallelism] pipeline_parallel_microbatch_size``."""
    batch = job_config.training.local_batch_size
    size = job_config.parallelism.pipeline_parallel_microbatch_size
    if size < 1 or batch < 1 or batch % size:
        raise _fail(
            "parallelism.pipeline_parallel_microbatch_size",
            size,
            f"must be >= 1 and divide training.local_batch_size ({batch})",
        )
    return batch // size


def delay_limit_ms(job_config: Any) -> float:
    """Largest injected or planned delay per message: ``[comm] train_timeout_seconds`` x 1000 / N.

    With head-of-line blocking every one of a step's N microbatches can wait out the delay on the
    same link, and ranks waiting for that step in a collective must not hit the timeout.
    """
    return job_config.comm.train_timeout_seconds * 1000.0 / microbatches(job_config)


def validate_job_config(job_config: Any, stages_per_rank: int | None = 1) -> Morph:
    """Validate ``job_config.morph`` against the job's pipeline: PP degree, microbatches, timeout,
    and the schedule's stages per rank (``stages_per_rank``; None = unknown)."""
    morph = getattr(job_config, "morph", None)
    if morph is None:
        raise MorphConfigError(
            "morph: the [morph] section is missing: set [job] custom_config_module = 'titan_morph.integration.config'"
        )
    par = job_config.parallelism
    stages = par.pipeline_parallel_degree if par.pipeline_parallel_degree > 1 else None
    n = microbatches(job_config)
    validate_morph(
        morph,
        stages,
        delay_limit_ms=delay_limit_ms(job_config),
        stages_per_rank=stages_per_rank,
        world_size=world_size_of(job_config),
    )
    _check_orchestrator(job_config, morph)
    name = par.pipeline_parallel_schedule
    if stages is not None and name.lower() in (s.lower() for s in ONE_MICROBATCH_PER_STAGE) and n < stages:
        raise _fail(
            "parallelism.pipeline_parallel_schedule",
            name,
            f"needs at least as many microbatches as stages ({stages}); training.local_batch_size / "
            f"pipeline_parallel_microbatch_size gives {n}",
        )
    return morph


# --------------------------------------------------------------------------------------------
# Typed views used by the runtime (pure functions of the config)


def parse_per_stage(spec: Any, stages: int | None, key: str) -> tuple[float, ...]:
    """One ms value per stage from a per-stage option (one value for all stages, or S values)."""
    return _list_values(key, spec, float, Range(0), Per("stage", required=True), _Layout(stages))


def parse_stage_times(spec: Any, stages: int | None) -> tuple[tuple[float, float, float], ...] | None:
    """``stage_times_ms`` -> one (F, B, W) triple per stage, or None when empty (= profile)."""
    values = _list_values("morph.stage_times_ms", spec, float, Range(0), Per("stage", width=3), _Layout(stages))
    if not values:
        return None
    return tuple((values[i], values[i + 1], values[i + 2]) for i in range(0, len(values), 3))


def parse_plan_delays(spec: Any, num_links: int | None) -> tuple[float, ...] | None:
    """``plan_delays_ms`` -> one finite delay per link, or None when empty (plan without delays)."""
    layout = _Layout(None if num_links is None else num_links + 1)
    values = _list_values("morph.plan_delays_ms", spec, float, Range(0, delay=True), Per("link"), layout)
    return values or None


def stage_times(morph: Morph, stages: int) -> tuple[tuple[float, float, float], ...] | None:
    """Per-stage (F, B, W) ms: ``stage_times_ms``, else the ``[morph.synthetic]`` times when the
    testbed is on, else None (unknown: profiled at run time)."""
    configured = parse_stage_times(morph.stage_times_ms, stages)
    if configured is not None:
        return configured
    syn = morph.synthetic
    if not syn.enabled:
        return None
    f, b, w = (parse_per_stage(getattr(syn, n), stages, f"morph.synthetic.{n}") for n in ("fwd_ms", "bwd_ms", "wgt_ms"))
    return tuple(zip(f, b, w))


def plan_delays(morph: Morph, num_links: int) -> tuple[float, ...] | None:
    """The per-link delays PipeMorph plans for from the start, or None (Alg. 1 without delays)."""
    return parse_plan_delays(morph.plan_delays_ms, num_links)


def plan_delay_samples(morph: Morph, num_links: int) -> tuple[tuple[float, ...], ...] | None:
    """``plan_samples`` delay vectors from N(``plan_delays_ms``, ``plan_delays_std_ms``), or None when
    the initial plan is made for one vector (no std, or no samples)."""
    from titan_morph.pipelining.robust import sample_delays

    mean = plan_delays(morph, num_links)
    layout = _Layout(num_links + 1)
    std = _values(morph, "plan_delays_std_ms", layout, "morph.plan_delays_std_ms")
    if mean is None or not std or not morph.plan_samples:
        return None
    return sample_delays(mean, std, links=num_links, samples=morph.plan_samples, seed=morph.plan_seed)


@dataclass
class _Windowed(LinkModel):
    """Restrict a link model to a step window and a direction ([morph.inject] start/end/direction)."""

    inner: LinkModel
    start_step: int = 1
    end_step: int = 0
    direction: str = "both"

    def __post_init__(self) -> None:
        self.num_links = self.inner.num_links

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        if self.direction != "both" and direction != self.direction:
            return 0.0
        if step < self.start_step or (self.end_step and step > self.end_step):
            return 0.0
        return self.inner.delay_ms(link, direction, t_ms, step)


def detect_rule(morph: Morph, floor_ms: float | None = None) -> DetectRule:
    """The detector's consensus rules (``detect_*``/``recover_*``); the floor is ``detect_min_ms``
    unless ``floor_ms`` is given (DP pairs: ``dp_detect_min_ms``)."""
    return DetectRule(
        detect_steps=morph.detect_consecutive,
        recover_steps=morph.recover_consecutive,
        margin=morph.detect_margin,
        recover_ratio=morph.recover_ratio,
        floor_ms=morph.detect_min_ms if floor_ms is None else floor_ms,
    )


def pair_delays(inject: Inject) -> PairDelays | None:
    """The host-pair delays of ``rank_links`` (None when no pair is named or mode = none)."""
    pairs = parse_rank_pairs(inject.rank_links)
    if not pairs or inject.mode == "none":
        return None
    delays = _values(inject, "delays_ms", _Layout(pairs=len(pairs)), "morph.inject.delays_ms")
    return PairDelays(dict(zip(pairs, delays)), inject.start_step, inject.end_step)


def link_model_from_config(
    inject: Inject, num_links: int, steps: int = 200, hosts: Sequence[int] | None = None
) -> LinkModel | None:
    """The injected-delay model of ``[morph.inject]`` for ``num_links`` links (None when mode = none).

    ``steps`` (the run's training steps) rescales the built-in Table 3 trace onto the run. With
    ``rank_links``, ``hosts`` (the host of each stage of this pipeline, first to last) gives link
    ``i`` the delay of the pair (hosts[i], hosts[i+1]).
    """
    layout = _Layout(num_links + 1)
    if inject.mode in ("none", "break"):  # break mode fails the real path: no modelled delays
        return None
    pairs = pair_delays(inject)
    if pairs is not None:
        if hosts is None or len(hosts) != num_links + 1:
            raise ValueError(f"rank_links: the hosts of the pipeline's {num_links + 1} stages are needed, got {hosts}")
        delays = tuple(pairs.delays.get((min(a, b), max(a, b)), 0.0) for a, b in zip(hosts, hosts[1:]))
        return _Windowed(StaticDelays(delays), inject.start_step, inject.end_step, inject.direction)
    if inject.mode == "static":
        inner: LinkModel = StaticDelays(_values(inject, "delays_ms", layout, "morph.inject.delays_ms"))
    elif inject.mode == "random":
        low, high = _values(inject, "random_interval_ms", layout, "morph.inject.random_interval_ms")
        chosen = _values(inject, "links", layout, "morph.inject.links")
        inner = RandomDelays(
            num_links, inject.random_mean_ms, inject.random_std_ms, (low, high), inject.seed, chosen or None
        )
    elif inject.mode == "trace":
        path = _trace_path(inject.trace_file)
        inner = table3_trace(num_links + 1, steps) if path == "table3" else TraceDelays.from_csv(path, num_links)
    else:
        raise _fail("morph.inject.mode", inject.mode, f"is not one of {', '.join(INJECT_MODES)}")
    return _Windowed(inner, inject.start_step, inject.end_step, inject.direction)


def break_window(inject: Inject, num_links: int) -> tuple[frozenset[int], int, int] | None:
    """``[morph.inject]`` break mode: (the links that fail, first step, last step or 0 = for good);
    None in the other modes."""
    if inject.mode != "break":
        return None
    chosen = _values(inject, "links", _Layout(num_links + 1), "morph.inject.links")
    return frozenset(chosen or range(num_links)), inject.start_step, inject.end_step
