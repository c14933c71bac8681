"""The rank's device on titan_morph's own threads.

CUDA's current device is per thread and starts at device 0: a helper thread (the delegates' reader,
a link prober) that makes a CUDA call without selecting the rank's device first creates a second
context on GPU 0 (``LOCAL_RANK`` != 0) and queries or registers memory against the wrong one. Every
such thread calls :func:`bind_device` first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch

__all__ = ["bind_device", "cuda_events", "is_cuda"]

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


def cuda_events(
    device: Any,
    new_event: Callable[[], E] | None,
    stream: Callable[[], Any] | None,
    *,
    enable_timing: bool = False,
) -> tuple[Callable[[], E], Callable[[], Any]]:
    """``new_event`` and ``stream``, each defaulting to torch's CUDA one for ``device``: the send
    stamps (:mod:`~titan_morph.comm.device_stamps`) and the op timer (``runtime.optime``) mark the
    same stream the same way, only the timer's events keep time; tests pass fakes of both."""

    def cuda_event() -> E:
        return cast(E, torch.cuda.Event(enable_timing=enable_timing))  # type: ignore[no-untyped-call]  # untyped in torch

    return new_event or cuda_event, stream or (lambda: torch.cuda.current_stream(device))
