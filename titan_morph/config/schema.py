"""The ``[morph]`` tables: titan_morph's options as typed dataclasses, merged into the job config.

TorchTitan 0.2.2 merges :class:`JobConfig` into its own (``[job] custom_config_module =
"titan_morph.integration.titan022.config"``), so ``[morph]``, ``[morph.inject]`` and ``[morph.synthetic]`` are
read from the TOML file and ``--morph.key value`` overrides them. The field types say what is
allowed (:mod:`titan_morph.config.fields`); the values here are as the user wrote them (lists made
lists), and :func:`titan_morph.config.resolve` turns them into one frozen, parsed
:class:`~titan_morph.config.settings.Settings`. Nothing else reads these classes.

(No ``from __future__ import annotations``: TorchTitan's config merger and tyro inspect the field
types at runtime.)
"""

from dataclasses import dataclass, field, fields
from typing import Annotated, Literal, get_args, get_origin

from titan_morph.config.cli import Bool, FloatList, IntList, PairList
from titan_morph.config.fields import Per, Range, RankPairs, coerce_list, coerce_pairs, unwrap

__all__ = [
    "Inject",
    "JobConfig",
    "Morph",
    "Synthetic",
    "TRANSPORTS",
    "INJECT_MODES",
    "MAX_DELEGATES_PER_LINK",
    "PARTITIONS",
]

Transport = Literal["default", "delegate", "auto"]
Partition = Literal["even", "auto", "manual"]
Orchestrator = Literal["off", "pp", "any"]
ControlGroups = Literal["auto", "separate"]
InjectMode = Literal["none", "static", "random", "trace", "break"]
InjectDirection = Literal["both", "fwd", "bwd"]
TRANSPORTS: tuple[str, ...] = get_args(Transport)
ORCHESTRATORS: tuple[str, ...] = get_args(Orchestrator)
CONTROL_GROUPS: tuple[str, ...] = get_args(ControlGroups)
INJECT_MODES: tuple[str, ...] = get_args(InjectMode)
INJECT_DIRECTIONS: tuple[str, ...] = get_args(InjectDirection)
PARTITIONS: tuple[str, ...] = get_args(Partition)
MAX_DELEGATES_PER_LINK = 64
"""Delegate processes per link and direction the delegated transport accepts."""


def _coerce_fields(obj: object) -> None:
    """List-typed fields given as strings or scalars (TOML, Python) become lists, rank pairs
    ``"a-b"`` strings; what does not parse stays as written, for the check pass to name."""
    for f in fields(obj):  # type: ignore[arg-type]
        base, meta = unwrap(f.type)
        if any(isinstance(m, RankPairs) for m in meta):
            setattr(obj, f.name, coerce_pairs(getattr(obj, f.name)))
        elif get_origin(base) is list:
            setattr(obj, f.name, coerce_list(getattr(obj, f.name), get_args(base)[0]))


DelayList = Annotated[FloatList, Range(0, allow_inf=True, delay=True), Per("link", or_pairs=True)]
RankPairList = Annotated[PairList, RankPairs()]
PlanDelayList = Annotated[FloatList, Range(0, delay=True), Per("link")]
StageMsList = Annotated[FloatList, Range(0), Per("stage", required=True, or_layers=True)]
RankFactorList = Annotated[FloatList, Range(0, low_open=True), Per("rank")]
ComputeFactorList = Annotated[FloatList, Range(0, low_open=True), Per("rank", or_world=True)]


