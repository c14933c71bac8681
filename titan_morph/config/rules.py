"""The rules between options: what no single field's type can say.

Three groups, run in this order by :func:`titan_morph.config.resolve`: the TorchTitan sections
titan_morph depends on (:func:`check_job`: degrees, batch and microbatch sizes, steps, timeouts,
the launcher's rank count), ``[morph]`` within itself (:func:`check_morph`), and ``[morph]``
against the job (:func:`check_joined`). Each raises one
:class:`~titan_morph.config.fields.ConfigError` whose message starts with the key.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from titan_morph.config.fields import Layout, fail, limit_reason
from titan_morph.config.links import bandwidth_keys, check_trace

if TYPE_CHECKING:
    from titan_morph.config.settings import InjectSettings, JobView, MorphSettings, Settings, SyntheticSettings

__all__ = [
    "AUTO_SCHEDULES",
    "MORPH_SCHEDULES",
    "SPLIT_OPTIONS",
    "check_job",
    "check_joined",
    "check_morph",
    "check_written_file",
    "delay_limit_ms",
    "dp_degree",
    "microbatches",
]

ONE_MICROBATCH_PER_STAGE = ("1f1b",)
"""Schedules that need at least as many microbatches as stages (torch's Schedule1F1B refuses fewer)."""
TORCH_SCHEDULES = ("1f1b", "gpipe")
"""Schedules without titan_morph's per-step exchange (no monitor, no orchestrator)."""


def dp_degree(job: JobView) -> int:
    """Data-parallel replicas of each pipeline stage (shard x replicate degrees; -1 counts as 1)."""
    return max(job.data_parallel_shard_degree, 1) * max(job.data_parallel_replicate_degree, 1)


def microbatches(job: JobView) -> int:
    """N = ``[training] local_batch_size`` / ``[parallelism] pipeline_parallel_microbatch_size``."""
    batch, size = job.local_batch_size, job.microbatch_size
    if batch < 1:
        raise fail("training.local_batch_size", batch, "must be >= 1")
    if size < 1 or batch % size:
        raise fail(
            "parallelism.pipeline_parallel_microbatch_size",
            size,
            f"must be >= 1 and divide training.local_batch_size ({batch})",
        )
    return batch // size


def delay_limit_ms(job: JobView) -> float:
    """Largest injected or planned delay per message: ``[comm] train_timeout_seconds`` x 1000 / N.

    With head-of-line blocking every one of a step's N microbatches can wait out the delay on the
    same link, and ranks waiting for that step in a collective must not hit the timeout.
    """
    return job.train_timeout_s * 1000.0 / microbatches(job)


def check_job(job: JobView) -> int:
    """The TorchTitan settings titan_morph relies on, and the launcher's rank count; returns the
    world size. TorchTitan itself would stop on most of these only once every rank has started."""
    for name, value in job.degrees.items():
        shard = name == "data_parallel_shard_degree"
        if value < 1 and not (shard and value == -1):
            allowed = ">= 1, or -1 (the ranks the other degrees leave)" if shard else ">= 1"
            raise fail(f"parallelism.{name}", value, f"must be {allowed}")
    if job.steps < 1:
        raise fail("training.steps", job.steps, "must be >= 1")
    for key, seconds in (
        ("comm.init_timeout_seconds", job.init_timeout_s),
        ("comm.train_timeout_seconds", job.train_timeout_s),
    ):
        if not (math.isfinite(seconds) and seconds > 0):
            raise fail(key, seconds, "must be a number of seconds > 0")
    others = math.prod(max(v, 1) for v in job.degrees.values())
    product = " x ".join(f"{k} {v}" for k, v in job.degrees.items() if v != 1)
    if job.ranks is None:  # the launcher starts the product (a shard degree of -1 then takes 1)
        return others
    if job.ranks < 1:
        raise fail("NGPU", job.ranks, "is not a number of ranks (>= 1)")
    if job.data_parallel_shard_degree == -1:
        if job.ranks % others:
            raise fail(
                "NGPU",
                job.ranks,
                f"must be a multiple of {others} ({product or 'all degrees 1'}): "
                "data_parallel_shard_degree = -1 takes the rest",
            )
        return job.ranks
    if job.ranks != others:
        raise fail(
            "NGPU",
            job.ranks,
            f"ranks, but the parallel degrees need {others} ({product or 'all degrees 1'}): "
            f"set NGPU = {others} or change the degrees",
        )
    return others


def _check_budgets(morph: MorphSettings, stages: int) -> None:
    for name in ("memory_budget", "adapt_memory_budget"):
        value = getattr(morph, name)
        if value != 0 and value < stages:
            raise fail(
                f"morph.{name}",
                value,
                f"must be 0 or >= the pipeline degree ({stages}): every stage needs one in-flight "
                "microbatch more than the next (Alg. 1)",
            )


def _check_rank_links(inj: InjectSettings, world: int | None) -> None:
    """``rank_links``: ranks below the world size, static mode, both directions, finite delays."""
    if not inj.rank_links:
        return
    key, shown = "morph.inject.rank_links", [f"{a}-{b}" for a, b in inj.rank_links]
    if world is not None:
        for a, b in inj.rank_links:
            if max(a, b) >= world:
                raise fail(key, shown, f"names rank {max(a, b)}: ranks are 0..{world - 1} ({world} ranks)")
    if inj.mode != "static":
        raise fail(key, shown, f"needs mode = static (one delays_ms value per pair), got mode = {inj.mode!r}")
    if inj.direction != "both":
        raise fail(key, shown, "delays both directions of a pair: set direction = both")
    if any(math.isinf(d) for d in inj.delays_ms):
        raise fail("morph.inject.delays_ms", list(inj.delays_ms), "has inf: a rank pair cannot go down (finite delays)")


def _check_bandwidth(inj: InjectSettings, synthetic: SyntheticSettings, limit: float | None) -> None:
    """The rate options: a mode that emulates links (break fails them, rank pairs delay hosts),
    ``random_bandwidth_mbit`` as [low, high] in random mode, and, where the message size is known
    (``message_kb``), one message's transmit time within the delay limit."""
    rates = inj.random_bandwidth_mbit
    if rates:
        key = "morph.inject.random_bandwidth_mbit"
        if len(rates) != 2 or rates[0] > rates[1]:
            raise fail(key, list(rates), "must be [low, high] Mbit/s with 0 < low <= high")
        if inj.mode != "random":
            raise fail(key, list(rates), f"needs mode = random (it re-draws with the delays), got mode = {inj.mode!r}")
    keys = bandwidth_keys(inj)
    if not keys:
        return
    key = keys[0]
    shown = list(inj.bandwidth_mbit if key.endswith(".bandwidth_mbit") else rates)
    if inj.mode in ("none", "break"):
        why = "a link that fails has no rate" if inj.mode == "break" else "nothing is emulated"
        raise fail(key, shown, f"needs mode = static, random or trace (the link emulator), got {inj.mode!r}: {why}")
    if inj.rank_links:
        raise fail(key, shown, "is per pipeline link: it cannot be combined with rank_links (host pairs)")
    slowest = min([r for r in inj.bandwidth_mbit if r > 0] + ([rates[0]] if rates else []))
    if limit is not None and synthetic.enabled and synthetic.message_kb > 0:
        worst = synthetic.message_kb * 1024 * 8 / (slowest * 1e3)
        if worst > limit:
            raise fail(
                key,
                shown,
                f"makes a {synthetic.message_kb:g} KiB message take {worst:g} ms at {slowest:g} Mbit/s; "
                f"{limit_reason(limit)}",
            )


def _check_compute(inj: InjectSettings, synthetic: SyntheticSettings) -> None:
    """``compute_factor``: a mode that injects factors (static, random), above 0, and below 1 only
    where the op's time is padded (the synthetic testbed: real compute cannot be made faster)."""
    if not inj.compute_factor:
        return
    key, shown = "morph.inject.compute_factor", list(inj.compute_factor)
    if inj.mode not in ("static", "random"):
        why = "a trace sets the factors itself (its rank rows)" if inj.mode == "trace" else ""
        raise fail(key, shown, f"needs mode = static or random, got mode = {inj.mode!r}" + (f": {why}" if why else ""))
    if not synthetic.enabled and min(inj.compute_factor) < 1:
        raise fail(key, shown, "has a factor below 1: only the synthetic testbed's padded ops can run faster (>= 1)")


def _check_inject(inj: InjectSettings, links: int | None, limit: float | None, transport: str) -> None:
    if inj.end_step != 0 and inj.end_step < inj.start_step:
        raise fail("morph.inject.end_step", inj.end_step, f"must be 0 (never stop) or >= start_step ({inj.start_step})")
    if inj.mode == "static" and not inj.delays_ms and not inj.compute_factor:
        raise fail(
            "morph.inject.delays_ms",
            [],
            "is empty: static mode needs per-link delays, e.g. [0, 0, 60], or per-rank compute_factor",
        )
    if links is not None and any(link >= links for link in inj.links):
        raise fail("morph.inject.links", list(inj.links), f"has a link id out of range: link ids are 0..{links - 1}")
    interval = inj.random_interval_ms
    if len(interval) != 2 or interval[0] > interval[1]:
        raise fail("morph.inject.random_interval_ms", list(interval), "must be [low, high] ms with low <= high")
    spread = inj.random_mean_ms + 3 * inj.random_std_ms
    if limit is not None and inj.mode == "random" and spread > limit:
        raise fail(
            "morph.inject.random_std_ms",
            inj.random_std_ms,
            f"with random_mean_ms = {inj.random_mean_ms:g}: mean + 3 std = {spread:g} ms is out of range"
            f"; {limit_reason(limit)}",
        )
    if inj.mode == "trace":
        check_trace(inj.trace_file, links, limit)
    if inj.mode == "break" and transport != "auto":
        raise fail(
            "morph.inject.mode",
            inj.mode,
            f"needs morph.transport = auto (got {transport!r}): break mode fails links' default path for "
            "real, and only auto moves them to the delegates",
        )


def check_written_file(key: str, path: str) -> None:
    """A file the run writes (appends to): its folder exists and this user may write there, so the
    ranks do not fail on it after their start-up."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise fail(key, path, "is a folder: name a file in it")
    if not os.path.isdir(folder):
        raise fail(key, path, f"is in a folder that does not exist ({folder}): create it first or name another file")
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise fail(key, path, f"cannot be written by this user (folder {folder})")


def check_morph(morph: MorphSettings, layout: Layout, world: int | None) -> None:
    """``[morph]`` within itself, for the pipeline ``layout`` (parts of it may be unknown)."""
    check_written_file("morph.profiles_file", morph.profiles_file)
    _check_rank_links(morph.inject, world)
    _check_budgets(morph, layout.stages or 1)
    if len(morph.host_interfaces) > 1:
        raise fail(
            "morph.host_ifnames",
            morph.host_ifnames,
            "names more than one interface: give one (moving the delegates and the control plane to a "
            "second host interface when the first fails is not available)",
        )
    if morph.adapt and not morph.monitor:
        raise fail("morph.adapt", morph.adapt, "needs morph.monitor = true (adaptation acts on the monitor's data)")
    if morph.plan_transmit_ms and not morph.plan_delays_ms:
        raise fail(
            "morph.plan_transmit_ms", list(morph.plan_transmit_ms), "needs plan_delays_ms (the latencies beside it)"
        )
    if morph.plan_delays_std_ms:
        shown = list(morph.plan_delays_std_ms)
        if not morph.plan_delays_ms:
            raise fail("morph.plan_delays_std_ms", shown, "needs plan_delays_ms (the mean delays)")
        if not morph.search:
            raise fail(
                "morph.plan_delays_std_ms",
                shown,
                "needs morph.search = true (a plan for a distribution of delays is searched for)",
            )
    links = None if layout.stages is None else max(layout.stages - 1, 0)
    _check_inject(morph.inject, links, layout.delay_limit_ms, morph.transport)
    _check_compute(morph.inject, morph.synthetic)
    layers, stages = morph.synthetic.layers, (layout.stages or 1) * (layout.stages_per_rank or 1)
    if layers and layers < stages:
        raise fail("morph.synthetic.layers", layers, f"must be 0 or >= the pipeline's stages ({stages})")
    _check_bandwidth(morph.inject, morph.synthetic, layout.delay_limit_ms)
    if morph.synthetic.hidden % 16:
        raise fail("morph.synthetic.hidden", morph.synthetic.hidden, "must be a multiple of 16")
    if (morph.synthetic.message_kb * 256) % 1:
        raise fail(
            "morph.synthetic.message_kb",
            morph.synthetic.message_kb,
            "must be a multiple of 1/256 KiB (whole float32 values)",
        )


SPLIT_OPTIONS = (
    "module_fqns_per_model_part",
    "pipeline_parallel_layers_per_stage",
    "pipeline_parallel_first_stage_less_layers",
    "pipeline_parallel_last_stage_less_layers",
)
"""TorchTitan's options that split the model by hand (``partition = "manual"``)."""
AUTO_SCHEDULES = ("pipemorph", "zbh1", "zbh2", "morph1f1b")
"""The schedules ``partition = "auto"`` re-partitions: titan_morph's, one stage per rank."""
MORPH_SCHEDULES = (*AUTO_SCHEDULES, "pipemorphv")
"""titan_morph's schedules (MorphSchedule): the ones that run a per-replica microbatch count."""


def _check_partition(morph: MorphSettings, job: JobView, dp: int) -> None:
    """``partition`` against the split options of the job and what a re-partition needs."""
    key, mode = "morph.partition", morph.partition
    options = ", ".join(f"[parallelism] {o}" for o in job.split_options)
    if mode == "manual" and not job.split_options:
        raise fail(
            key,
            mode,
            "needs a split: set [parallelism] module_fqns_per_model_part, pipeline_parallel_layers_per_stage or "
            "pipeline_parallel_first_stage_less_layers / pipeline_parallel_last_stage_less_layers",
        )
    if mode != "manual" and job.split_options:
        what = "TorchTitan's default split" if mode == "even" else "titan_morph's split"
        raise fail(key, mode, f"is {what}, but the job sets {options}: set morph.partition = manual")
    if job.split is not None and mode != "auto":
        raise fail(
            "TITAN_MORPH_SPLIT", ",".join(map(str, job.split)), "is a re-partition's split: needs partition = auto"
        )
    if mode != "auto":
        return
    stages = job.pipeline_parallel_degree
    if stages < 2:
        raise fail(key, mode, "needs pipeline_parallel_degree >= 2 (layers move between pipeline stages)")
    if job.schedule.lower() not in AUTO_SCHEDULES:
        raise fail(
            key,
            mode,
            "needs a titan_morph schedule with one stage per rank (PipeMorph, ZBH1, ZBH2, Morph1F1B),"
            f" got {job.schedule!r}",
        )
    if not morph.monitor:
        raise fail(key, mode, "needs morph.monitor = true (per-rank compute is measured by the monitor)")
    if not job.checkpoint:
        raise fail(key, mode, "needs [checkpoint] enable = true: a re-partition checkpoints and restarts the run")
    if morph.synthetic.enabled and not morph.synthetic.layers:
        raise fail(key, mode, "needs [morph.synthetic] layers on the synthetic testbed (stages made of layers)")
    if job.split is not None and len(job.split) != stages:
        raise fail("TITAN_MORPH_SPLIT", ",".join(map(str, job.split)), f"needs one layer count per stage ({stages})")


def _check_replicas(morph: MorphSettings, job: JobView, n: int, dp: int) -> None:
    """``replica_microbatches``: DP x PP with a titan_morph schedule, one count per replica, each at
    least 1 and at most 2 x N, summing to the global batch (dp x N microbatches)."""
    counts = morph.replica_microbatches
    if not counts:
        return
    key, shown = "morph.replica_microbatches", list(counts)
    if job.pipeline_parallel_degree < 2 or dp < 2:
        raise fail(key, shown, "needs data parallelism with pipeline parallelism (both degrees >= 2)")
    if job.schedule.lower() not in MORPH_SCHEDULES:
        raise fail(
            key,
            shown,
            f"needs a titan_morph schedule (PipeMorph, ZBH1, ZBH2, Morph1F1B, PipeMorphV), got {job.schedule!r}",
        )
    if len(counts) != dp:
        raise fail(key, shown, f"needs one count per data-parallel replica ({dp} replicas), got {len(counts)}")
    empty = [k for k, c in enumerate(counts) if c < 1]
    if empty:
        raise fail(key, shown, f"gives replica {empty[0]} no microbatches: every replica needs >= 1")
    total = dp * n
    if sum(counts) != total:
        raise fail(
            key,
            shown,
            f"sums to {sum(counts)}; the global batch is {total} microbatches ({dp} replicas x {n} ="
            " training.local_batch_size / pipeline_parallel_microbatch_size), which the counts must split",
        )
    cap = min(total - (dp - 1), 2 * n)
    if max(counts) > cap:
        raise fail(key, shown, f"gives a replica {max(counts)} microbatches: at most {cap} (2 x N = 2 x {n})")


def check_dp_backend(settings: Settings, backend: str) -> None:
    """DP x PP off gloo (NCCL on GPUs), one line: the DP collectives are timed and delayed by the CPU
    jobs' DP backend only, so the orchestrator would measure nothing and ``rank_links`` would delay
    the pipeline but not the DP traffic. The launcher checks it when the ranks get a GPU each, a
    rank when its default group is made."""
    if not settings.hybrid or backend == "gloo":
        return
    morph = settings.morph
    if morph.orchestrator != "off":
        raise fail(
            "morph.orchestrator",
            morph.orchestrator,
            f"moves ranks on the DP collectives' timings, which only a CPU job's DP backend records ({backend}"
            " collectives are not timed yet): use off on GPUs",
        )
    if morph.inject.rank_links:
        raise fail(
            "morph.inject.rank_links",
            ",".join(f"{a}-{b}" for a, b in morph.inject.rank_links),
            f"delays DP collectives on gloo only (CPU): the {backend} DP groups would not wait; on GPUs use"
            " per-link delays_ms",
        )


def _check_reshard(morph: MorphSettings, job: JobView, dp: int) -> None:
    """FSDP's ``always`` all-gathers a stage's parameters for each forward and backward, as many as
    the stage's op order has (a forward after a forward, a backward after a forward): replicas that
    run other microbatch counts or other plans would issue other numbers of collectives and hang."""
    if job.fsdp_reshard_after_forward != "always" or job.pipeline_parallel_degree < 2 or dp < 2:
        return
    if job.schedule.lower() in TORCH_SCHEDULES:
        return
    replans = morph.adapt and job.schedule.lower() in ("pipemorph", "pipemorphv")  # per-pipeline plans
    moving = morph.monitor and (morph.rebalance_microbatches or replans)
    if morph.replica_microbatches or moving:
        why = (
            "morph.replica_microbatches"
            if morph.replica_microbatches
            else "morph.rebalance_microbatches"
            if morph.rebalance_microbatches
            else "morph.adapt"
        )
        raise fail(
            "parallelism.fsdp_reshard_after_forward",
            "always",
            f"all-gathers per microbatch, so DP replicas with other microbatch counts or plans ({why}) would"
            " issue other numbers of collectives: use default or never (one all-gather per step with PP),"
            " or set morph.rebalance_microbatches = false and morph.adapt = false",
        )


def check_joined(morph: MorphSettings, job: JobView, n: int, dp: int) -> None:
    """``[morph]`` against TorchTitan's sections: the orchestrator's needs under DP x PP, the
    partition, the replicas' microbatches, and the schedules that need a microbatch per stage."""
    _check_partition(morph, job, dp)
    _check_replicas(morph, job, n, dp)
    _check_reshard(morph, job, dp)
    stages, name = job.pipeline_parallel_degree, job.schedule
    if morph.orchestrator != "off" and stages > 1 and dp > 1:
        key, value = "morph.orchestrator", morph.orchestrator
        if job.tensor_parallel_degree > 1:
            raise fail(
                key,
                value,
                f"moves hosts of a DP x PP layout; with tensor_parallel_degree {job.tensor_parallel_degree} a"
                " stage spans several hosts, which it does not move yet: use off with TP",
            )
        if not morph.monitor:
            raise fail(key, value, "needs morph.monitor = true (the moves act on the monitor's DP measurements)")
        if name.lower() in TORCH_SCHEDULES:
            raise fail(key, value, f"needs a titan_morph schedule (PipeMorph, ZBH1, ZBH2, Morph1F1B), got {name!r}")
        if not job.checkpoint:
            raise fail(
                key,
                value,
                "needs [checkpoint] enable = true: the run is checkpointed and restarted with the new rank order",
            )
    if stages > 1 and name.lower() in ONE_MICROBATCH_PER_STAGE and n < stages:
        raise fail(
            "parallelism.pipeline_parallel_schedule",
            name,
            f"needs at least as many microbatches as stages ({stages}); training.local_batch_size / "
            f"pipeline_parallel_microbatch_size gives {n}",
        )
