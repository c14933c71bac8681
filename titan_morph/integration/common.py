"""What the TorchTitan 0.2.2 and 0.3.0 adapters do alike, written once and parametrised by what the
release changes (its config object, how it names a key, its CLI entry).

Imports no torchtitan at import time, so either release's adapter can load it; each function takes
the release's objects (config sections, callbacks) as arguments, typed by what it reads of them
(:mod:`.boundary`).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from titan_morph.config import ConfigError, JobView, Settings
from titan_morph.config.model import ModelShape
from titan_morph.config.rules import SPLIT_OPTIONS
from titan_morph.integration.boundary import ParallelismSection, TitanConfig
from titan_morph.integration.partition import ModuleSplit, stage_module_names
from titan_morph.integration.relaunch import split_from_env

if TYPE_CHECKING:  # both releases' ParallelDims; torchtitan loads only after the CPU adaptation
    import logging

    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineSchedule
    from torchtitan.distributed import ParallelDims

__all__ = [
    "RUN_ID_PLACEHOLDER",
    "MorphTrainerMethods",
    "check_schedule",
    "job_view",
    "parse_quietly",
    "pipeline",
    "rank_main",
    "run_id",
    "stage_module_names",
    "stages_per_rank",
]

RUN_ID_PLACEHOLDER = "{run_id}"

_Config = TypeVar("_Config")


def run_id() -> str:
    """One id per launch, equal on every rank: $TITAN_MORPH_RUN_ID (run_train.sh), else torchrun's."""
    rid = os.environ.get("TITAN_MORPH_RUN_ID") or os.environ.get("TORCHELASTIC_RUN_ID", "")
    if rid not in ("", "none"):
        return rid
    if "LOCAL_RANK" in os.environ:  # torchrun without an id: the local agent's pid is shared by its ranks
        return time.strftime("%Y%m%d") + f"-agent{os.getppid()}-port{os.environ.get('MASTER_PORT', '0')}"
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


# --- the job config -------------------------------------------------------------------------------


@contextlib.contextmanager
def _captured_output() -> Iterator[list[str]]:
    """Everything written to file descriptors 1 and 2 (tyro's messages, TorchTitan's log) goes to a
    temporary file; the list yielded receives the text when the block ends."""
    sink: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield sink
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            sink.append(tmp.read().decode(errors="replace"))


def _first_message(text: str) -> str:
    """What a parser that :func:`~titan_morph.config.cli.check_overrides` let through still
    refused: the first line of text in its output, box drawing removed."""
    for raw in text.splitlines():
        line = raw.strip().strip("│╭╮╰╯─ ").strip()
        if line and not line.lower().startswith(("usage", "for full helptext")):
            return f"command line: {line}"
    return "command line: TorchTitan could not parse the arguments"


def parse_quietly(parse_args: Callable[[], _Config]) -> _Config:
    """The config TorchTitan's ``ConfigManager().parse_args`` (``parse_args``) builds, its output
    held back: ``--help`` prints it and exits 0, a refusal is one :class:`ConfigError` line."""
    error = ""
    with _captured_output() as output:
        try:
            config = parse_args()
        except SystemExit as exit_:
            error = "help" if exit_.code in (0, None) else "parser"
        except (ValueError, TypeError, ImportError) as err:
            error = " ".join(str(err).split())
    if error == "help":
        print(output[0], end="")
        raise SystemExit(0)
    if error:
        raise ConfigError(_first_message(output[0]) if error == "parser" else error)
    return config


def _stages_per_rank_of(config: TitanConfig, morph_model: bool) -> int | None:
    """Stages per pipeline rank of titan_morph's model (None = decided by the model); 1 for other
    models, whose per-stage ``morph`` lists are not read."""
    par = config.parallelism
    if par.pipeline_parallel_degree < 2 or not morph_model:
        return 1
    from titan_morph.integration.schedules import stages_per_rank_of

    return stages_per_rank_of(par.pipeline_parallel_schedule, par.pipeline_parallel_layers_per_stage)


def job_view(config: TitanConfig, ranks: int | None, morph_model: bool) -> JobView:
    """What titan_morph reads of a TorchTitan config (both releases keep these sections' names);
    ``morph_model``: the config trains titan_morph's model, ``ranks``: the launcher's NGPU."""
    par, training, comm = config.parallelism, config.training, config.comm
    return JobView(
        pipeline_parallel_degree=int(par.pipeline_parallel_degree),
        data_parallel_replicate_degree=int(par.data_parallel_replicate_degree),
        data_parallel_shard_degree=int(par.data_parallel_shard_degree),
        tensor_parallel_degree=int(par.tensor_parallel_degree),
        context_parallel_degree=int(par.context_parallel_degree),
        local_batch_size=int(training.local_batch_size),
        microbatch_size=int(par.pipeline_parallel_microbatch_size),
        schedule=str(par.pipeline_parallel_schedule),
        stages_per_rank=_stages_per_rank_of(config, morph_model),
        steps=int(training.steps),
        init_timeout_s=float(comm.init_timeout_seconds),
        train_timeout_s=float(comm.train_timeout_seconds),
        checkpoint=bool(config.checkpoint.enable),
        ranks=ranks,
        split_options=split_options(par) if morph_model else (),
        split=_split_of_env(),
        fsdp_reshard_after_forward=str(par.fsdp_reshard_after_forward),
    )


