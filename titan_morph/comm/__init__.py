"""Pipeline data plane: Transport protocol and runtime swap, link emulator, delegated transport, failover.

Imports are lazy (PEP 562) so ``import titan_morph.comm`` loads neither torch.distributed nor
threads; ``from titan_morph.comm import EmulatedTransport`` imports what it names.

Use from a pipeline schedule (one stage per pp rank)::

    epoch = sync_epoch(pp_group)                      # once, collective over the pp group
    transport = EmulatedTransport(TorchTransport(), link_model, stage=pp_rank, num_stages=pp_size,
                                  group=pp_group, depth=2, epoch=epoch)   # depth=None: non-blocking
    # (no emulation: transport = TorchTransport())
    for step in ...:
        transport.set_step(step)                      # before the step: step-keyed traces
        with use_transport(transport):                # swap torch's _batch_p2p for this step only
            schedule.step(...)
        records = transport.take_records()            # per-message timings; transport.blocked_ms()
    transport.close()                                 # at exit (also closes the inner transport)

All pp ranks must construct their transports in the same order (store key namespace).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Handle": "transport",
    "Transport": "transport",
    "TorchTransport": "transport",
    "TorchHandle": "transport",
    "LinkOp": "transport",
    "classify_op": "transport",
    "group_by_link": "transport",
    "use_transport": "scope",
    "active_transport": "scope",
    "EmulatedTransport": "emulator",
    "MessageRecord": "emulator",
    "CommTimeoutError": "emulator",
    "sync_epoch": "emulator",
    "LinkDownError": "emulator",
    "DelegateTransport": "delegate",
    "DelegateError": "delegate",
    "FailoverTransport": "failover",
    "RecordedTransport": "recorded",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'titan_morph.comm' has no attribute {name!r}")
    return getattr(importlib.import_module(f"titan_morph.comm.{module}"), name)
