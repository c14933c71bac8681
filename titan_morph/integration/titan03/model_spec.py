"""``ModelSpec`` ``llama3_morph`` for TorchTitan 0.3.0: its llama3, pipelined by titan_morph.

Everything but ``pipelining_fn`` is TorchTitan's llama3 spec. :func:`pipeline_stages` takes 0.3.0's
keyword-only arguments, splits the model as TorchTitan's ``pipeline_llm`` does for the schedule's
placement (one stage per rank, looped, or the V) with its module split, and builds the schedule
through :func:`titan_morph.integration.schedules.build_schedule` with the same
:class:`~titan_morph.integration.schedules.ScheduleRequest` as on 0.2.2, so everything below it
runs unchanged. 0.3.0's loss returns ``(loss, aux)``; the schedules take a scalar loss, so it is
wrapped. The trainer passes microbatches already split (``step(arg_mbs=..., target_mbs=...)``),
which torch >= 2.14's schedules, titan_morph's included (they are torch schedule runtimes), accept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.distributed._mesh_layout import _MeshLayout
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining.schedules import _PipelineSchedule
from torchtitan.components.loss import LossFunction
from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed import ParallelDims
from torchtitan.distributed.activation_checkpoint import ActivationCheckpointingConfig
from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _pipeline_module_split
from torchtitan.models.common import Decoder
from torchtitan.models.llama3 import model_registry
from torchtitan.protocols.model import BaseModel
from torchtitan.protocols.model_spec import ModelSpec, ParallelizeFunction
from torchtitan.tools.logging import logger

from titan_morph.integration import common
from titan_morph.integration.titan03.jobconfig import MODEL_NAME, active_settings
from titan_morph.integration.titan03.shape import model_shape

__all__ = ["MODEL_NAME", "morph_model_spec", "pipeline_stages", "scalar_loss", "stages_per_rank"]


def scalar_loss(loss_fn: LossFunction | None) -> Callable[..., torch.Tensor] | None:
    """0.3.0's loss returns ``(loss, aux)``; pipeline schedules take the bare scalar."""
    if loss_fn is None:
        return None

    def loss(*args: Any, **kwargs: Any) -> torch.Tensor:
        value = loss_fn(*args, **kwargs)
        return value[0] if isinstance(value, tuple) else value

    return loss


def stages_per_rank(parallelism: ParallelismConfig, placement: str, pp: int, num_layers: int) -> int:
    """Stages per PP rank, as TorchTitan's ``pipeline_llm`` decides (:func:`..common.stages_per_rank`)."""
    return common.stages_per_rank(parallelism, placement, pp, num_layers, "parallelism.")


def _mesh_callback(parallel_dims: ParallelDims) -> Callable[..., DeviceMesh | None]:
    """The stages' ``get_mesh``: the SPMD mesh of the named dimensions (None when its layout differs)."""

    def get_mesh(names: tuple[str, ...], layout: _MeshLayout | None) -> DeviceMesh | None:
        mesh = parallel_dims.get_mesh(list(names))
        return None if layout is not None and mesh._layout != layout else mesh

    return get_mesh


def pipeline_stages(
    model: nn.Module,
    *,
    parallel_dims: ParallelDims,
    training: TrainingConfig,
    parallelism: ParallelismConfig,
    compile_config: CompileConfig,
    ac_config: ActivationCheckpointingConfig | None,
    dump_folder: str,
    device: torch.device,
    model_config: Decoder.Config,
    parallelize_fn: ParallelizeFunction,
    loss_fn: LossFunction,
) -> tuple[_PipelineSchedule, list[nn.Module], bool, bool]:
    """TorchTitan 0.3.0 ``pipelining_fn``: split into this rank's stage(s), then build the schedule."""
    return common.pipeline(
        parallelism,
        parallel_dims,
        len(model_config.layers),
        section="parallelism.",
        csv_hint="",
        generate=_generate_llm_fqn_per_model_part,
        split=lambda split_as, names: _pipeline_module_split(
            model, parallel_dims.get_mesh("pp"), split_as, device, names, get_mesh=_mesh_callback(parallel_dims)
        ),
        parallelize=lambda part: parallelize_fn(
            part,
            parallel_dims=parallel_dims,
            training=training,
            parallelism=parallelism,
            compile_config=compile_config,
            ac_config=ac_config,
            dump_folder=dump_folder,
        ),
        settings_of=active_settings,
        loss_fn=scalar_loss(loss_fn),
        logger=logger,
        shape=model_shape(model_config, training, parallelism),
    )


def morph_model_spec(flavor: str = "debugmodel", model: BaseModel.Config | None = None) -> ModelSpec:
    """TorchTitan's llama3 ``ModelSpec`` of ``flavor`` (``model``: another model config, e.g. the
    synthetic one) with titan_morph's pipelining. Flex attention, 0.3.0's default, also runs on CPU."""
    llama3 = model_registry(flavor)
    return dataclasses.replace(
        llama3,
        name=MODEL_NAME,
        model=llama3.model if model is None else model,
        pipelining_fn=pipeline_stages,
    )
