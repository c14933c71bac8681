"""The model as the partition sees it: its entries (the embedding, every transformer layer, the
output with the loss), their relative costs and bytes, and the check that a split fits
``[morph] rank_memory_gb``.

The release adapters read a llama3-style model's sizes into a :class:`ModelShape`;
:func:`model_entries` turns it into :class:`~titan_morph.monitor.repartition.Entries`:

* **weights** (how a stage's measured F, B and W are shared among its entries, per token): a
  layer's projections 2·dim·(2·dim + 2·kv_dim) and feed-forward 6·dim·ffn FLOPs in F, I and W
  alike, its attention scores 4·seq·dim in F and twice that in I (no weights); the embedding a
  gather (dim in F and W); the output 2·dim·vocab in F, I and W plus the softmax and loss (5·vocab in
  F and I). On the synthetic testbed the configured per-layer times are the weights, and the
  embedding and output weigh nothing (their ops are not padded);
* **bytes**: parameters x 16 (float32 weights and gradients and AdamW's two moments) and, per
  microbatch in flight, the activations kept for the backward: per token and layer 6·dim + 2·kv_dim
  + heads·seq (the attention probabilities of non-fused attention) + 3·ffn values, for the output
  dim + 2·vocab (logits and their gradient), in the parameters' dtype. An estimate: it refuses
  splits that cannot fit, it does not replace a profile of the real peak.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from titan_morph.config.fields import ConfigError
from titan_morph.monitor.repartition import Entries, entries_of
from titan_morph.pipelining.partition import LayerCost, PartitionProblem, SplitDoesNotFit

__all__ = ["BYTES_PER_PARAMETER", "GB", "ModelShape", "check_split_memory", "model_entries"]

BYTES_PER_PARAMETER = 16
"""float32 weight + gradient + AdamW's two moments."""
GB = 1e9


@dataclass(frozen=True)
class ModelShape:
    """A llama3-style decoder's sizes: width, transformer layers, heads (and key/value heads), the
    feed-forward width, vocabulary, the training sequence length, sequences per microbatch and the
    bytes of one activation value."""

    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    microbatch: int
    value_bytes: int = 4


def llama_ffn(dim: int, multiple_of: int, multiplier: float | None = None) -> int:
    """llama3's feed-forward width: 2/3 of 4·dim (x multiplier), rounded up to ``multiple_of``."""
    hidden = int(2 * 4 * dim / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def model_entries(shape: ModelShape, layer_times: Sequence[tuple[float, float, float]] | None = None) -> Entries:
    """The entries of ``shape`` (module docstring); ``layer_times``: the synthetic testbed's per-layer
    (F, B, W), which then are the weights."""
    d, v, s, ffn = shape.dim, shape.vocab, shape.seq_len, shape.ffn
    kv = d * shape.kv_heads // shape.heads
    tokens = s * shape.microbatch
    proj = 2 * d * (2 * d + 2 * kv) + 6 * d * ffn
    attn = 4 * s * d
    layer_params = d * (2 * d + 2 * kv) + 3 * d * ffn + 2 * d
    layer_acts = (6 * d + 2 * kv + shape.heads * s + 3 * ffn) * tokens * shape.value_bytes
    names = ["tok_embeddings", *(f"layers.{i}" for i in range(shape.layers)), "output"]
    if layer_times is not None:
        if len(layer_times) != shape.layers:
            raise ValueError(f"layer_times: {len(layer_times)} triples for {shape.layers} layers")
        zero = (0.0, 0.0, 0.0)
        weights = [zero, *(tuple(map(float, t)) for t in layer_times), zero]
    else:
        layer = (float(proj + attn), float(proj + 2 * attn), float(proj))
        weights = [
            (float(d), 0.0, float(d)),
            *([layer] * shape.layers),
            (2.0 * d * v + 5 * v, 2.0 * d * v + 5 * v, 2.0 * d * v),
        ]
    sizes = [
        (float(v * d * BYTES_PER_PARAMETER), 0.0),
        *([(float(layer_params * BYTES_PER_PARAMETER), float(layer_acts))] * shape.layers),
        (float((d * v + d) * BYTES_PER_PARAMETER), float((d + 2 * v) * tokens * shape.value_bytes)),
    ]
    return Entries(tuple(names), tuple(weights), tuple(sizes))  # type: ignore[arg-type]


def check_split_memory(
    entries: Entries, layers_per_stage: Sequence[int], memory_gb: Sequence[float], schedule: str, microbatches: int
) -> None:
    """One :class:`ConfigError` naming ``morph.rank_memory_gb`` when a rank cannot hold its layers
    of the split (transformer layers per stage) with the microbatches in flight ``schedule`` needs."""
    if not memory_gb:
        return
    ranks = len(layers_per_stage)
    memory = tuple(memory_gb) * ranks if len(memory_gb) == 1 else tuple(memory_gb)
    costs = tuple(LayerCost(n, 1.0, 1.0, 1.0, p, a) for n, (p, a) in zip(entries.names, entries.bytes))
    problem = PartitionProblem(
        costs, (1.0,) * ranks, microbatches, schedule=schedule, memory=tuple(m * GB for m in memory)
    )
    try:
        problem.cost_model(entries_of(layers_per_stage))
    except SplitDoesNotFit as err:
        shown = [round(m, 3) for m in memory]
        raise ConfigError(
            f"morph.rank_memory_gb: {shown} GB cannot hold the split {list(layers_per_stage)} (layers per stage):"
            f" {str(err).removeprefix('memory: ')}"
        ) from None
