"""The ``synthetic`` model flavor of ``llama3_morph``: a tiny llama whose width is configurable.

With ``[morph.synthetic] enabled = true`` every stage's F, I and W are padded to the configured
times (``titan_morph.runtime.testbed``); the model itself only has to be small, so that real compute
stays well below the pads, and to send ``hidden``-wide activations between stages. This flavor
takes its width from ``[morph.synthetic] hidden`` and one transformer layer per pipeline stage
(two per rank for a multi-stage schedule, e.g. the V). ``[morph.synthetic] message_kb`` sets the
size of the messages between stages independently of the width: the stages' sends are padded
(``titan_morph.runtime.testbed.pad_stage_messages``, applied with the compute pads).
"""

from dataclasses import dataclass
from typing import Any

from torchtitan.config import JobConfig
from torchtitan.models.llama3.model.args import TransformerModelArgs

HEAD_DIM = 16
FLAVOR = "synthetic"


@dataclass
class SyntheticModelArgs(TransformerModelArgs):
    """llama3 args resized from ``[morph.synthetic]`` and the pipeline degree at start-up."""

    def update_from_config(self, job_config: JobConfig, **kwargs: Any) -> None:
        super().update_from_config(job_config, **kwargs)
        from titan_morph.integration.titan022.jobconfig import settings_of

        settings = settings_of(job_config)
        hidden = settings.morph.synthetic.hidden
        self.dim = hidden
        self.n_heads = max(1, hidden // HEAD_DIM)
        self.n_layers = max(1, settings.stages * (settings.job.stages_per_rank or 2))


def synthetic_flavor() -> SyntheticModelArgs:
    return SyntheticModelArgs(dim=64, n_layers=4, n_heads=4, vocab_size=2048, multiple_of=16, rope_theta=10000)
