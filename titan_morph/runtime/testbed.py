"""Synthetic-compute testbed: make every stage's F, I and W take configured times.

On a 2-core CPU host, four pipeline ranks running real matmuls contend for cores, so their
iteration times say little about the schedule. The testbed instead pads each stage operation to a
configured duration by sleeping (sleeping ranks do not contend), while tiny real tensors still
cross the pipeline links and real gradients flow. Measured iteration times then follow the
simulator's cost model (t^F, t^B, t^W per stage, paper Table 1) and can be compared with its
predictions.

The pad wraps the stage's ``forward_one_chunk`` (F), ``backward_one_chunk`` (I when
``full_backward=False``, else B = I + W) and ``backward_weight_one_chunk`` (W). It works with any
torch schedule driving a ``PipelineStage`` (torch's ``Schedule1F1B`` as well as ``MorphSchedule``).

Device clock. The simulator, like a GPU, runs a stage's ops back to back: an op starts when the
previous one has ended *and* its input has arrived, and takes exactly its time. A CPU host adds
its own work between ops (issuing sends/receives, the schedule loop, the last stage's loss) and
wakes up late from sleeps (~0.2 ms, more under load); over 72 ops per step that alone made
iterations ~5-10 % longer than predicted. On a GPU that host work overlaps the previous kernel
(launches are asynchronous), so the pad keeps a per-stage *device clock* and pads each op to
``device start + target``, where the device start is

* the previous op's device end, if the host came back within ``hide_host_gap_ms`` (host overhead
  and sleep overshoot are absorbed, as asynchronous launches would absorb them; at most
  ``hide_host_gap_ms`` in all: an op never starts more than that before it is called);
* the moment the op's input was delivered, if its wait actually blocked (the input arrived
  later than the previous op's end: the device idled until then). Through the link emulator that
  is the link model's delivery time (``due_s`` of its receive handles), not the later moment the
  host saw the data (its link thread, store notice and gloo hop are host latency, which a GPU's
  NCCL does not add); otherwise the moment the wait returned;
* otherwise (a longer host gap, e.g. between training steps) the moment the op is called.

The input wait is observed by timing torch's ``schedules._wait_batch_p2p`` (one process-wide
probe, installed once). The device clock never starts an op before the previous one's device end
or shortens an op below its real compute time; a host slower than the device still shows up.
A process running several stages (the V) pads all of them on one device clock: one device runs
them all, one op at a time.

Compute stragglers. Each op's target is its configured time x this rank's compute factor in the
current step (``[morph.inject] compute_factor``, :data:`titan_morph.runtime.slowdown.ACTIVE`), the
factor the simulator applies to the same stage (:mod:`titan_morph.pipelining.core.speeds`).

Message size. :func:`pad_stage_messages` makes every inter-stage message a fixed number of bytes
(``[morph.synthetic] message_kb``), whatever the model's width: the activations travel with a zero
tensor beside them, which the next stage drops (its gradient, zeros, comes back the same way), so
losses and gradients are those of the unpadded model and only the link's load changes, the way a
bandwidth study needs it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from titan_morph.comm.transport import Handle
from titan_morph.runtime.slowdown import ACTIVE
from titan_morph.runtime.stage_hooks import wrap_module_forward, wrap_ops

# A wait counts as "blocked" (the input was not there yet) if it took longer than this.
WAIT_BLOCKED_S = 2e-4
DEFAULT_HIDE_HOST_GAP_MS = 2.0


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


@dataclass
class InputWait:
    """Monotonic seconds of one pipeline input wait: when it started and ended, and ``due``, when
    the link model delivered its inputs (emulated receives, see :func:`_due`; None: at ``end``)."""

    start: float = -math.inf
    end: float = -math.inf
    due: float | None = None


# Process-wide, as the torch function it is read from: every stage of this process waits through it.
_last_wait = InputWait()


def _due(work: Any, end: float) -> float:
    """When the inputs of ``work`` were delivered by the link model: the latest ``due_s`` of its
    receives (the link emulator's handles know it), or ``end`` if any receive does not know it.
    ``work`` holds transport handles, or torch's own ``dist.Work`` when no transport is routed."""
    due = -math.inf
    for handle in work if isinstance(work, (list, tuple)) else ():
        if not isinstance(handle, Handle) or handle.record is None or handle.record.side != "recv":
            continue
        if handle.due_s is None:
            return end
        due = max(due, handle.due_s)
    return end if due == -math.inf else min(due, end)


def _install_wait_probe() -> None:
    """Time every ``_wait_batch_p2p`` of torch's schedules (looked up at call time). Idempotent."""
    from torch.distributed.pipelining import schedules

    if isinstance(schedules._wait_batch_p2p, _WaitProbe):
        return
    # torch offers no hook around a schedule's input wait: replacing its module function is the only way to time it
    schedules._wait_batch_p2p = _WaitProbe(schedules._wait_batch_p2p)


class _WaitProbe:
    """torch's ``_wait_batch_p2p`` that records each wait in :data:`_last_wait`."""

    def __init__(self, inner: Callable[[Any], Any]) -> None:
        self.inner = inner

    def __call__(self, work: Any) -> Any:
        start = time.monotonic()
        try:
            return self.inner(work)
        finally:
            end = time.monotonic()
            wait = _last_wait
            wait.start, wait.end, wait.due = start, end, _due(work, end)


def _sleep_until(deadline: float) -> None:
    # No busy loop: a spinning rank would steal a core from its neighbours, which is what we avoid.
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


class DeviceClock:
    """One stage's device timeline (see the module docstring); times are ``time.monotonic()`` s."""

    def __init__(self, hide_host_gap_ms: float = DEFAULT_HIDE_HOST_GAP_MS) -> None:
        if not (hide_host_gap_ms >= 0 and math.isfinite(hide_host_gap_ms)):
            raise ValueError(f"hide_host_gap_ms must be a finite number of ms >= 0, got {hide_host_gap_ms}")
        self.hide_s = hide_host_gap_ms / 1e3
        self.device_end = -math.inf  # device end of the previous op
        self.host_end = -math.inf  # when the previous op returned to the host
        self.hidden_s = 0.0  # host time absorbed so far (diagnostics)
        self.last_begin = -math.inf  # device start of the latest op (its profile, like a CUDA event)

    def start(self, now: float) -> float:
        """Device start of an op called at ``now``."""
        wait = _last_wait
        wait_start, wait_end = wait.start, wait.end
        due = wait_end if wait.due is None else wait.due
        blocked = wait_end - wait_start > WAIT_BLOCKED_S and wait_end >= self.host_end
        if blocked and now - wait_end <= self.hide_s:
            # the input arrived late: the device idled until the link delivered it
            begin = max(self.device_end, due)
        elif now - self.host_end <= self.hide_s:
            begin = self.device_end  # host overhead only: hidden under the previous op
        else:
            begin = now
        begin = min(max(begin, now - self.hide_s), now)  # never more than hide_s of host time hidden
        self.hidden_s += now - begin
        return begin

    def run(self, target_s: float, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` as one op of ``target_s`` device seconds."""
        begin = self.last_begin = self.start(time.monotonic())
        out = fn(*args, **kwargs)
        computed = time.monotonic()
        deadline = begin + target_s
        if computed >= deadline:  # real compute took longer than the target: the device was busy
            self.device_end = computed
        else:
            _sleep_until(deadline)
            self.device_end = deadline  # a late wake-up is host latency, not device time
        self.host_end = time.monotonic()
        return out


def pad_stage_compute(
    stage: Any,
    times: StageTimes,
    *,
    hide_host_gap_ms: float = DEFAULT_HIDE_HOST_GAP_MS,
    clock: DeviceClock | None = None,
    factor: Callable[[], float] = ACTIVE.factor,
) -> DeviceClock:
    """Pad ``stage``'s F/I/W (and fused B) calls to ``times`` x ``factor()`` (the rank's compute
    factor now) on a device clock; returns the clock.

    ``hide_host_gap_ms = 0`` disables hiding (every op is padded from the moment it is called).
    ``clock``: the device clock of another stage of this rank, to share (the V); None: a new one.
    """
    _install_wait_probe()
    clock = DeviceClock(hide_host_gap_ms) if clock is None else clock
    fwd, bwd, wgt = times.fwd_ms / 1e3, times.bwd_ms / 1e3, times.wgt_ms / 1e3

    def wrap(name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        if name == "backward_one_chunk":  # I alone, or B = I + W

            def backward(*args: Any, **kwargs: Any) -> Any:
                target = bwd + wgt if kwargs.get("full_backward", True) else bwd
                return clock.run(target * factor(), inner, *args, **kwargs)

            return backward
        target = fwd if name == "forward_one_chunk" else wgt

        def padded(*args: Any, **kwargs: Any) -> Any:
            return clock.run(target * factor(), inner, *args, **kwargs)

        return padded

    wrap_ops(stage, "compute", wrap, f"padded to {times}")
    return clock


def _message_ops() -> tuple[Any, Any]:
    """The two autograd functions of :func:`pad_stage_messages` (torch imported on first use)."""
    import torch

    class PadMessage(torch.autograd.Function):
        """``h`` -> (``h``, zeros(extra)): the padding carries nothing and returns no gradient."""

        @staticmethod
        def forward(ctx: Any, h: torch.Tensor, extra: int) -> tuple[torch.Tensor, torch.Tensor]:
            return h.clone(), h.new_zeros(extra)

        @staticmethod
        def backward(ctx: Any, grad_h: torch.Tensor, grad_pad: torch.Tensor) -> tuple[torch.Tensor, None]:
            return grad_h, None

    class DropPad(torch.autograd.Function):
        """(``h``, padding) -> ``h``; the padding's gradient is zeros, sent back like any other."""

        @staticmethod
        def forward(ctx: Any, h: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
            ctx.pad_numel = pad.numel()
            return h.clone()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return grad, grad.new_zeros(ctx.pad_numel)

    return PadMessage, DropPad


def pad_stage_messages(stage: Any, message_bytes: int, key: str = "morph.synthetic.message_kb") -> None:
    """Make every message this stage sends (activations; their gradients come back the same size)
    ``message_bytes`` long: the output is sent with a zero padding tensor beside it, which the next
    stage drops. Values and gradients are unchanged, only the bytes on the link grow, so a testbed's
    link load is set independently of its model width (bandwidth studies)."""
    pad, drop = _message_ops()
    first, last = stage.is_first, stage.is_last

    def wrap(forward: Callable[..., Any]) -> Callable[..., Any]:
        def padded_forward(*args: Any, **kwargs: Any) -> Any:
            if not first and len(args) == 2:  # (activations, padding) from the previous stage
                args = (drop.apply(args[0], args[1]),)
            out = forward(*args, **kwargs)
            if last:
                return out
            extra = message_bytes - out.nbytes
            if extra < 0 or extra % out.element_size():
                raise ValueError(
                    f"{key}: {message_bytes / 1024:g} KiB per message, but stage {stage.stage_index} sends "
                    f"{out.nbytes / 1024:g} KiB of activations ({tuple(out.shape)} {out.dtype}): use 0 or a size"
                    f" >= that, in whole {out.element_size()}-byte values"
                )
            return pad.apply(out, extra // out.element_size()) if extra else out

        return padded_forward

    wrap_module_forward(stage, wrap, f"padded to {message_bytes} bytes a message")
