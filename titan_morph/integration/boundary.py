"""What the code both TorchTitan adapters share reads of a release's config, as Protocols.

TorchTitan 0.2.2's ``JobConfig`` and 0.3.0's ``Trainer.Config`` keep the sections read here under
the same names and the same fields, in different classes (``Parallelism`` / ``ParallelismConfig``,
...); each adapter types its own objects with its release's classes and hands them to
:mod:`.common`, which takes these Protocols. Members are read-only properties: a release's dataclass
field satisfies one whatever its own mutability, and a test may pass a ``SimpleNamespace``.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["CheckpointSection", "CommSection", "ParallelismSection", "TitanConfig", "TrainingSection"]


class ParallelismSection(Protocol):
    """``parallelism``: the degrees (:class:`~titan_morph.config.JobView`), the schedule and the
    module split (:func:`.common.stages_per_rank`, :func:`.common.stage_module_names`)."""

    @property
    def pipeline_parallel_degree(self) -> int: ...
    @property
    def data_parallel_replicate_degree(self) -> int: ...
    @property
    def data_parallel_shard_degree(self) -> int: ...
    @property
    def tensor_parallel_degree(self) -> int: ...
    @property
    def context_parallel_degree(self) -> int: ...
    @property
    def pipeline_parallel_microbatch_size(self) -> int: ...
    @property
    def pipeline_parallel_schedule(self) -> str: ...
    @property
    def pipeline_parallel_schedule_csv(self) -> str | None: ...
    @property
    def pipeline_parallel_layers_per_stage(self) -> int | None: ...
    @property
    def pipeline_parallel_first_stage_less_layers(self) -> int: ...
    @property
    def pipeline_parallel_last_stage_less_layers(self) -> int: ...
    @property
    def module_fqns_per_model_part(self) -> list[list[str]] | None: ...
    @property
    def fsdp_reshard_after_forward(self) -> str: ...


class TrainingSection(Protocol):
    @property
    def local_batch_size(self) -> int: ...
    @property
    def steps(self) -> int: ...


class CommSection(Protocol):
    @property
    def init_timeout_seconds(self) -> int: ...
    @property
    def train_timeout_seconds(self) -> int: ...


class CheckpointSection(Protocol):
    @property
    def enable(self) -> bool: ...


class TitanConfig(Protocol):
    """A release's whole config, as far as :func:`.common.job_view` reads it."""

    @property
    def parallelism(self) -> ParallelismSection: ...
    @property
    def training(self) -> TrainingSection: ...
    @property
    def comm(self) -> CommSection: ...
    @property
    def checkpoint(self) -> CheckpointSection: ...
