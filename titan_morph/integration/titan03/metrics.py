"""The schedule's TensorBoard figures through TorchTitan 0.3.0's metrics processor.

0.3.0 builds the processor from ``Trainer.Config.metrics`` (a Configurable), so titan_morph's
processor (:class:`~titan_morph.integration.metrics.MorphMetricsProcessor`, whose ``log`` adds the
schedule's scalars and images) gets a ``Config`` of its own here, which makes ``metrics.build()``
construct it. As on 0.2.2, a schedule placed in a V logs from rank 0, where its last stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchtitan.components.metrics import MetricsProcessor

from titan_morph.integration.metrics import MorphMetricsProcessor
from titan_morph.integration.schedules import schedule_placement

__all__ = ["MorphMetrics"]


class MorphMetrics(MorphMetricsProcessor):
    """TorchTitan 0.3.0's MetricsProcessor plus the running schedule's figures."""

    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        pass

    def __init__(self, config: MetricsProcessor.Config, *, pp_schedule: str = "1F1B", **kwargs: Any) -> None:
        try:
            if schedule_placement(pp_schedule) == "v":
                pp_schedule = "ZBVZeroBubble"  # TorchTitan's name for "the loss is on rank 0"
        except ValueError:  # not a schedule titan_morph builds: TorchTitan's own rule
            pass
        super().__init__(config, pp_schedule=pp_schedule, **kwargs)
