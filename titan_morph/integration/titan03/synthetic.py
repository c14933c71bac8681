"""The ``synthetic`` model flavor on TorchTitan 0.3.0: a tiny llama whose width is configurable.

As on 0.2.2 (:mod:`titan_morph.integration.titan022.synthetic`), with ``morph.synthetic.enabled`` every
stage's F, I and W are padded to the configured times; the model only has to be small and send
``hidden``-wide activations: width ``morph.synthetic.hidden``, one head per 16, and
``morph.synthetic.layers`` transformer layers (by default one per pipeline stage). 0.3.0 describes
a model by a config tree, built here from its llama3 parts (``_build_llama3_layers`` is the one
private helper used: it holds llama3's layer recipe).
"""

from __future__ import annotations

from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers

from titan_morph.config import Settings

__all__ = ["FLAVOR", "HEAD_DIM", "VOCAB", "sized_model", "synthetic_model"]

FLAVOR = "synthetic"
HEAD_DIM = 16
VOCAB = 2048


def synthetic_model(hidden: int, n_layers: int, max_seq_len: int = 4096) -> Llama3Model.Config:
    """A llama3 model config ``hidden`` wide with ``n_layers`` layers (vocabulary of the bundled tokenizer)."""
    n_heads = max(1, hidden // HEAD_DIM)
    return Llama3Model.Config(
        dim=hidden,
        vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=hidden),
        norm=RMSNorm.Config(normalized_shape=hidden),
        lm_head=Linear.Config(in_features=hidden, out_features=VOCAB),
        layers=_build_llama3_layers(
            n_layers=n_layers,
            dim=hidden,
            n_heads=n_heads,
            hidden_dim=compute_ffn_hidden_dim(hidden, multiple_of=16),
            rope=ComplexRoPE.Config(dim=hidden // n_heads, max_seq_len=max_seq_len, theta=10000),
            attn_backend="flex",
        ),
    )


def sized_model(settings: Settings) -> Llama3Model.Config:
    """The synthetic model of a job: width ``morph.synthetic.hidden``, ``morph.synthetic.layers``
    layers (0: one per stage, two per rank for a multi-stage schedule)."""
    layers = settings.morph.synthetic.layers or max(1, settings.stages * (settings.job.stages_per_rank or 2))
    return synthetic_model(settings.morph.synthetic.hidden, layers)
