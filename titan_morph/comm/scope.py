"""Route the pipeline runtime's P2P through a transport (anything with ``batch_p2p``: ``transport.P2P``).

torch's schedules (``_PipelineScheduleRuntime``, ``Schedule1F1B``, ``_sorted_batch_p2p``) call the
module-level ``torch.distributed.pipelining.schedules._batch_p2p`` and look it up at call time, so
replacing that attribute for the duration of one schedule step routes every SEND_F/RECV_F/
SEND_B/RECV_B through the transport. ``use_transport`` does the swap and always restores it.

The swap is process-wide (all threads see it); nesting is allowed only with the same transport.
Order is untouched: ops reach the transport in the order the schedule issues them, so per-link
send order (which gloo matches by tag and order) is preserved as long as the transport keeps it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch.distributed as dist
from torch.distributed.pipelining import schedules as _schedules

from titan_morph.comm.transport import P2P, Handle, on_own_rank

# Module-level: torch's _batch_p2p is one attribute of the process, so what swapped it is too.
_lock = threading.Lock()
_active: P2P | None = None
_depth = 0
_saved: Callable[..., list[dist.Work]] | None = None


def active_transport() -> P2P | None:
    """The transport currently swapped in, or None."""
    return _active


def _routed_batch_p2p(p2p_ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
    transport = _active
    if transport is None:  # only reachable if someone captured this function and calls it later
        raise RuntimeError("titan_morph routed _batch_p2p called outside use_transport()")
    ops, local = on_own_rank(p2p_ops)  # torch 2.11's warm-up of a V's same-rank neighbour
    return local + transport.batch_p2p(ops, desc=desc)


# a mark on our own function: transport.py refuses to capture it as torch's at import
_routed_batch_p2p.__titan_morph_transport__ = True  # type: ignore[attr-defined]


@contextmanager
def use_transport(transport: P2P) -> Iterator[P2P]:
    """Swap torch's ``schedules._batch_p2p`` for ``transport.batch_p2p`` inside the block.

    Re-entering with the same transport nests; a different one raises ``RuntimeError``. The
    original function is restored when the outermost block exits, also on exceptions.
    """
    global _active, _depth, _saved
    if not isinstance(transport, P2P):
        raise TypeError(f"use_transport needs a Transport with batch_p2p(ops), got {type(transport).__name__}")
    with _lock:
        if _active is not None and _active is not transport:
            raise RuntimeError(
                f"use_transport: {type(transport).__name__} requested while {type(_active).__name__} is already "
                "active; transports switch only at step boundaries (exit the current block first)"
            )
        if _depth == 0:
            _saved = _schedules._batch_p2p
            # The swap: torch's schedules look _batch_p2p up at call time and only wait() what it returns.
            _schedules._batch_p2p = _routed_batch_p2p  # type: ignore[assignment]  # Handles, not Works
            _active = transport
        _depth += 1
    try:
        yield transport
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                _schedules._batch_p2p = _saved
                _active = None
                _saved = None