def split_options(parallelism: ParallelismSection) -> tuple[str, ...]:
    """TorchTitan's split options a config sets away from their defaults (a manual split)."""
    defaults: dict[str, object] = {
        "module_fqns_per_model_part": None,
        "pipeline_parallel_layers_per_stage": None,
        "pipeline_parallel_first_stage_less_layers": 1,
        "pipeline_parallel_last_stage_less_layers": 1,
    }
    return tuple(name for name in SPLIT_OPTIONS if getattr(parallelism, name) != defaults[name])


def _split_of_env() -> tuple[int, ...] | None:
    try:
        return split_from_env()
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_schedule(parallelism: ParallelismSection) -> None:
    """The schedule name is one titan_morph builds (for its model, pipelined)."""
    from titan_morph.integration.schedules import check_schedule_name, schedule_names

    name = parallelism.pipeline_parallel_schedule
    try:
        check_schedule_name(name)
    except ValueError:
        allowed = ", ".join(schedule_names())
        raise ConfigError(f"parallelism.pipeline_parallel_schedule: {name!r} is not one of {allowed}") from None


# --- the pipelining function ---------------------------------------------------------------------


def stages_per_rank(parallelism: ParallelismSection, placement: str, pp: int, num_layers: int, section: str) -> int:
    """Stages per PP rank, as TorchTitan's ``pipeline_llm`` decides: from
    ``pipeline_parallel_layers_per_stage`` when set (ceil((layers + first/last-stage weights) /
    layers per stage) stages, a multiple of the PP degree), else 1 for one-stage schedules and 2
    for multi-stage ones. A V holds exactly 2. A mismatch is one error naming the setting
    (``section``: how the release spells the section before a key)."""
    par = parallelism
    per_stage = par.pipeline_parallel_layers_per_stage
    if per_stage is None:
        return 1 if placement == "single" else 2
    total = math.ceil(
        (num_layers + par.pipeline_parallel_first_stage_less_layers + par.pipeline_parallel_last_stage_less_layers)
        / per_stage
    )
    if total % pp:
        raise ValueError(
            f"{section}pipeline_parallel_layers_per_stage = {per_stage} gives {total} stages, not a multiple of"
            f" pipeline_parallel_degree = {pp}"
        )
    per_rank = total // pp
    need = {"single": "exactly 1", "v": "exactly 2", "loop": "at least 2"}[placement]
    ok = per_rank == 1 if placement == "single" else per_rank == 2 if placement == "v" else per_rank >= 2
    if not ok:
        raise ValueError(
            f"{section}pipeline_parallel_layers_per_stage = {per_stage} gives {per_rank} stage(s) per rank;"
            f" pipeline_parallel_schedule = {par.pipeline_parallel_schedule!r} needs {need}"
        )
    return per_rank


# A torch schedule name per placement: TorchTitan's module split derives its stage placement from it.
_SPLIT_AS = {"single": "1F1B", "loop": "Interleaved1F1B", "v": "ZBVZeroBubble"}


def pipeline(
    parallelism: ParallelismSection,
    parallel_dims: ParallelDims,
    num_layers: int,
    *,
    section: str,
    csv_hint: str,
    generate: ModuleSplit,
    split: Callable[[str, list[list[str]]], tuple[list[PipelineStage], list[nn.Module]]],
    parallelize: Callable[[nn.Module], nn.Module],
    settings_of: Callable[[], Settings],
    loss_fn: Callable[..., Any] | None,
    logger: logging.Logger,
    shape: ModelShape | None = None,
) -> tuple[_PipelineSchedule, list[nn.Module], bool, bool]:
    """What llama3_morph's ``pipelining_fn`` returns on either release: the model split as
    TorchTitan's ``pipeline_llm`` does for the schedule's placement (or as ``[morph] partition``
    splits it, :mod:`.partition`), each part parallelised and FSDP moved to gloo, the compute
    stragglers of ``[morph.inject]`` emulated, then titan_morph's schedule over the stages. The
    release supplies how it spells a key (``section``), its module split (``generate``;
    ``split(torch schedule name, module names)``), its ``parallelize_fn`` call, where the settings
    come from, the loss and the model's sizes (``shape``: the partition's monitor)."""
    from titan_morph.integration.cpu import adapt_fsdp_to_gloo
    from titan_morph.integration.partition import attach_partitioner, launch_split, module_names, prepare_compute
    from titan_morph.integration.schedules import ScheduleRequest, build_schedule, schedule_placement

    schedule_name = parallelism.pipeline_parallel_schedule
    placement = schedule_placement(schedule_name)  # also: the unknown-schedule error, before any work
    if parallelism.pipeline_parallel_schedule_csv:
        raise ValueError(
            f"{section}pipeline_parallel_schedule_csv is not supported by llama3_morph; choose the schedule with"
            f" pipeline_parallel_schedule{csv_hint}"
        )
    settings = settings_of()
    pp = parallel_dims.pp
    num_stages = pp * stages_per_rank(parallelism, placement, pp, num_layers, section)
    own = launch_split(settings, num_layers, num_stages)
    if own is not None:
        names = module_names(generate, num_layers, own)
    else:
        names = stage_module_names(parallelism, num_stages, num_layers, generate, section)

    stages, model_parts = split(_SPLIT_AS[placement], names)
    for i, part in enumerate(model_parts):
        part = parallelize(part)
        adapt_fsdp_to_gloo(part)
        model_parts[i] = part
        stages[i].submod = part
    prepare_compute(settings, stages)

    schedule = build_schedule(
        ScheduleRequest(
            name=schedule_name,
            stage=stages[0],
            n_microbatches=settings.microbatches,
            loss_fn=loss_fn,
            settings=settings,
            parallel_dims=parallel_dims,
            stages=stages,
        )
    )
    if shape is not None:
        attach_partitioner(settings, schedule, shape)
    logger.info(
        f"titan_morph: pipeline schedule {schedule_name} ({type(schedule).__name__}), stage(s) "
        f"{[st.stage_index for st in stages]}/{num_stages} with {settings.microbatches} microbatches"
        + (f", layers per stage {list(own)}" if own is not None else "")
    )
    return schedule, model_parts, any(st.is_first for st in stages), any(st.is_last for st in stages)


