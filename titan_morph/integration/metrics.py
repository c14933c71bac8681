"""TensorBoard scalars from the pipeline schedule, through TorchTitan's metrics processor.

TorchTitan logs loss, throughput, memory... once per ``log_freq`` steps (TensorBoard is written by
the first rank of the last stage). :class:`MorphMetricsProcessor` adds whatever the running
schedule reports: a schedule may define ``tensorboard_metrics(step: int) -> dict[str, float]``
(e.g. ``{"morph/iteration_ms": ..., "morph/plan_changes": ...}``), and images from an optional
``tensorboard_images(step) -> dict[str, HWC array]`` (the plan timeline after a re-plan). It is called on every rank at
the same steps, but only the logging rank's values are written, so a schedule that wants other
ranks' numbers must have gathered them itself (no collectives inside this call).
"""

from typing import Any

from torchtitan.components.metrics import MetricsProcessor


class MorphMetricsProcessor(MetricsProcessor):
    """TorchTitan's MetricsProcessor plus the schedule's ``tensorboard_metrics(step)``."""

    schedule: Any = None

    def log(
        self,
        step: int,
        global_avg_loss: float,
        global_max_loss: float,
        grad_norm: float,
        extra_metrics: dict[str, Any] | None = None,
    ) -> None:
        extra = dict(extra_metrics or {})
        report = getattr(self.schedule, "tensorboard_metrics", None)
        if callable(report):
            extra.update(report(step))
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)
        images = getattr(self.schedule, "tensorboard_images", None)
        if callable(images):
            self._log_images(step, images(step))

    def _log_images(self, step: int, images: dict[str, Any]) -> None:
        """HWC arrays (e.g. the new plan's timeline) into TorchTitan's TensorBoard writer, if any."""
        if not images:
            return
        for sink in getattr(self.logger, "_loggers", []):  # LoggerContainer's loggers
            writer = getattr(sink, "writer", None)
            if writer is not None and hasattr(writer, "add_image"):
                for tag, img in images.items():
                    writer.add_image(tag, img, step, dataformats="HWC")


def build_morph_metrics_processor(
    job_config: Any, parallel_dims: Any, model_args: Any = None, tag: str | None = None
) -> MorphMetricsProcessor:
    """``TrainSpec.build_metrics_processor_fn`` for ``llama3_morph``."""
    return MorphMetricsProcessor(job_config, parallel_dims, tag)
