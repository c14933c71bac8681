"""TrainSpec ``llama3_morph``: TorchTitan's llama3, pipelined by titan_morph.

Everything but ``pipelining_fn`` is TorchTitan's llama3 spec. Our :func:`pipeline_stages` splits
the model exactly as TorchTitan's own ``pipeline_llm`` does for the schedule's placement
(:func:`titan_morph.integration.schedules.schedule_placement`): one stage per rank, several looped
("loop" style), or two per rank in a V ("v" style, rank r holding stages r and 2R-1-r), with
``generate_llm_fqn_per_model_part`` + ``pipeline_module_split``, so with the same schedule the two
paths compute the same thing. It then builds the schedule named by ``[parallelism]
pipeline_parallel_schedule`` through :func:`titan_morph.integration.schedules.build_schedule`.
"""

import dataclasses

import torch
import torch.nn as nn
from torch.distributed.pipelining.schedules import _PipelineSchedule
from torchtitan.components.loss import LossFunction
from torchtitan.config import JobConfig
from torchtitan.distributed import ParallelDims
from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part, pipeline_module_split
from torchtitan.models.llama3.model.args import TransformerModelArgs
from torchtitan.protocols.train_spec import ParallelizeFunction, TrainSpec, get_train_spec, register_train_spec
from torchtitan.tools.logging import logger

from titan_morph.integration import common
from titan_morph.integration.titan022.jobconfig import TRAIN_SPEC_NAME, settings_of
from titan_morph.integration.titan022.metrics import build_morph_metrics_processor
from titan_morph.integration.titan022.shape import model_shape


def stages_per_rank(job_config: JobConfig, placement: str, pp: int, num_layers: int) -> int:
    """Stages per PP rank, as TorchTitan's ``pipeline_llm`` decides (:func:`.common.stages_per_rank`)."""
    return common.stages_per_rank(job_config.parallelism, placement, pp, num_layers, "[parallelism] ")


def stage_module_names(job_config: JobConfig, num_stages: int, num_layers: int) -> list[list[str]]:
    """Module FQNs per stage: the config's ``module_fqns_per_model_part`` or TorchTitan's split."""
    return common.stage_module_names(
        job_config.parallelism, num_stages, num_layers, generate_llm_fqn_per_model_part, "[parallelism] "
    )


def pipeline_stages(
    model: nn.Module,
    parallel_dims: ParallelDims,
    job_config: JobConfig,
    device: torch.device,
    model_args: TransformerModelArgs,
    parallelize_fn: ParallelizeFunction,
    loss_fn: LossFunction,
) -> tuple[_PipelineSchedule, list[nn.Module], bool, bool]:
    """TorchTitan ``pipelining_fn``: split into this rank's stage(s), then build the schedule."""
    return common.pipeline(
        job_config.parallelism,
        parallel_dims,
        model_args.n_layers,
        section="[parallelism] ",
        csv_hint=" (or use model.name = 'llama3' for TorchTitan's CSV schedules)",
        generate=generate_llm_fqn_per_model_part,
        split=lambda split_as, names: pipeline_module_split(
            model, parallel_dims.get_mesh("pp"), split_as, device, names
        ),
        parallelize=lambda part: parallelize_fn(part, parallel_dims, job_config),
        settings_of=lambda: settings_of(job_config),
        loss_fn=loss_fn,
        logger=logger,
        shape=model_shape(model_args, job_config),
    )


def make_train_spec() -> TrainSpec:
    """TorchTitan's llama3 TrainSpec with titan_morph's pipelining and schedule metrics."""
    from titan_morph.integration.titan022.synthetic import FLAVOR, synthetic_flavor

    llama3 = get_train_spec("llama3")
    return dataclasses.replace(
        llama3,
        model_args={**llama3.model_args, FLAVOR: synthetic_flavor()},
        pipelining_fn=pipeline_stages,
        build_metrics_processor_fn=build_morph_metrics_processor,
    )


def register() -> None:
    """Register ``llama3_morph`` (idempotent)."""
    from torchtitan.protocols import train_spec as ts

    if TRAIN_SPEC_NAME not in ts._extra_train_specs:
        register_train_spec(TRAIN_SPEC_NAME, make_train_spec())
