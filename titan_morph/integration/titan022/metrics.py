"""The schedule's TensorBoard figures through TorchTitan 0.2.2's metrics processor.

0.2.2 builds the processor with the TrainSpec's ``build_metrics_processor_fn``:
:func:`build_morph_metrics_processor` makes titan_morph's
(:class:`~titan_morph.integration.metrics.MorphMetricsProcessor`) and has a schedule placed in a V
log from rank 0, where its last stage runs (TorchTitan knows that only for its ``ZBVZeroBubble``).
"""

import dataclasses

from torchtitan.config import JobConfig
from torchtitan.distributed import ParallelDims
from torchtitan.protocols.model import BaseModelArgs

from titan_morph.integration.metrics import MorphMetricsProcessor
from titan_morph.integration.schedules import schedule_placement

__all__ = ["build_morph_metrics_processor"]


def build_morph_metrics_processor(
    job_config: JobConfig, parallel_dims: ParallelDims, model_args: BaseModelArgs | None = None, tag: str | None = None
) -> MorphMetricsProcessor:
    """``TrainSpec.build_metrics_processor_fn`` for ``llama3_morph``."""
    par = job_config.parallelism
    view = job_config
    if parallel_dims.pp_enabled and schedule_placement(par.pipeline_parallel_schedule) == "v":
        # The V's last stage runs on rank 0: log from there, as TorchTitan does for its ZBVZeroBubble.
        view = dataclasses.replace(
            job_config, parallelism=dataclasses.replace(par, pipeline_parallel_schedule="ZBVZeroBubble")
        )
    processor = MorphMetricsProcessor(view, parallel_dims, tag)
    processor.job_config = job_config
    return processor