# --- the trainer ---------------------------------------------------------------------------------


class MorphTrainerMethods:
    """The trainer methods both releases' ``MorphTrainer`` share, placed before TorchTitan's
    ``Trainer`` in the bases: the run summary, closing the schedule and transports while the
    process groups exist, and the DP x PP hooks. Needs ``morph_settings`` and ``_trained``."""

    morph_settings: Settings
    _trained: bool
    step: int

    def train(self) -> None:
        super().train()  # type: ignore[misc]
        self._trained = True
        from torchtitan.tools.logging import logger

        from titan_morph.integration.summary import run_summary

        for line in run_summary(self.morph_settings, getattr(self, "pp_schedule", None)):
            logger.info(f"titan_morph: {line}")

    def close(self) -> None:
        from titan_morph.integration.transports import close_transports
        from titan_morph.runtime.schedule import MorphSchedule

        try:  # threads and delegates stop while the process groups they use still exist
            schedule = getattr(self, "pp_schedule", None)
            if isinstance(schedule, MorphSchedule):
                schedule.close(self.morph_settings.job.train_timeout_s)
            close_transports(drain=self._trained)
        finally:
            super().close()  # type: ignore[misc]

    def init_distributed(self) -> ParallelDims:
        """TorchTitan's ParallelDims; for DP x PP on gloo, with the DP groups on the DP backend. The
        control plane's groups are kept apart from the job's as ``[morph] control_groups`` says."""
        from titan_morph.comm.groups import separate_control_groups
        from titan_morph.integration.hybrid import parallel_dims_for

        separate_control_groups(self.morph_settings.morph.control_groups == "separate")
        return parallel_dims_for(self.morph_settings, super().init_distributed())  # type: ignore[misc]

    def train_step(self, data_iterator: Any) -> None:
        from titan_morph.comm.machine.system import HEAP_TRIM_STEPS, release_free_heap
        from titan_morph.integration.hybrid import before_step
        from titan_morph.integration.partition import started_launch
        from titan_morph.runtime.slowdown import ACTIVE

        before_step(self)
        ACTIVE.set_step(self.step)  # the compute factors of this step
        super().train_step(data_iterator)  # type: ignore[misc]
        started_launch(self)
        if self.step % HEAP_TRIM_STEPS == 0:  # the resident set follows what is live (long runs)
            release_free_heap()

    def should_continue_training(self) -> bool:
        """False also after a step that moved ranks (DP x PP) or layers (``partition = "auto"``):
        the run resumes, relaunched."""
        from titan_morph.integration.hybrid import finish_for_move, save_now
        from titan_morph.integration.partition import finish_for_repartition

        moved = finish_for_move(self) or finish_for_repartition(self, save_now)
        return not moved and bool(super().should_continue_training())  # type: ignore[misc]


def rank_main(argv: list[str] | None, adapt: Callable[[], object], start: Callable[[list[str]], None]) -> None:
    """A torchrun rank's entry: exit with the agent, the CPU adaptation (``adapt``) before
    torchtitan loads, then ``start`` with the arguments; a bad configuration is one line, exit 2.
    A rank that finished ends without the interpreter's teardown (:func:`exit_without_teardown`)."""
    from titan_morph.comm.machine.system import die_with_parent, exit_without_teardown

    if "LOCAL_RANK" in os.environ:  # a torchrun rank: exit with the agent, whatever ends it
        die_with_parent()
    args = list(sys.argv[1:] if argv is None else argv)
    adapt()
    try:
        start(args)
    except ConfigError as err:
        print(f"titan_morph: configuration error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    if "LOCAL_RANK" in os.environ:  # the run released what it held: spare the job torch's teardown
        exit_without_teardown(0)
