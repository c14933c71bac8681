"""Pipeline data plane: the written Transport protocol and its implementations.

Imports are lazy (PEP 562) so ``import titan_morph.comm`` loads neither torch.distributed nor
threads; ``from titan_morph.comm import EmulatedTransport`` imports what it names.

Modules: ``transport`` (the :class:`Transport` and :class:`Handle` protocols, torch's own P2P),
``records`` (message records), ``clock`` (the pipeline's common clock), ``groups`` (CPU groups for
small collectives, network interfaces), ``scope`` (swap torch's ``_batch_p2p`` for one step),
``recorded`` (torch P2P with records), ``pairs`` (the default path on one process group per link,
which can break and be re-made alone), ``waits`` and ``timeouts`` (every wait bounded by ``[comm]``).
One subpackage per mechanism: ``emulator/`` (links and DP collectives emulated on real groups),
``delegate/`` (the delegated data plane: shared memory + Gloo delegate processes), ``failover/``
(``auto``: default path, delegated on demand or on failure); ``machine/`` holds what they need of
the OS and the accelerator.

Use from a pipeline schedule (one stage per pp rank)::

    clock = sync_clock(pp_group)                      # once, collective over the pp group
    transport = EmulatedTransport(TorchTransport(clock.epoch), link_model, stage=pp_rank,
                                  num_stages=pp_size, group=pp_group, depth=2, epoch=clock.epoch)
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
    "P2P": "transport",
    "Transport": "transport",
    "TorchTransport": "transport",
    "TorchHandle": "transport",
    "LinkOp": "transport",
    "classify_op": "transport",
    "group_by_link": "transport",
    "use_transport": "scope",
    "active_transport": "scope",
    "CommonClock": "clock",
    "sync_clock": "clock",
    "cpu_group": "groups",
    "MessageRecord": "records",
    "CommTimeoutError": "records",
    "UndeliveredError": "records",
    "EmulatedTransport": "emulator.transport",
    "DelegateTransport": "delegate.transport",
    "DelegateError": "delegate.pool",
    "FailoverTransport": "failover.transport",
    "RecordedTransport": "recorded",
    "LinkGroups": "pairs",
    "LinkTransport": "pairs",
    "LinkFailedError": "pairs",
}

__all__ = sorted([*_EXPORTS, "LinkDownError"])


def __getattr__(name: str) -> Any:
    if name == "LinkDownError":  # defined with the link model, raised by the transports
        return importlib.import_module("titan_morph.pipelining.core.links").LinkDownError
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'titan_morph.comm' has no attribute {name!r}")
    return getattr(importlib.import_module(f"titan_morph.comm.{module}"), name)
