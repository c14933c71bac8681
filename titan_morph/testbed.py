"""Synthetic-compute testbed: make every stage's F, I and W take configured times.

On a 2-core CPU host, four pipeline ranks running real matmuls contend for cores, so their
iteration times say little about the schedule. The testbed instead pads each stage operation to a
configured duration by sleeping (sleeping ranks do not contend), while tiny real tensors still
cross the pipeline links and real gradients flow. Measured iteration times then follow the
simulator's cost model (t^F, t^B, t^W per stage, paper Table 1) and can be compared with its
predictions.

The pad wraps the stage's ``forward_one_chunk`` (F), ``backward_one_chunk`` (I when
``full_backward=False``, else B = I + W) and ``backward_weight_one_chunk`` (W): each call sleeps
until ``start + target`` after the real work, so the op takes ``max(real, target)``. It works with
any torch schedule driving a ``PipelineStage`` (torch's ``Schedule1F1B`` as well as
``MorphSchedule``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StageTimes:
    """Target durations (ms) of one stage's operations."""

    fwd_ms: float
    bwd_ms: float
    wgt_ms: float

    def __post_init__(self) -> None:
        for name in ("fwd_ms", "bwd_ms", "wgt_ms"):
            value = getattr(self, name)
            if not (value >= 0 and value < 60_000):
                raise ValueError(f"synthetic {name} must be in [0, 60000) ms, got {value}")


def _sleep_until(deadline: float) -> None:
    # time.sleep overshoots by ~0.1 ms on Linux; good enough for 10 ms ops, and no busy loop
    # (a spinning rank would steal a core from its neighbours, which is what we avoid).
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


def pad_stage_compute(stage: Any, times: StageTimes) -> None:
    """Pad ``stage``'s F/I/W (and fused B) calls to ``times``. Idempotent per stage."""
    if getattr(stage, "_titan_morph_padded", None) is not None:
        raise RuntimeError(f"stage {stage.stage_index} is already padded to {stage._titan_morph_padded}")
    fwd, bwd, wgt = times.fwd_ms / 1e3, times.bwd_ms / 1e3, times.wgt_ms / 1e3

    forward = stage.forward_one_chunk
    backward = stage.backward_one_chunk
    backward_weight = stage.backward_weight_one_chunk

    def forward_one_chunk(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        out = forward(*args, **kwargs)
        _sleep_until(start + fwd)
        return out

    def backward_one_chunk(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        out = backward(*args, **kwargs)
        _sleep_until(start + (bwd + wgt if kwargs.get("full_backward", True) else bwd))
        return out

    def backward_weight_one_chunk(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        out = backward_weight(*args, **kwargs)
        _sleep_until(start + wgt)
        return out

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk
    stage._titan_morph_padded = times
