"""The ``[morph]`` TOML section: titan_morph's options, merged into TorchTitan's JobConfig.

Loaded through ``[job] custom_config_module = "titan_morph.integration.config"``: TorchTitan's
``ConfigManager`` merges this module's ``JobConfig`` into its own, so ``[morph]``,
``[morph.inject]`` and ``[morph.synthetic]`` tables are read from the TOML file and
``--morph.key value`` / ``--morph.inject.key value`` override them on the command line.

Every option is checked once at start-up by :func:`validate_morph`, which raises a single
:class:`MorphConfigError` naming the key, the bad value and what is allowed.

(No ``from __future__ import annotations`` here: TorchTitan's config merger inspects field types
at runtime to recurse into the nested ``inject``/``synthetic`` tables.)
"""

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from titan_morph.pipelining.links import (
    DIRECTIONS,
    LinkModel,
    RandomDelays,
    StaticDelays,
    TraceDelays,
    parse_delays,
    table3_trace,
)

TRANSPORTS = ("default", "delegate", "auto")
INJECT_MODES = ("none", "static", "random", "trace")
INJECT_DIRECTIONS = ("both", "fwd", "bwd")
BUILTIN_TRACES = ("table3",)


class MorphConfigError(ValueError):
    """A ``[morph]`` option is invalid; the message names the key and the allowed values."""


@dataclass
class Inject:
    """``[morph.inject]``: emulated communication stragglers on pipeline links (paper §7).

    Link ``i`` joins stage ``i`` and ``i+1``; a run with PP degree S has S-1 links.
    """

    mode: str = "none"
    """none | static (fixed ``delays_ms``) | random (§7.2: N(mean, std) re-drawn every
    U(interval) ms) | trace (replay ``trace_file``, e.g. the paper's Table 3)."""

    delays_ms: str = ""
    """static mode: per-link delay in ms, e.g. "0,0,60" (one value per link; a single value applies
    to every link; "inf" takes a link down)."""

    direction: str = "both"
    """Which messages are delayed: both | fwd (activations i->i+1) | bwd (gradients i+1->i)."""

    start_step: int = 1
    """First training step (1-based) with injected delays."""

    end_step: int = 0
    """Last training step with injected delays (0 = until the end of training)."""

    links: str = ""
    """random mode: comma-separated link ids that straggle ("" = every link)."""

    random_mean_ms: float = 0.0
    """random mode: mean of the per-link delay in ms."""

    random_std_ms: float = 0.0
    """random mode: standard deviation of the per-link delay in ms (draws are clipped at 0)."""

    random_interval_ms: str = "100,200"
    """random mode: "low,high" ms; a link's delay is re-drawn after U(low, high) ms."""

    seed: int = 0
    """random mode: seed; every rank (and the simulator) sees the same delays for a seed."""

    trace_file: str = ""
    """trace mode: CSV with columns step|time_ms, link, delay_ms[, direction]; or "table3" for the
    built-in (rescaled) Table 3 trace of the paper."""


@dataclass
class Synthetic:
    """``[morph.synthetic]``: a synthetic-compute testbed replacing the model's stages.

    Each stage sleeps/computes for the given times and exchanges ``hidden``-wide activations, so
    schedules can be studied with exact, controllable F/B/W costs.
    """

    enabled: bool = False
    """Replace the model stages by synthetic ones."""

    fwd_ms: str = "10"
    """Forward time per microbatch in ms: one value for every stage, or one per stage "10,10,12,10"."""

    bwd_ms: str = "10"
    """Input-gradient backward (I / the paper's B) time per microbatch in ms (same format)."""

    wgt_ms: str = "10"
    """Weight-gradient backward (W) time per microbatch in ms (same format)."""

    hidden: int = 64
    """Model width (float32 elements per token sent between stages) of the ``synthetic`` model
    flavor (``[model] flavor = "synthetic"``): a multiple of 16 (one attention head per 16)."""


