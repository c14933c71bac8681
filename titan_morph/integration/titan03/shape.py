"""The sizes of a TorchTitan 0.3.0 llama3 model config as the partition sees them
(:class:`~titan_morph.config.model.ModelShape`)."""

from __future__ import annotations

from typing import Any

from torchtitan.config import ParallelismConfig, TrainingConfig

from titan_morph.config.model import ModelShape

__all__ = ["model_shape"]


def model_shape(model: Any, training: TrainingConfig, parallelism: ParallelismConfig) -> ModelShape:
    """The sizes of a 0.3.0 llama3 model config (``Decoder.Config``: its layers' attention and
    feed-forward configs) as trained (the partition's costs)."""
    layer = model.layers[0]
    heads = layer.attention.n_heads
    return ModelShape(
        dim=model.dim,
        layers=len(model.layers),
        heads=heads,
        kv_heads=layer.attention.qkv_linear.n_kv_heads or heads,
        ffn=layer.feed_forward.w1.out_features,
        vocab=model.vocab_size,
        seq_len=training.seq_len,
        microbatch=parallelism.pipeline_parallel_microbatch_size,
    )
