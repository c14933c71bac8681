"""Emulated compute stragglers in a running job: every op of this rank takes its time x the factor
``[morph.inject] compute_factor`` gives the rank in the current step (the compute model of
:mod:`titan_morph.pipelining.core.speeds`, which the simulator reads too).

* The synthetic testbed pads each op to its configured time x the factor
  (:func:`titan_morph.runtime.testbed.pad_stage_compute` reads :data:`ACTIVE`).
* A real model's op is followed by (factor - 1) x its own duration of extra time
  (:func:`slow_stage_compute`): on a CPU a sleep after the call, whose host time is the compute;
  on a GPU a ``torch.cuda._sleep`` kernel queued behind the op, as long as (factor - 1) x the last
  completed op of the same kind and stage (timed by CUDA events, read with ``query()`` only), so
  the host never waits for the device. The kernel's clock rate is measured once, when the stage is
  wrapped.

The factor is keyed by the training step: the trainer calls ``ACTIVE.set_step`` before each step
(TorchTitan's count, also after a resume). One process-wide instance, as the op it slows down is
torch's stage method: the testbed and the model's wrapper read the same factor.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from titan_morph.pipelining.core.speeds import ComputeModel
from titan_morph.runtime.stage_hooks import wrap_ops

__all__ = ["ACTIVE", "ComputeSlowdown", "slow_stage_compute"]


class ComputeSlowdown:
    """This rank's compute factor in the current step (1 without a model)."""

    def __init__(self) -> None:
        self.model: ComputeModel | None = None
        self.rank = 0
        self.step = 1

    def configure(self, model: ComputeModel | None, rank: int) -> None:
        """Slow pipeline rank ``rank`` by ``model`` (None: never)."""
        if model is not None and not 0 <= rank < model.ranks:
            raise ValueError(f"compute model of {model.ranks} ranks has no rank {rank}")
        self.model, self.rank = model, rank

    def set_step(self, step: int) -> None:
        self.step = step

    def factor(self) -> float:
        return 1.0 if self.model is None else self.model.factor(self.rank, self.step)


ACTIVE = ComputeSlowdown()
"""The process's slowdown (module docstring)."""


class _CudaExtra:
    """Queues (factor - 1) x an op's last measured duration as a ``_sleep`` kernel after it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cycles_per_ms = self._calibrate()
        self.pending: dict[tuple[str, int], deque[tuple[Any, Any]]] = {}
        self.last_ms: dict[tuple[str, int], float] = {}

    def _calibrate(self) -> float:
        """Clock cycles of ``torch.cuda._sleep`` per ms on this device (one synchronise, at set-up)."""
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))  # type: ignore[no-untyped-call]
        cycles = 10_000_000
        with torch.cuda.device(self.device):
            start.record()
            torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]  # untyped in torch
            end.record()
            end.synchronize()
        return float(cycles / max(start.elapsed_time(end), 1e-3))

    def begin(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        return event

    def end(self, key: tuple[str, int], start: Any, factor: float) -> None:
        done = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        done.record()
        queue = self.pending.setdefault(key, deque())
        queue.append((start, done))
        while queue and queue[0][1].query():  # completed ops of this kind: their durations, no wait
            first, last = queue.popleft()
            self.last_ms[key] = first.elapsed_time(last)
        known = self.last_ms.get(key)
        if factor > 1.0 and known is not None:
            torch.cuda._sleep(int(self.cycles_per_ms * known * (factor - 1.0)))  # type: ignore[no-untyped-call]


def slow_stage_compute(stage: Any, slowdown: ComputeSlowdown = ACTIVE) -> None:
    """Follow each of ``stage``'s F, I/B and W calls by (factor - 1) x its duration (module
    docstring): the ``compute`` layer of :mod:`.stage_hooks`."""
    device = getattr(stage, "device", None)
    cuda = _CudaExtra(device) if isinstance(device, torch.device) and device.type == "cuda" else None

    def wrap(name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def slowed(*args: Any, **kwargs: Any) -> Any:
            factor = slowdown.factor()
            if cuda is not None:
                start = cuda.begin()
                out = inner(*args, **kwargs)
                split = name == "backward_one_chunk" and not kwargs.get("full_backward", True)
                cuda.end((f"{name}{':input' if split else ''}", stage.stage_index), start, factor)
                return out
            t0 = time.monotonic()
            out = inner(*args, **kwargs)
            if factor > 1.0:
                time.sleep((time.monotonic() - t0) * (factor - 1.0))
            return out

        return slowed

    wrap_ops(stage, "compute", wrap, "slowed by the compute factor")
