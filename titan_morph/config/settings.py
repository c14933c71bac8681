"""The resolved configuration: one frozen object, parsed once, read by every layer above.

:func:`titan_morph.config.resolve` fills :class:`Settings`: lists as tuples with one value (or
group) per link and per stage, rank pairs as tuples, and the derived values (world size,
microbatches, delay limit; stage times, planned delays and their samples on demand).
:class:`JobView` is what titan_morph needs of the TorchTitan job, filled by the adapter of the
running TorchTitan release.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from titan_morph.comm.timeouts import CommTimeouts
from titan_morph.config.fields import ConfigError
from titan_morph.monitor.detect import DetectRule
from titan_morph.pipelining.search.robust import sample_delays

__all__ = ["InjectSettings", "JobView", "MorphSettings", "Settings", "SyntheticSettings"]

Triple = tuple[float, float, float]


@dataclass(frozen=True)
class JobView:
    """What titan_morph reads of a TorchTitan job, whatever the release: the adapter of each release
    fills every field from that release's config (``integration``). ``ranks``: the number of ranks
    the launcher was told to start (``NGPU``), None when it follows from the degrees. The resolved
    classes below have no defaults: the schema (:mod:`titan_morph.config.schema`) holds the only ones."""

    pipeline_parallel_degree: int
    data_parallel_replicate_degree: int
    data_parallel_shard_degree: int
    tensor_parallel_degree: int
    context_parallel_degree: int
    local_batch_size: int
    microbatch_size: int
    schedule: str
    stages_per_rank: int | None
    steps: int
    init_timeout_s: float
    train_timeout_s: float
    checkpoint: bool
    ranks: int | None
    split_options: tuple[str, ...] = ()
    """TorchTitan's split options the config sets ("module_fqns_per_model_part", ...): a manual split."""
    split: tuple[int, ...] | None = None
    """Transformer layers per stage this launch runs when a re-partition relaunched it
    (``$TITAN_MORPH_SPLIT``); None = the configured split."""
    fsdp_reshard_after_forward: str = "default"
    """``[parallelism] fsdp_reshard_after_forward``: ``always`` all-gathers a stage's parameters per
    microbatch, so replicas of other microbatch counts would issue other numbers of collectives."""

    @property
    def degrees(self) -> dict[str, int]:
        return {
            "pipeline_parallel_degree": self.pipeline_parallel_degree,
            "data_parallel_replicate_degree": self.data_parallel_replicate_degree,
            "data_parallel_shard_degree": self.data_parallel_shard_degree,
            "tensor_parallel_degree": self.tensor_parallel_degree,
            "context_parallel_degree": self.context_parallel_degree,
        }


@dataclass(frozen=True)
class InjectSettings:
    """``[morph.inject]``, parsed (see :class:`~titan_morph.config.schema.Inject` for each option)."""

    mode: str
    delays_ms: tuple[float, ...]
    """One per link (or per rank pair with ``rank_links``); () when not set."""
    rank_links: tuple[tuple[int, int], ...]
    direction: str
    start_step: int
    end_step: int
    links: tuple[int, ...]
    random_mean_ms: float
    random_std_ms: float
    random_interval_ms: tuple[float, ...]
    seed: int
    trace_file: str
    bandwidth_mbit: tuple[float, ...]
    """One rate per link (0 = unlimited); () when not set."""
    random_bandwidth_mbit: tuple[float, ...]
    compute_factor: tuple[float, ...]
    """One factor per pipeline rank, or one per rank of the world (a host); () when not set."""

    def window(self, steps: int) -> tuple[int, int] | None:
        """First and last step of the injected straggler (None when nothing is injected)."""
        return None if self.mode == "none" else (self.start_step, self.end_step or steps)


@dataclass(frozen=True)
class SyntheticSettings:
    """``[morph.synthetic]``, parsed: one value per stage where the pipeline is known."""

    KEY: ClassVar[str] = "morph.synthetic"
    """The table's name in error messages."""
    enabled: bool
    """Whether the model's stages are replaced by synthetic ones."""
    layers: int
    """Transformer layers of the synthetic model; 0 = one per stage."""
    fwd_ms: tuple[float, ...]
    bwd_ms: tuple[float, ...]
    wgt_ms: tuple[float, ...]
    """F, B and W in ms per microbatch: one per stage (one for all where the stages are unknown),
    or one per layer with ``layers``."""
    hidden: int
    message_kb: float
    """KiB per message between stages; 0 = ``hidden``-wide activations."""


