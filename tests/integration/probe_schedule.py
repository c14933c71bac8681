"""A test-only schedule plugged in through ``register_schedule`` (imported via custom_import)."""

from torch.distributed.pipelining.schedules import Schedule1F1B

from titan_morph.integration.schedules import register_schedule


class Probe1F1B(Schedule1F1B):
    """torch's 1F1B that counts its steps and reports them to TensorBoard."""

    steps_run = 0

    def step(self, *args, **kwargs):
        self.steps_run += 1
        return super().step(*args, **kwargs)

    def tensorboard_metrics(self, step: int) -> dict[str, float]:
        return {"morph/probe_steps": float(self.steps_run), "morph/probe_stage": float(self._stage.stage_index)}


register_schedule(
    "Probe1F1B",
    lambda req: Probe1F1B(req.stage, n_microbatches=req.n_microbatches, loss_fn=req.loss_fn, scale_grads=False),
    replace=True,
)
