"""What a relaunch will cost before one has been seen: ``partition = "auto"``'s ski rental buys a
move at this price (:class:`~titan_morph.monitor.repartition.RelaunchParts`).

A first launch measures its own start and first step; a relaunch adds the checkpoint's save, the
end of the run and the checkpoint's load. The end of the run is the release's: rank 0 of both
TorchTitan releases sleeps :data:`END_OF_RUN_MS` after the last step. The save and load are probed
once, after the first step, on the file system the checkpoint goes to: a DCP save and load of a
state with one entry per tensor of this rank's checkpoint (its model parts and optimizer state) and
their bytes. A checkpoint over :data:`PROBE_BYTES` on a rank is probed with its entries scaled down
to that, plus one save and load of the same entries at one byte each; the difference is the time
the bytes take, extrapolated to the whole checkpoint (the file system's rate), the rest a cost per
entry. Every rank agrees the slowest rank's figures, since a relaunch waits for it. Not counted:
the old processes' exit and torchrun's notice of it (about 0.8 s on the CPU testbed), the relaunched
first step's plan for the carried speeds (0-1.8 s there), and a start slower or faster than the
first one was.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor

from titan_morph.monitor.repartition import RelaunchParts

__all__ = ["END_OF_RUN_MS", "PROBE_BYTES", "PROBE_FOLDER", "checkpoint_sizes", "probe_checkpoint", "relaunch_parts"]

END_OF_RUN_MS = 2000.0
"""TorchTitan's rank 0 sleeps 2 s after the last step "for other ranks to complete" (0.2.2's
``train.py`` and 0.3.0's ``trainer.py`` alike)."""

PROBE_BYTES = 64 * 2**20
"""The most a rank writes for the probe; a larger checkpoint is extrapolated from it."""

PROBE_FOLDER = ".titan_morph_relaunch_probe"
"""Made inside the job's checkpoint folder, removed by the probe."""


def checkpoint_sizes(modules: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer]) -> list[int]:
    """Bytes of every tensor this rank's checkpoint holds: its model parts' state and its
    optimizers' state (local shards of DTensors)."""
    tensors: list[torch.Tensor] = []
    for module in modules:
        tensors += [t for t in module.state_dict().values() if isinstance(t, torch.Tensor)]
    for optimizer in optimizers:
        for state in optimizer.state.values():
            tensors += [t for t in state.values() if isinstance(t, torch.Tensor)]
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return [t.numel() * t.element_size() for t in local]


def _timed_save_load(state: dict[str, torch.Tensor], path: Path, group: dist.ProcessGroup) -> tuple[float, float]:
    """Milliseconds to save ``state`` to ``path`` with DCP and to load it back, over ``group``."""
    dist.barrier(group=group)
    began = time.perf_counter()
    dcp.save(state, checkpoint_id=str(path), process_group=group)
    saved = time.perf_counter()
    dcp.load(state, checkpoint_id=str(path), process_group=group)
    loaded = time.perf_counter()
    return (saved - began) * 1e3, (loaded - saved) * 1e3


def probe_checkpoint(
    folder: str | Path, sizes: Sequence[int], group: dist.ProcessGroup, limit: int = PROBE_BYTES
) -> tuple[float, float]:
    """Collective over ``group`` (gloo): the save and load of a checkpoint of ``sizes`` bytes per
    entry on this rank into ``folder``, in ms, the largest any rank estimated. Nothing is left in
    ``folder``."""
    rank = dist.get_rank()
    total = max(1, sum(sizes))
    scale = min(1.0, limit / total)

    def state(of: Sequence[int]) -> dict[str, torch.Tensor]:
        return {f"rank{rank}.{i}": torch.zeros(max(1, n), dtype=torch.uint8) for i, n in enumerate(of)}

    path = Path(folder) / PROBE_FOLDER
    try:
        scaled = [round(n * scale) for n in sizes]
        save_ms, load_ms = _timed_save_load(state(scaled), path / "bytes", group)
        if scale < 1.0:  # the bytes' share, at the rate the probe's bytes went, for the whole checkpoint
            entry_save, entry_load = _timed_save_load(state([1] * len(sizes)), path / "entries", group)
            factor = total / max(1, sum(scaled))
            save_ms = entry_save + max(0.0, save_ms - entry_save) * factor
            load_ms = entry_load + max(0.0, load_ms - entry_load) * factor
        agreed = torch.tensor([save_ms, load_ms], dtype=torch.float64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        dist.barrier(group=group)
    finally:
        if dist.get_rank(group) == 0:
            shutil.rmtree(path, ignore_errors=True)
    return float(agreed[0]), float(agreed[1])


def relaunch_parts(
    folder: str | Path,
    modules: Iterable[torch.nn.Module],
    optimizers: Iterable[torch.optim.Optimizer],
    group: dist.ProcessGroup,
) -> RelaunchParts:
    """Collective over ``group`` (every rank of the job): what a relaunch adds to a launch's start."""
    save_ms, load_ms = probe_checkpoint(folder, checkpoint_sizes(modules, optimizers), group)
    return RelaunchParts(save_ms, load_ms, END_OF_RUN_MS)