@dataclass
class Morph:
    """``[morph]``: titan_morph's straggler-resilient pipeline options.

    The schedule itself is chosen by ``[parallelism] pipeline_parallel_schedule`` (e.g. "1F1B",
    "GPipe", later "ZBH1", "ZBH2", "PipeMorph").
    """

    memory_budget: int = 0
    """Most microbatches whose activations a stage may hold at once (M_i, Alg. 1's x_max);
    0 = auto (the PP degree, i.e. 1F1B's footprint). Must be >= the PP degree; values above the
    number of microbatches are clipped to it."""

    stage_times_ms: str = ""
    """Per-stage compute times used for planning (Eq. 1, Alg. 2) as "F,B,W" in ms for every
    stage, or "F,B,W;F,B,W;..." one triple per stage. "" = profile them during the first
    ``profile_steps`` steps."""

    plan_delays_ms: str = ""
    """Per-link delays in ms that PipeMorph plans for from the start, e.g. "0,0,60" (one value per
    link, or one for all); "" = none: the initial plan is Alg. 1 and adaptation measures the delays
    later. When set, the initial plan is Alg. 2 for these delays (+ the search when ``search``)."""

    profile_steps: int = 2
    """Training steps to profile per-op compute times and link delays before planning (>= 1)."""

    search: bool = False
    """Refine the planned warm-up counts by a bounded search over nearby plans, evaluated with the
    simulator (PipeMorph schedule only)."""

    search_budget_ms: float = 200.0
    """Wall-clock budget of that search per re-plan, in ms (> 0)."""

    transport: str = "default"
    """Pipeline send/recv path: default (torch.distributed P2P) | delegate (via host-side delegate
    processes, §5: never blocks the compute stream) | auto (default, switched to delegate on links
    detected as slow)."""

    link_queue_depth: int = 2
    """Default-transport model: messages in flight per link and direction before a sender blocks
    (head-of-line blocking, §2.3). Used by the link emulator and the simulator (>= 1)."""

    delegates_per_link: int = 1
    """Delegate processes per link and direction when the delegate transport is used (>= 1)."""

    detect_consecutive: int = 3
    """k: a link is declared slow after k consecutive steps above its Eq. 1 tolerance (>= 1)."""

    recover_consecutive: int = 5
    """m: a slow link is declared healthy after m consecutive steps below the recovery threshold
    (>= 1)."""

    detect_margin: float = 0.1
    """A step counts as slow when a link's delay exceeds its Eq. 1 tolerance by this fraction
    (>= 0; 0.1 = 10 % above)."""

    recover_ratio: float = 0.5
    """A step counts as healthy when a slow link's delay is below this fraction of its tolerance
    (0 < ratio <= 1)."""

    adapt: bool = True
    """Re-plan at step boundaries when links turn slow or recover (Alg. 2); false keeps the initial
    plan (Alg. 1) for the whole run."""

    monitor: bool = True
    """Profile every step of titan_morph's schedules (PipeMorph, ZBH1, ZBH2, Morph1F1B): per-op
    compute times and per-link delivery delays, exchanged over a CPU group and written to
    TensorBoard (``morph/delay_ms/link<i>``...). Required by ``adapt``."""

    detect_min_ms: float = 5.0
    """Delays at or below this never count as slow, whatever the plan's tolerance (host and network
    jitter; >= 0 ms)."""

    adapt_memory_budget: int = 0
    """In-flight microbatch cap of adapted plans when slow links are delegated (``transport`` auto or
    delegate): 0 = none, the paper's §4.2 relaxation (activations may move to host memory). With
    the default transport adapted plans keep ``memory_budget``. Else >= the pipeline degree."""

    inject: Inject = field(default_factory=Inject)
    synthetic: Synthetic = field(default_factory=Synthetic)


@dataclass
class JobConfig:
    """Merged into TorchTitan's JobConfig by ``job.custom_config_module``."""

    morph: Morph = field(default_factory=Morph)


# --------------------------------------------------------------------------------------------
# Validation


def _fail(key: str, value: Any, allowed: str) -> MorphConfigError:
    return MorphConfigError(f"invalid [morph] option {key} = {value!r}: {allowed}")