@dataclass(frozen=True)
class MorphSettings:
    """``[morph]``, parsed (see :class:`~titan_morph.config.schema.Morph` for each option)."""

    memory_budget: int
    stage_times_ms: tuple[float, ...]
    """Flat F, B, W per stage; () = profile them."""
    plan_delays_ms: tuple[float, ...]
    plan_transmit_ms: tuple[float, ...]
    plan_delays_std_ms: tuple[float, ...]
    plan_samples: int
    plan_seed: int
    profile_steps: int
    search: bool
    search_iterations: int
    search_budget_ms: float
    transport: str
    link_queue_depth: int
    delegates_per_link: int
    detect_consecutive: int
    recover_consecutive: int
    detect_margin: float
    recover_ratio: float
    adapt: bool
    monitor: bool
    detect_min_ms: float
    adapt_memory_budget: int
    partition: str
    repartition_after: float
    repartition_min_gain: float
    rank_memory_gb: tuple[float, ...]
    orchestrator: str
    dp_detect_min_ms: float
    rebalance_microbatches: bool
    replica_microbatches: tuple[int, ...]
    control_groups: str
    data_ifname: str
    host_ifnames: str
    profiles_file: str
    inject: InjectSettings
    synthetic: SyntheticSettings
    split: tuple[int, ...] | None
    """Transformer layers per stage this launch runs (:attr:`JobView.split`); None = the configured split."""

    @property
    def depth(self) -> int | None:
        """Link-queue depth of the configured transport: ``link_queue_depth`` for the blocking
        default path (also ``auto``, which runs it until a link is delegated), None (never blocks)
        for the delegated one."""
        return None if self.transport == "delegate" else self.link_queue_depth

    @property
    def host_interfaces(self) -> tuple[str, ...]:
        """``host_ifnames`` as a tuple, in order of preference (() = torch's choice)."""
        return tuple(n.strip() for n in self.host_ifnames.split(",") if n.strip())

    @property
    def control_interface(self) -> str:
        """The interface the control plane's gloo groups bind to: the first of ``host_ifnames``
        ("" = torch's choice)."""
        return self.host_interfaces[0] if self.host_interfaces else ""

    @property
    def routed(self) -> bool:
        """Whether a torch schedule's traffic must be routed (injected delays, a non-default path, or
        the default path on its own NIC)."""
        return self.inject.mode != "none" or self.transport != "default" or bool(self.data_ifname)

    def detect_rule(self, floor_ms: float | None = None) -> DetectRule:
        """The detector's rules (``detect_*``/``recover_*``); the floor is ``detect_min_ms`` unless
        ``floor_ms`` is given (DP pairs: ``dp_detect_min_ms``)."""
        return DetectRule(
            detect_steps=self.detect_consecutive,
            recover_steps=self.recover_consecutive,
            margin=self.detect_margin,
            recover_ratio=self.recover_ratio,
            floor_ms=self.detect_min_ms if floor_ms is None else floor_ms,
        )

    def stage_times(self, stages: int) -> tuple[Triple, ...] | None:
        """Per-stage (F, B, W) ms for ``stages`` stages: ``stage_times_ms``, else the synthetic
        testbed's times when it is on (with ``layers``: each stage's layers summed, for the split
        this launch runs), else None (unknown: profiled at run time)."""
        if self.stage_times_ms:
            flat = _for_stages(self.stage_times_ms, stages, 3, "morph.stage_times_ms")
            return tuple((flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3))
        syn = self.synthetic
        if not syn.enabled:
            return None
        if syn.layers:
            per_layer = self.layer_times()
            split = self.synthetic_split(stages)
            chunks = [per_layer[sum(split[:s]) : sum(split[: s + 1])] for s in range(stages)]
            return tuple((sum(t[0] for t in c), sum(t[1] for t in c), sum(t[2] for t in c)) for c in chunks)
        f, b, w = (_for_stages(getattr(syn, n), stages, 1, f"{syn.KEY}.{n}") for n in ("fwd_ms", "bwd_ms", "wgt_ms"))
        return tuple(zip(f, b, w))

    def layer_times(self) -> tuple[Triple, ...]:
        """The synthetic model's (F, B, W) ms per layer (``layers`` of them)."""
        syn = self.synthetic
        f, b, w = (
            _for_stages(getattr(syn, n), syn.layers, 1, f"{syn.KEY}.{n}") for n in ("fwd_ms", "bwd_ms", "wgt_ms")
        )
        return tuple(zip(f, b, w))

    def synthetic_split(self, stages: int) -> tuple[int, ...]:
        """The synthetic model's layers per stage: :attr:`split`, else as even as counts go."""
        if self.split is not None:
            if len(self.split) != stages or sum(self.split) != self.synthetic.layers:
                raise ConfigError(
                    f"TITAN_MORPH_SPLIT: {list(self.split)} is not a split of {self.synthetic.layers} layers"
                    f" into {stages} stages"
                )
            return self.split
        q, r = divmod(self.synthetic.layers, stages)
        return tuple(q + (s < r) for s in range(stages))

    def plan_delays(self, num_links: int) -> tuple[float, ...] | None:
        """The per-link delays PipeMorph plans for from the start, or None (Alg. 1 without delays)."""
        return _for_stages(self.plan_delays_ms, num_links, 1, "morph.plan_delays_ms") if self.plan_delays_ms else None

    def plan_transmit(self, num_links: int) -> tuple[float, ...] | None:
        """The per-link transmit times PipeMorph's initial plan assumes (``plan_transmit_ms``), or None."""
        if not self.plan_transmit_ms:
            return None
        return _for_stages(self.plan_transmit_ms, num_links, 1, "morph.plan_transmit_ms")

    def plan_delay_samples(self, num_links: int) -> tuple[tuple[float, ...], ...] | None:
        """``plan_samples`` delay vectors from N(``plan_delays_ms``, ``plan_delays_std_ms``), or None
        when the initial plan is made for one vector (no std, or no samples)."""
        mean = self.plan_delays(num_links)
        if mean is None or not self.plan_delays_std_ms or not self.plan_samples:
            return None
        std = _for_stages(self.plan_delays_std_ms, num_links, 1, "morph.plan_delays_std_ms")
        return sample_delays(mean, std, links=num_links, samples=self.plan_samples, seed=self.plan_seed)


