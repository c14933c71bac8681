"""Test plug-in (``--experimental.custom_import dp_blocks``): PP-only training on a DP run's data.

Registers the TrainSpec ``llama3_morph_dpblocks``: ``llama3_morph`` whose dataloader, on a run
without data parallelism, serves each step the global batch that ``DP_SHARDS`` data-parallel ranks
would read together: ``local_batch_size / DP_SHARDS`` samples from each of TorchTitan's
``DP_SHARDS`` shards of the dataset, in DP-rank order. A PP-only run of this spec with
``local_batch_size = DP_SHARDS x B`` therefore sees, step by step, the same samples as a DP x PP run
of ``llama3_morph`` with ``local_batch_size = B``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset
from torchtitan.protocols import train_spec as ts

from titan_morph.integration.titan022.register import register_all

SPEC = "llama3_morph_dpblocks"
DP_SHARDS = 2


class _Blocks(IterableDataset):
    """``block`` samples of each shard in turn."""

    def __init__(self, shards: list[HuggingFaceTextDataset], block: int) -> None:
        self.shards, self.block = shards, block

    def __iter__(self) -> Iterator[Any]:
        streams = [iter(shard) for shard in self.shards]
        while True:
            for stream in streams:
                for _ in range(self.block):
                    yield next(stream)


def build_dataloader(dp_world_size: int, dp_rank: int, tokenizer: Any, job_config: Any) -> ParallelAwareDataloader:
    if dp_world_size != 1:
        raise ValueError(f"{SPEC} emulates {DP_SHARDS} DP ranks on a run without data parallelism")
    training = job_config.training
    shards = [
        HuggingFaceTextDataset(
            training.dataset, training.dataset_path, tokenizer, training.seq_len, d, DP_SHARDS, infinite=True
        )
        for d in range(DP_SHARDS)
    ]
    blocks = _Blocks(shards, training.local_batch_size // DP_SHARDS)
    return ParallelAwareDataloader(blocks, dp_rank=0, dp_world_size=1, batch_size=training.local_batch_size)


register_all()
if SPEC not in ts._extra_train_specs:
    ts.register_train_spec(
        SPEC, dataclasses.replace(ts.get_train_spec("llama3_morph"), build_dataloader_fn=build_dataloader)
    )