def check_unknown_keys(table: Mapping[str, Any], cls: type = Morph, prefix: str = "morph") -> None:
    """Reject keys of a raw ``[morph]`` TOML table that :class:`Morph` does not define."""
    known = {f.name: f for f in fields(cls)}
    for key, value in table.items():
        if key not in known:
            raise MorphConfigError(
                f"unknown [morph] option {prefix}.{key}: allowed keys in [{prefix}] are {', '.join(sorted(known))}"
            )
        ftype = known[key].type
        if is_dataclass(ftype):
            if not isinstance(value, Mapping):
                raise _fail(f"{prefix}.{key}", value, f"must be a table [{prefix}.{key}]")
            check_unknown_keys(value, ftype, f"{prefix}.{key}")  # type: ignore[arg-type]


def _expect_type(key: str, value: Any, typ: type) -> None:
    if typ is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif typ is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, typ)
    if not ok:
        hint = ' (write lists as one quoted string, e.g. "0,0,60")' if isinstance(value, list) else ""
        raise _fail(key, value, f"must be of type {typ.__name__}, got {type(value).__name__}{hint}")


def _check_types(obj: Any, prefix: str) -> None:
    for f in fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}.{f.name}"
        if is_dataclass(f.type):
            if not is_dataclass(value):
                raise _fail(key, value, f"must be a table [{key}]")
            _check_types(value, key)
        elif f.type in (int, float, str, bool):
            _expect_type(key, value, f.type)  # type: ignore[arg-type]


