"""TrainSpec ``llama3_morph``: TorchTitan's llama3, pipelined by titan_morph (one stage per rank).

Everything but ``pipelining_fn`` is TorchTitan's llama3 spec. Our :func:`pipeline_one_stage_per_rank`
splits the model into PP-degree stages exactly as TorchTitan does for single-stage schedules
(``generate_llm_fqn_per_model_part`` + ``pipeline_module_split``), so with the same schedule the
two paths compute the same thing, and then builds the schedule named by
``[parallelism] pipeline_parallel_schedule`` through :func:`titan_morph.integration.schedules.build_schedule`.
"""

import dataclasses
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.pipelining.schedules import _PipelineSchedule
from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part, pipeline_module_split
from torchtitan.protocols.train_spec import TrainSpec, get_train_spec, register_train_spec
from torchtitan.tools.logging import logger

from titan_morph.integration.config import microbatches
from titan_morph.integration.cpu import adapt_fsdp_to_gloo
from titan_morph.integration.metrics import build_morph_metrics_processor
from titan_morph.integration.schedules import ScheduleRequest, build_schedule, check_schedule_name

TRAIN_SPEC_NAME = "llama3_morph"


def stage_module_names(job_config: Any, num_stages: int, num_layers: int) -> list[list[str]]:
    """Module FQNs per stage: the config's ``module_fqns_per_model_part`` or TorchTitan's split."""
    par = job_config.parallelism
    names = par.module_fqns_per_model_part
    if names is None:
        names = generate_llm_fqn_per_model_part(
            num_stages,
            num_layers,
            par.pipeline_parallel_first_stage_less_layers,
            par.pipeline_parallel_last_stage_less_layers,
        )
    if len(names) != num_stages:
        raise ValueError(
            f"[parallelism] module_fqns_per_model_part has {len(names)} parts; titan_morph runs one stage per "
            f"rank, so it needs exactly pipeline_parallel_degree = {num_stages} parts"
        )
    return names


def pipeline_one_stage_per_rank(
    model: nn.Module,
    parallel_dims: Any,
    job_config: Any,
    device: torch.device,
    model_args: Any,
    parallelize_fn: Any,
    loss_fn: Any,
) -> tuple[_PipelineSchedule, list[nn.Module], bool, bool]:
    """TorchTitan ``pipelining_fn``: split into one stage per PP rank, then build the schedule."""
    schedule_name = job_config.parallelism.pipeline_parallel_schedule
    check_schedule_name(schedule_name)
    if job_config.parallelism.pipeline_parallel_layers_per_stage is not None:
        raise ValueError(
            "[parallelism] pipeline_parallel_layers_per_stage is not supported by titan_morph "
            "(one stage per rank); leave it unset"
        )
    if job_config.parallelism.pipeline_parallel_schedule_csv:
        raise ValueError(
            "[parallelism] pipeline_parallel_schedule_csv is not supported by llama3_morph; choose the schedule "
            "with pipeline_parallel_schedule (or use model.name = 'llama3' for TorchTitan's CSV schedules)"
        )
    n_microbatches = microbatches(job_config)
    pp_mesh = parallel_dims.get_mesh("pp")
    num_stages = parallel_dims.pp
    names = stage_module_names(job_config, num_stages, model_args.n_layers)

    # "1F1B" only selects the "loop" stage placement (stage i on PP rank i) inside TorchTitan.
    stages, model_parts = pipeline_module_split(model, pp_mesh, "1F1B", device, names)
    assert len(stages) == 1, "titan_morph builds one stage per rank"
    stage = stages[0]
    part = parallelize_fn(model_parts[0], parallel_dims, job_config)
    adapt_fsdp_to_gloo(part)
    model_parts[0] = part
    stage.submod = part

    schedule = build_schedule(
        ScheduleRequest(
            name=schedule_name,
            stage=stage,
            n_microbatches=n_microbatches,
            loss_fn=loss_fn,
            job_config=job_config,
            parallel_dims=parallel_dims,
        )
    )
    logger.info(
        f"titan_morph: pipeline schedule {schedule_name} ({type(schedule).__name__}), stage "
        f"{stage.stage_index}/{num_stages} with {n_microbatches} microbatches"
    )
    return schedule, model_parts, stage.is_first, stage.is_last


def make_train_spec() -> TrainSpec:
    """TorchTitan's llama3 TrainSpec with titan_morph's pipelining and schedule metrics."""
    from titan_morph.integration.synthetic import FLAVOR, synthetic_flavor

    llama3 = get_train_spec("llama3")
    return dataclasses.replace(
        llama3,
        model_args={**llama3.model_args, FLAVOR: synthetic_flavor()},
        pipelining_fn=pipeline_one_stage_per_rank,
        build_metrics_processor_fn=build_morph_metrics_processor,
    )


def register() -> None:
    """Register ``llama3_morph`` (idempotent)."""
    from torchtitan.protocols import train_spec as ts

    if TRAIN_SPEC_NAME not in ts._extra_train_specs:
        register_train_spec(TRAIN_SPEC_NAME, make_train_spec())
