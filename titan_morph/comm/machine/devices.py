"""The rank's device on titan_morph's own threads.

CUDA's current device is per thread and starts at device 0: a helper thread (the delegates' reader,
a link prober) that makes a CUDA call without selecting the rank's device first creates a second
context on GPU 0 (``LOCAL_RANK`` != 0) and queries or registers memory against the wrong one. Every
such thread calls :func:`bind_device` first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

__all__ = ["StreamMarks", "bind_device", "is_cuda"]

E = TypeVar("E")


def is_cuda(device: torch.device | None) -> bool:
    return device is not None and device.type == "cuda"


def bind_device(device: torch.device | None) -> None:
    """Make ``device`` current on the calling thread (nothing for CPU or None); a CUDA device without
    an index is taken as the one the process has current."""
    if not is_cuda(device):
        return
    assert device is not None
    torch.cuda.set_device(device if device.index is not None else torch.cuda.current_device())


@dataclass(frozen=True)
class StreamMarks(Generic[E]):
    """How to mark a point of the issuing stream (``new_event`` then its ``record(stream())``) and
    read the host clock: the send stamps (:mod:`~titan_morph.comm.machine.stamps`) and the op timer
    (``runtime.optime``) mark the same stream the same way; tests pass fakes of all three."""

    new_event: Callable[[], E]
    stream: Callable[[], Any]
    now: Callable[[], float] = time.monotonic

    @classmethod
    def cuda(cls, device: Any, *, enable_timing: bool = False) -> StreamMarks[Any]:
        """torch's CUDA events on ``device``'s current stream (``enable_timing``: events that keep time)."""

        def cuda_event() -> Any:
            return torch.cuda.Event(enable_timing=enable_timing)  # type: ignore[no-untyped-call]  # untyped in torch

        return StreamMarks(cuda_event, lambda: torch.cuda.current_stream(device))
