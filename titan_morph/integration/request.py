"""What a schedule builder is given: this rank's stage(s) and the job's settings, with the link
model of its pipeline and the size of one message between stages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage

from titan_morph.config import Settings
from titan_morph.config.links import configured_message_bytes, link_model
from titan_morph.integration.hybrid import pipeline_hosts
from titan_morph.pipelining.core.links import LinkModel

__all__ = ["ScheduleRequest", "group_of", "message_bytes"]


@dataclass
class ScheduleRequest:
    """Everything a schedule builder may need: this rank's stage(s) and the run's settings."""

    name: str
    """The schedule name as written in the config."""
    stage: PipelineStage
    """This rank's (first) stage (``stage.stage_index``, ``stage.num_stages``, ``stage.group``,
    ``stage.group_rank``)."""
    n_microbatches: int
    """N = local_batch_size / pipeline_parallel_microbatch_size."""
    loss_fn: Callable[..., Any] | None
    """TorchTitan's token-summed loss (the trainer rescales the reported loss)."""
    settings: Settings
    """The job's resolved configuration (``settings.morph``: the [morph] options)."""
    parallel_dims: Any = None
    """TorchTitan's ParallelDims (``get_mesh("pp")``)."""
    stages: list[PipelineStage] | None = None
    """All of this rank's stages when it runs several (TorchTitan's loop or V split); None: [stage]."""
    _links: tuple[LinkModel | None] | None = field(default=None, init=False, repr=False)

    @property
    def local_stages(self) -> list[PipelineStage]:
        """This rank's stages (one, or several for a multi-stage schedule)."""
        return list(self.stages) if self.stages else [self.stage]

    def links(self) -> LinkModel | None:
        """The ``[morph.inject]`` link model of this pipeline (None: nothing injected), built on the
        first call: transports name traffic by the link between adjacent ranks (a V's two legs share
        them); with ``rank_links`` the delays follow the hosts of this pipeline's ranks (a collective)."""
        if self._links is None:
            inject = self.settings.morph.inject
            ranks = self.stage.group_size
            hosts = pipeline_hosts(group_of(self.stage)) if inject.rank_links else None
            steps = self.settings.job.steps
            self._links = (link_model(inject, ranks - 1, steps=steps, hosts=hosts, message_bytes=message_bytes(self)),)
        return self._links[0]


def message_bytes(req: ScheduleRequest) -> int | None:
    """Bytes of one message between stages (a microbatch's activations, and their gradients):
    ``[morph.synthetic] message_kb`` when set, else microbatch x seq_len x dim x the parameters'
    element size of the model (TorchTitan's llama3 args: ``dim``, ``max_seq_len`` = the training
    ``seq_len``); None for a model without those. Every rank computes the same value."""
    fixed = configured_message_bytes(req.settings)
    if fixed is not None:
        return fixed
    submod = req.stage.submod
    args = getattr(submod, "model_args", None)
    dim, seq = getattr(args, "dim", None), getattr(args, "max_seq_len", None)
    if not (isinstance(dim, int) and isinstance(seq, int)):
        return None
    param = next((p for p in submod.parameters() if p.is_floating_point()), None)
    return req.settings.job.microbatch_size * seq * dim * (4 if param is None else param.element_size())


def group_of(stage: PipelineStage) -> dist.ProcessGroup:
    """The stage's pipeline group (the world's when it has none)."""
    group = stage.group or dist.group.WORLD
    if group is None:
        raise RuntimeError("torch.distributed is not initialised: a pipeline stage needs a process group")
    return group
