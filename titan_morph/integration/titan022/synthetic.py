"""The ``synthetic`` model flavor of ``llama3_morph``: a tiny llama whose width is configurable.

With ``[morph.synthetic] enabled = true`` every stage's F, I and W are padded to the configured
times (``titan_morph.runtime.testbed``); the model itself only has to be small, so that real compute
stays well below the pads, and to send ``hidden``-wide activations between stages. This flavor
takes its width from ``[morph.synthetic] hidden`` and ``[morph.synthetic] layers`` transformer
layers, by default one per pipeline stage (two per rank for a multi-stage schedule, e.g. the V).
``[morph.synthetic] message_kb`` sets the size of the messages between stages independently of
the width: the stages' sends are padded
(``titan_morph.runtime.testbed.pad_stage_messages``, applied with the compute pads).
"""

from dataclasses import dataclass
from typing import Any

from torchtitan.config import JobConfig
from torchtitan.models.llama3.model.args import TransformerModelArgs

from titan_morph.integration.titan022.shape import MULTIPLE_OF, VOCAB, synthetic_sizes

FLAVOR = "synthetic"


@dataclass
class SyntheticModelArgs(TransformerModelArgs):
    """llama3 args resized from ``[morph.synthetic]`` and the pipeline degree at start-up."""

    def update_from_config(self, job_config: JobConfig, **kwargs: Any) -> None:
        super().update_from_config(job_config, **kwargs)
        from titan_morph.integration.titan022.jobconfig import settings_of

        self.dim, self.n_heads, self.n_layers = synthetic_sizes(settings_of(job_config))


def synthetic_flavor() -> SyntheticModelArgs:
    return SyntheticModelArgs(
        dim=64, n_layers=4, n_heads=4, vocab_size=VOCAB, multiple_of=MULTIPLE_OF, rope_theta=10000
    )
