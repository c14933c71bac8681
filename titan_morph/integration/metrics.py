"""TensorBoard scalars from the pipeline schedule, through TorchTitan's metrics processor.

TorchTitan logs loss, throughput, memory... once per ``log_freq`` steps (TensorBoard is written by
the first rank of the last stage: rank 0 for a V schedule, where the last stage runs; TorchTitan
itself knows that only for ``ZBVZeroBubble``, so titan_morph's TrainSpec extends it to every
schedule placed in a V). :class:`MorphMetricsProcessor` adds what the running schedule
reports: scalars from ``tensorboard_metrics(step)`` when it is a
:class:`~titan_morph.runtime.metrics.MetricsSource` and images from ``tensorboard_images(step)`` (the
plan timeline after a re-plan) when it is an :class:`~titan_morph.runtime.metrics.ImageSource`
(titan_morph's schedules are both; a plug-in schedule may be either). They are called on every
rank at the same steps, but only the logging rank's values are written; the schedule has gathered
other ranks' numbers itself (no collectives inside these calls). Each release's adapter builds it
(:mod:`.titan022.metrics`, :mod:`.titan03.metrics`).
"""

from typing import Any

from torchtitan.components.metrics import MetricsProcessor

from titan_morph.runtime.metrics import ImageSource, MetricsSource


class MorphMetricsProcessor(MetricsProcessor):
    """TorchTitan's MetricsProcessor plus the schedule's figures."""

    schedule: object = None  # the running pipeline schedule, set by the trainer

    def log(
        self,
        step: int,
        global_avg_loss: float,
        global_max_loss: float,
        grad_norm: float,
        extra_metrics: dict[str, Any] | None = None,
    ) -> None:
        extra = dict(extra_metrics or {})
        if isinstance(self.schedule, MetricsSource):
            extra.update(self.schedule.tensorboard_metrics(step))
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)
        if isinstance(self.schedule, ImageSource):
            self._log_images(step, self.schedule.tensorboard_images(step))

    def _log_images(self, step: int, images: dict[str, Any]) -> None:
        """HWC arrays (e.g. the new plan's timeline) into TorchTitan's TensorBoard writer, if any."""
        if not images:
            return
        for sink in getattr(self.logger, "_loggers", []):  # LoggerContainer's loggers
            writer = getattr(sink, "writer", None)
            if writer is not None and hasattr(writer, "add_image"):
                for tag, img in images.items():
                    writer.add_image(tag, img, step, dataformats="HWC")
