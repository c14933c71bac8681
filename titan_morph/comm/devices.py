"""The rank's device on titan_morph's own threads.

CUDA's current device is per thread and starts at device 0: a helper thread (the delegates' reader,
a link prober) that makes a CUDA call without selecting the rank's device first creates a second
context on GPU 0 (``LOCAL_RANK`` != 0) and queries or registers memory against the wrong one. Every
such thread calls :func:`bind_device` first.
"""

from __future__ import annotations

import torch

__all__ = ["bind_device", "is_cuda"]


def is_cuda(device: torch.device | None) -> bool:
    return device is not None and device.type == "cuda"


def bind_device(device: torch.device | None) -> None:
    """Make ``device`` current on the calling thread (nothing for CPU or None); a CUDA device without
    an index is taken as the one the process has current."""
    if not is_cuda(device):
        return
    assert device is not None
    torch.cuda.set_device(device if device.index is not None else torch.cuda.current_device())