def _for_stages(values: tuple[float, ...], count: int, width: int, key: str) -> tuple[float, ...]:
    """``values`` for ``count`` links or stages: as resolved, or one group repeated (a layout the
    checks could not know, e.g. the stages per rank that the model decides)."""
    if len(values) == count * width:
        return values
    if len(values) == width:
        return values * count
    raise ConfigError(f"{key}: {list(values)!r} needs {width} or {count * width} values for this pipeline ({count})")


@dataclass(frozen=True)
class Settings:
    """The whole resolved configuration of one job."""

    morph: MorphSettings
    job: JobView
    world_size: int
    """Ranks: the product of the parallel degrees (a shard degree of -1 takes the rest of ``ranks``)."""
    dp_degree: int
    """Data-parallel replicas of each pipeline stage."""
    microbatches: int
    """N = local_batch_size / microbatch_size."""
    delay_limit_ms: float
    """Largest injected or planned delay per message (:func:`~titan_morph.config.rules.delay_limit_ms`)."""

    @property
    def stages(self) -> int:
        """Pipeline ranks (the PP degree)."""
        return self.job.pipeline_parallel_degree

    @property
    def num_links(self) -> int:
        return max(self.stages - 1, 0)

    @property
    def hybrid(self) -> bool:
        """DP x PP: more than one pipeline stage and more than one data-parallel replica."""
        return self.stages > 1 and self.dp_degree > 1

    @property
    def replica_capacity(self) -> int:
        """The most microbatches one DP replica may run in a step: twice its even share, and no more
        than the global batch leaves when every other replica runs one."""
        n, dp = self.microbatches, self.dp_degree
        return min(dp * n - (dp - 1), 2 * n) if self.hybrid else n

    @property
    def replica_counts(self) -> tuple[int, ...]:
        """Microbatches per DP replica the job starts with: ``replica_microbatches``, else N each."""
        return self.morph.replica_microbatches or (self.microbatches,) * self.dp_degree

    @property
    def timeouts(self) -> CommTimeouts:
        """Every wait's bound: TorchTitan's ``[comm]`` timeouts."""
        return CommTimeouts(self.job.init_timeout_s, self.job.train_timeout_s)
