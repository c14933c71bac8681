"""The relaunch price's probe on real gloo ranks: what a checkpoint's entries and bytes are, a DCP save
and load timed and agreed by every rank, a large checkpoint extrapolated from a bounded probe, and
nothing left in the checkpoint folder."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist

from tests.launch import run_ranks
from titan_morph.integration.relaunch_price import PROBE_FOLDER, checkpoint_sizes, probe_checkpoint


def test_a_checkpoints_sizes_are_its_modules_and_optimizer_state():
    model = torch.nn.Linear(8, 4)  # weight 32 + bias 4 floats
    optimizer = torch.optim.AdamW(model.parameters())
    assert sorted(checkpoint_sizes([model], [optimizer])) == [16, 128]  # no optimizer state before a step
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    sizes = checkpoint_sizes([model], [optimizer])
    # each parameter gains exp_avg and exp_avg_sq of its size, and a step count (a scalar tensor)
    assert sorted(sizes) == sorted([16, 128, 16, 16, 128, 128, 4, 4]), sizes


LIMITS = (2**30, 2**16)  # the whole checkpoint written; a bounded probe extrapolated


def _probe(rank: int, world: int, root: str, sizes: list[int]) -> list[tuple[float, float, list[str]]]:
    group = dist.new_group(backend="gloo")
    out = []
    for limit in LIMITS:
        folder = Path(root, f"limit{limit}")
        save_ms, load_ms = probe_checkpoint(folder, [n * (rank + 1) for n in sizes], group, limit=limit)
        dist.barrier(group=group)
        out.append((save_ms, load_ms, sorted(p.name for p in folder.iterdir())))
    return out


def test_the_probe_is_agreed_by_every_rank_and_leaves_nothing(tmp_path):
    for limit in LIMITS:
        (tmp_path / f"limit{limit}" / "step-5").mkdir(parents=True)  # the job's own checkpoints stay
    got = run_ranks(_probe, 2, str(tmp_path), [4096] * 20 + [2**20], timeout=120)
    assert got[0] == got[1], got  # one figure for every rank: the slowest rank's
    for save_ms, load_ms, left in got[0]:
        assert math.isfinite(save_ms) and save_ms > 0 and math.isfinite(load_ms) and load_ms > 0
        assert left == ["step-5"] and PROBE_FOLDER not in left