def _choice(key: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise _fail(key, value, f"allowed values are {' | '.join(allowed)}")


def _at_least(key: str, value: float, low: float, what: str = "") -> None:
    if not (value >= low and math.isfinite(value)):
        raise _fail(key, value, f"must be >= {low}{what}")


def parse_per_stage(spec: str, stages: int | None, key: str) -> tuple[float, ...]:
    """Parse "10" or "10,12,..." (one per stage) into finite non-negative ms values."""
    try:
        values = [float(p) for p in str(spec).split(",")]
    except ValueError:
        raise _fail(
            key, spec, 'must be a number of ms or a comma-separated list, one per stage ("10,12,10,10")'
        ) from None
    for v in values:
        if not (v >= 0 and math.isfinite(v)):
            raise _fail(key, spec, "times must be finite and >= 0 ms")
    if stages is not None:
        if len(values) == 1:
            values = values * stages
        if len(values) != stages:
            raise _fail(key, spec, f"needs 1 value or {stages} values (one per stage), got {len(values)}")
    return tuple(values)


def parse_stage_times(spec: str, stages: int | None) -> tuple[tuple[float, float, float], ...] | None:
    """``stage_times_ms`` → one (F, B, W) triple per stage, or None when empty (= profile)."""
    key = "morph.stage_times_ms"
    if spec.strip() == "":
        return None
    triples = []
    for part in spec.split(";"):
        try:
            triple = tuple(float(p) for p in part.split(","))
        except ValueError:
            triple = ()
        if len(triple) != 3 or not all(v >= 0 and math.isfinite(v) for v in triple):
            raise _fail(key, spec, 'expected "F,B,W" ms (finite, >= 0) for all stages or "F,B,W;F,B,W;..." per stage')
        triples.append(triple)
    if stages is not None:
        if len(triples) == 1:
            triples = triples * stages
        if len(triples) != stages:
            raise _fail(key, spec, f"needs 1 triple or {stages} triples (one per stage), got {len(triples)}")
    return tuple(triples)  # type: ignore[return-value]


def parse_plan_delays(spec: str, num_links: int | None) -> tuple[float, ...] | None:
    """``plan_delays_ms`` → one finite delay per link, or None when empty (plan without delays)."""
    key = "morph.plan_delays_ms"
    if str(spec).strip() == "":
        return None
    n = num_links if num_links is not None else len(str(spec).split(","))
    try:
        delays = parse_delays(spec, n, key)
    except ValueError as err:
        raise _fail(key, spec, f'{err} (e.g. "0,0,60": one value per link, or one for every link)') from None
    if not all(math.isfinite(d) for d in delays):
        raise _fail(key, spec, "planned delays must be finite ms (a link that is down cannot be planned around)")
    return delays


def parse_interval(spec: str) -> tuple[float, float]:
    """``random_interval_ms`` "low,high" → (low, high) with 0 < low <= high."""
    key = "morph.inject.random_interval_ms"
    try:
        low, high = (float(p) for p in str(spec).split(","))
    except ValueError:
        raise _fail(key, spec, 'expected "low,high" in ms') from None
    if not (0 < low <= high and math.isfinite(high)):
        raise _fail(key, spec, "needs 0 < low <= high (finite ms)")
    return low, high


def parse_links(spec: str, num_links: int | None) -> tuple[int, ...] | None:
    """``inject.links`` "0,2" → (0, 2); "" → None (every link)."""
    key = "morph.inject.links"
    if str(spec).strip() == "":
        return None
    try:
        links = tuple(int(p) for p in str(spec).split(","))
    except ValueError:
        raise _fail(key, spec, 'expected comma-separated link ids, e.g. "0,2"') from None
    hi = None if num_links is None else num_links - 1
    for link in links:
        if link < 0 or (hi is not None and link > hi):
            raise _fail(key, spec, f"link ids must be in 0..{hi}" if hi is not None else "link ids must be >= 0")
    return links


def _trace_path(spec: str) -> str:
    return spec if spec in BUILTIN_TRACES else os.path.expanduser(spec)


def validate_morph(morph: Morph, pp_degree: int | None = None) -> None:
    """Check every ``[morph]`` option; raise one :class:`MorphConfigError` for the first bad one.

    ``pp_degree`` (stages S, links S-1) enables the checks that depend on the pipeline layout
    (list lengths, link ids, memory budget); without it only layout-independent checks run.
    """
    _check_types(morph, "morph")
    links = None if pp_degree is None else max(pp_degree - 1, 0)

    if morph.memory_budget != 0:
        low = pp_degree if pp_degree is not None else 1
        if morph.memory_budget < low:
            raise _fail(
                "morph.memory_budget",
                morph.memory_budget,
                f"must be 0 (auto) or >= the pipeline degree ({low}): every stage needs one in-flight "
                "microbatch more than the next (Alg. 1)",
            )
    parse_stage_times(morph.stage_times_ms, pp_degree)
    parse_plan_delays(morph.plan_delays_ms, links)
    _at_least("morph.profile_steps", morph.profile_steps, 1)
    if not (morph.search_budget_ms > 0 and math.isfinite(morph.search_budget_ms)):
        raise _fail("morph.search_budget_ms", morph.search_budget_ms, "must be a finite number of ms > 0")
    _choice("morph.transport", morph.transport, TRANSPORTS)
    _at_least("morph.link_queue_depth", morph.link_queue_depth, 1)
    _at_least("morph.delegates_per_link", morph.delegates_per_link, 1)
    _at_least("morph.detect_consecutive", morph.detect_consecutive, 1, " (steps)")
    _at_least("morph.recover_consecutive", morph.recover_consecutive, 1, " (steps)")
    _at_least("morph.detect_margin", morph.detect_margin, 0.0, " (a fraction of the tolerance)")
    if not (0 < morph.recover_ratio <= 1):
        raise _fail("morph.recover_ratio", morph.recover_ratio, "must satisfy 0 < recover_ratio <= 1")
    if not (morph.detect_min_ms >= 0 and math.isfinite(morph.detect_min_ms)):
        raise _fail("morph.detect_min_ms", morph.detect_min_ms, "must be a finite number of ms >= 0")
    if morph.adapt_memory_budget != 0 and morph.adapt_memory_budget < (pp_degree or 1):
        raise _fail(
            "morph.adapt_memory_budget",
            morph.adapt_memory_budget,
            f"must be 0 (no cap) or >= the pipeline degree ({pp_degree or 1})",
        )
    if morph.adapt and not morph.monitor:
        raise _fail("morph.adapt", morph.adapt, "needs morph.monitor = true (adaptation acts on the monitor's data)")

    inj = morph.inject
    _choice("morph.inject.mode", inj.mode, INJECT_MODES)
    _choice("morph.inject.direction", inj.direction, INJECT_DIRECTIONS)
    _at_least("morph.inject.start_step", inj.start_step, 1, " (steps are 1-based)")
    if inj.end_step != 0 and inj.end_step < inj.start_step:
        raise _fail(
            "morph.inject.end_step", inj.end_step, f"must be 0 (never stop) or >= start_step ({inj.start_step})"
        )
    if inj.delays_ms.strip() or inj.mode == "static":
        try:
            parse_delays(inj.delays_ms, links if links is not None else len(inj.delays_ms.split(",")), "delays_ms")
        except ValueError as err:
            raise _fail("morph.inject.delays_ms", inj.delays_ms, str(err)) from None
    if inj.mode == "static" and not inj.delays_ms.strip():
        raise _fail("morph.inject.delays_ms", inj.delays_ms, 'static mode needs per-link delays, e.g. "0,0,60"')
    parse_links(inj.links, links)
    _at_least("morph.inject.random_mean_ms", inj.random_mean_ms, 0.0, " ms")
    _at_least("morph.inject.random_std_ms", inj.random_std_ms, 0.0, " ms")
    parse_interval(inj.random_interval_ms)
    if inj.mode == "trace":
        if not inj.trace_file:
            raise _fail(
                "morph.inject.trace_file", inj.trace_file, f"trace mode needs a CSV path or one of {BUILTIN_TRACES}"
            )
        path = _trace_path(inj.trace_file)
        if path not in BUILTIN_TRACES:
            if not os.path.isfile(path):
                raise _fail("morph.inject.trace_file", inj.trace_file, "file not found")
            if links is not None:
                try:
                    TraceDelays.from_csv(path, links)
                except (ValueError, KeyError) as err:
                    raise _fail("morph.inject.trace_file", inj.trace_file, str(err)) from None

    syn = morph.synthetic
    for name in ("fwd_ms", "bwd_ms", "wgt_ms"):
        parse_per_stage(getattr(syn, name), pp_degree, f"morph.synthetic.{name}")
    if not isinstance(syn.hidden, int) or syn.hidden < 16 or syn.hidden % 16:
        raise _fail("morph.synthetic.hidden", syn.hidden, "must be a multiple of 16, >= 16")


def validate_job_config(job_config: Any) -> Morph:
    """Validate ``job_config.morph`` against the job's PP degree."""
    morph = getattr(job_config, "morph", None)
    if morph is None:
        raise MorphConfigError(
            "the [morph] section is missing: set [job] custom_config_module = 'titan_morph.integration.config'"
        )
    par = job_config.parallelism
    validate_morph(morph, par.pipeline_parallel_degree if par.pipeline_parallel_degree > 1 else None)
    return morph


# --------------------------------------------------------------------------------------------
# Typed views used by the runtime


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


def link_model_from_config(inject: Inject, num_links: int, steps: int = 200) -> LinkModel | None:
    """The injected-delay model of ``[morph.inject]`` for ``num_links`` links (None when mode = none).

    ``steps`` (the run's training steps) rescales the built-in Table 3 trace onto the run.
    """
    if inject.mode == "none":
        return None
    if inject.mode == "static":
        inner: LinkModel = StaticDelays(parse_delays(inject.delays_ms, num_links, "morph.inject.delays_ms"))
    elif inject.mode == "random":
        inner = RandomDelays(
            num_links,
            inject.random_mean_ms,
            inject.random_std_ms,
            parse_interval(inject.random_interval_ms),
            inject.seed,
            parse_links(inject.links, num_links),
        )
    elif inject.mode == "trace":
        path = _trace_path(inject.trace_file)
        inner = table3_trace(num_links + 1, steps) if path == "table3" else TraceDelays.from_csv(path, num_links)
    else:
        raise _fail("morph.inject.mode", inject.mode, f"allowed values are {' | '.join(INJECT_MODES)}")
    return _Windowed(inner, inject.start_step, inject.end_step, inject.direction)