@dataclass
class Inject:
    """``[morph.inject]``: emulated communication stragglers on pipeline links (paper §7).

    Link ``i`` joins stage ``i`` and ``i+1``; a run with PP degree S has S-1 links.
    """

    mode: InjectMode = "none"
    """none | static (fixed ``delays_ms`` and/or ``compute_factor``) | random (§7.2: N(mean, std)
    re-drawn every U(interval) ms) | trace (replay ``trace_file``, e.g. the paper's Table 3) | break (the default
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
    """trace mode: a CSV file whose rows each set a link (step|time_ms, link, delay_ms[, direction][,
    bandwidth_mbit]) or a rank (step, rank, compute_factor), one file for both; or "table3" for the
    built-in (rescaled) Table 3 trace of the paper."""

    bandwidth_mbit: Annotated[FloatList, Range(0), Per("link")] = field(default_factory=list)
    """Per-link rate in Mbit/s (one value per link, or one for all; 0 = unlimited): a link then
    sends one message at a time per direction, each taking size / rate before its delay (static,
    random and trace modes; a trace's ``bandwidth_mbit`` column overrides it). [] = unlimited."""

    random_bandwidth_mbit: Annotated[FloatList, Range(0, low_open=True)] = field(default_factory=list)
    """random mode: [low, high] Mbit/s; the rate of each of ``links`` is re-drawn from U(low, high)
    whenever its delay is. [] = the rate is ``bandwidth_mbit``."""

    compute_factor: ComputeFactorList = field(default_factory=list)
    """Emulated compute stragglers: per pipeline rank, a multiplier of every op's time (2 = twice as
    slow; one value for every rank); with data parallelism also one value per rank of the world
    ([1, 1, 1, 2]: rank 3 alone), which belongs to the rank's host and moves with it when the
    orchestrator moves hosts (a slow GPU). static mode: from ``start_step`` to ``end_step``; random mode:
    each rank whose value is above 1 draws its factor per step from U(1, value) (``seed``); trace
    mode: not used, the trace's rank rows (step, rank, compute_factor) set the factors. The
    synthetic testbed pads its ops to their time x the factor; the real model sleeps (factor - 1) x
    each op's measured time after it (so below 1 only on the testbed). [] = none."""

    def __post_init__(self) -> None:
        _coerce_fields(self)


@dataclass
class Synthetic:
    """``[morph.synthetic]``: a synthetic-compute testbed replacing the model's stages.

    Each stage sleeps/computes for the given times and exchanges ``hidden``-wide activations, so
    schedules can be studied with exact, controllable F/B/W costs.
    """

    enabled: Bool = False
    """Replace the model stages by synthetic ones."""

    layers: Annotated[int, Range(0)] = 0
    """Transformer layers of the synthetic model (``[model] flavor = "synthetic"``), so that a
    partition can move them between stages: ``fwd_ms``, ``bwd_ms`` and ``wgt_ms`` are then per layer
    (one value for every layer, or one per layer) and a stage's op is padded to the sum of its
    layers' times x its rank's compute factor. 0 = one layer per stage, the times per stage."""

    fwd_ms: StageMsList = field(default_factory=lambda: [10.0])
    """Forward time per microbatch in ms: one value for every stage, or one per stage [10, 10, 12, 10]
    (with ``layers``: per layer)."""

    bwd_ms: StageMsList = field(default_factory=lambda: [10.0])
    """Input-gradient backward (I / the paper's B) time per microbatch in ms (same format)."""

    wgt_ms: StageMsList = field(default_factory=lambda: [10.0])
    """Weight-gradient backward (W) time per microbatch in ms (same format)."""

    hidden: Annotated[int, Range(16)] = 64
    """Model width (float32 elements per token sent between stages) of the ``synthetic`` model
    flavor (``[model] flavor = "synthetic"``): a multiple of 16 (one attention head per 16)."""

    message_kb: Annotated[float, Range(0)] = 0.0
    """Size of every activation and gradient message between synthetic stages in KiB, whatever
    the compute times (congestion studies); 0 = ``hidden``-wide activations."""

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

    plan_transmit_ms: PlanDelayList = field(default_factory=list)
    """Per-link transmit time in ms of one pipeline message that PipeMorph's initial plan assumes
    beside ``plan_delays_ms`` (a limited link: size / rate, sent one at a time per direction), e.g.
    [0, 0, 27.3]; [] = none (or the injected rates' on emulated links). Needs ``plan_delays_ms``."""

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
    ``monitor``). With ``partition = "auto"``: the steps after the first whose stage times give the
    per-layer costs and every rank's baseline speed."""

    search: Bool = False
    """Refine PipeMorph's plan by the simulator-guided search (warm-ups, in-flight caps and op
    orders), seeded with Alg. 1/2 and every baseline that fits the memory budget."""

    search_iterations: Annotated[int, Range(0)] = 0
    """The search's work, in iterations: it fixes the plan (the same on every rank), and more never
    gives a worse one. 0 = as many as take about ``search_budget_ms`` of CPU on the reference box."""

    search_budget_ms: Annotated[float, Range(0, low_open=True)] = 200.0
    """The search's work in ms of CPU when ``search_iterations`` is 0, converted into a fixed number
    of iterations (so the plan does not depend on the machine's load); a search over ``plan_samples``
    delay vectors takes fewer, each costing more, within the same budget."""

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

    partition: Partition = "even"
    """Which layers each pipeline stage holds: even (TorchTitan's split: the layers spread evenly, the
    embedding and the output counted as a layer each; the synthetic model's layers exactly evenly) |
    auto (starts even; after ``profile_steps`` and whenever a rank's compute slows or recovers,
    re-plans the schedule for the measured times, then moves layers through a checkpoint and a
    relaunch by ./run_train.sh's launcher once the time the old split has lost exceeds
    ``repartition_after`` x the relaunch cost, estimated before a relaunch, then measured) | manual
    (TorchTitan's split options: [parallelism] module_fqns_per_model_part,
    pipeline_parallel_layers_per_stage, pipeline_parallel_first_stage_less_layers /
    pipeline_parallel_last_stage_less_layers). auto
    needs a titan_morph schedule with one stage per rank, ``monitor`` and [checkpoint] enable = true.
    With data parallelism every replica holds the same layers: auto re-plans each pipeline for its
    measured speeds and never moves layers (``rebalance_microbatches`` moves microbatches instead)."""

    repartition_after: Annotated[float, Range(0)] = 1.0
    """partition = auto: move layers once the time lost since a compute change (per step, the planned
    step of the split running now less that of the best split) exceeds this x the relaunch cost: 1 =
    ski rental (at most twice the best choice in hindsight at the price paid; ``1 + max(e, 1/e)``
    for a price estimated ``e`` times the one paid). A move that cannot pay for itself in the steps
    left is not made, except with 0: at once, whatever it costs (tests, demos)."""

    repartition_min_gain: Annotated[float, Range(0, 1)] = 0.05
    """partition = auto: the least gain worth a relaunch, as a fraction of the planned step of the
    split running now (0.05 = 5 %)."""

    rank_memory_gb: RankFactorList = field(default_factory=list)
    """Memory per pipeline rank for its layers' parameters, gradients and optimizer state and the
    activations of its microbatches in flight, in GB (one value for every rank): partition = auto
    keeps every split within it, and a split that exceeds it is refused before any rank starts.
    [] = unbounded. Estimated from the model's shape (README, "Partitions")."""

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

    rebalance_microbatches: Bool = True
    """DP x PP: move microbatches between the data-parallel replicas in proportion to their measured
    speed (a replica computes as fast as its slowest rank), with the global batch unchanged: the same
    samples per step and the same gradients as the even split, each replica's pipeline re-planned for
    its own count at a step boundary (no restart), back to even when the straggler recovers. Acts
    with pipeline and data parallelism, a titan_morph schedule and ``monitor``; false keeps the even
    split (or ``replica_microbatches``)."""

    replica_microbatches: Annotated[IntList, Range(0)] = field(default_factory=list)
    """DP x PP: the microbatches each data-parallel replica starts with, one count per replica, each
    >= 1 and at most 2 x N, summing to the global batch (data-parallel degree x N; N =
    local_batch_size / pipeline_parallel_microbatch_size). [] = N each (even)."""

    control_groups: ControlGroups = "auto"
    """Where the control plane talks (the per-step exchange, the detectors' data, the microbatch
    rebalance, the orchestrator's measurements, the clock): auto (gloo groups made beside the job's
    own on NCCL; on a CPU job its own gloo groups) | separate (new gloo groups on every backend: a
    CPU job then takes the control path an NCCL job takes). The decisions are the same either way."""

    data_ifname: str = ""
    """Network interface of the default pipeline path (the per-link groups; on a GPU cluster what
    NCCL's RNIC is), e.g. "data"; "" = torch's choice (``GLOO_SOCKET_IFNAME`` or the hostname's)."""

    host_ifnames: str = ""
    """Network interface of the host-side traffic: delegates, the per-step exchange and the store,
    e.g. "host" (the paper's CPU-side NIC, §5); one name for now (the field takes a comma-separated
    list so that failing over to a second host NIC can come without renaming it). "" = torch's choice."""

    profiles_file: str = ""
    """A JSON-lines file that pipeline rank 0 appends every step's exchanged profiles to (every
    stage's op totals and message stamps, on the common clock: what the monitor decided from, for
    a look afterwards or a test fixture); "" = none."""

    inject: Inject = field(default_factory=Inject)
    synthetic: Synthetic = field(default_factory=Synthetic)

    def __post_init__(self) -> None:
        _coerce_fields(self)


@dataclass
class JobConfig:
    """Merged into TorchTitan's JobConfig by ``job.custom_config_module``."""

    morph: Morph = field(default_factory=Morph)
