"""The sizes of TorchTitan 0.2.2's llama3 models as the partition sees them
(:class:`~titan_morph.config.model.ModelShape`), and the synthetic flavor's sizes from
``[morph.synthetic]``."""

from __future__ import annotations

from torchtitan.config import JobConfig
from torchtitan.models.llama3.model.args import TransformerModelArgs

from titan_morph.config import Settings
from titan_morph.config.model import ModelShape, llama_ffn

__all__ = ["HEAD_DIM", "MULTIPLE_OF", "VOCAB", "model_shape", "synthetic_shape", "synthetic_sizes"]

HEAD_DIM = 16
VOCAB = 2048
"""The synthetic model's vocabulary (the bundled tokenizer's)."""
MULTIPLE_OF = 16


def synthetic_sizes(settings: Settings) -> tuple[int, int, int]:
    """(width, heads, layers) of the synthetic model: ``[morph.synthetic] hidden`` wide, one head per
    16, ``layers`` layers (0: one per stage, two per rank for a multi-stage schedule)."""
    hidden = settings.morph.synthetic.hidden
    layers = settings.morph.synthetic.layers or max(1, settings.stages * (settings.job.stages_per_rank or 2))
    return hidden, max(1, hidden // HEAD_DIM), layers


def model_shape(args: TransformerModelArgs, job_config: JobConfig) -> ModelShape:
    """The sizes of a llama3 model (``args``) as trained by ``job_config`` (the partition's costs)."""
    return ModelShape(
        dim=args.dim,
        layers=args.n_layers,
        heads=args.n_heads,
        kv_heads=args.n_kv_heads or args.n_heads,
        ffn=llama_ffn(args.dim, args.multiple_of, args.ffn_dim_multiplier),
        vocab=args.vocab_size,
        seq_len=job_config.training.seq_len,
        microbatch=job_config.parallelism.pipeline_parallel_microbatch_size,
    )


def synthetic_shape(settings: Settings, job_config: JobConfig) -> ModelShape:
    """The synthetic flavor's sizes for a job (what :func:`model_shape` gives of its resized args)."""
    dim, heads, layers = synthetic_sizes(settings)
    return ModelShape(
        dim=dim,
        layers=layers,
        heads=heads,
        kv_heads=heads,
        ffn=llama_ffn(dim, MULTIPLE_OF),
        vocab=VOCAB,
        seq_len=job_config.training.seq_len,
        microbatch=job_config.parallelism.pipeline_parallel_microbatch_size,
    )
