"""CPU process groups for the small collectives titan_morph runs beside the pipeline's own traffic.

The clock estimate and the per-step exchange carry a few hundred floats; on GPUs the pipeline group
is NCCL, which needs device tensors, so they run on a gloo group over the same ranks, made once per
pipeline group and reused.
"""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["cpu_group"]

# Module-level: making a group is collective, so every caller on this rank must share the one made.
_cpu_groups: dict[str, dist.ProcessGroup] = {}


def cpu_group(group: dist.ProcessGroup) -> dist.ProcessGroup:
    """``group`` itself when it runs on gloo, else a gloo group over the same ranks (members only;
    made on first use and cached, so every caller on this rank shares it)."""
    if dist.get_backend(group) == "gloo":
        return group
    cached = _cpu_groups.get(group.group_name)
    if cached is None:
        ranks = dist.get_process_group_ranks(group)
        cached = _cpu_groups[group.group_name] = dist.new_group(
            ranks=ranks, backend="gloo", use_local_synchronization=True
        )
    return cached
