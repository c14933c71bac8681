"""Pipeline data plane: the Transport protocol, its runtime swap, and the link emulator.

Imports are lazy (PEP 562) so ``import titan_morph.comm`` loads neither torch.distributed nor
threads; ``from titan_morph.comm import EmulatedTransport`` imports what it names.
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
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'titan_morph.comm' has no attribute {name!r}")
    return getattr(importlib.import_module(f"titan_morph.comm.{module}"), name)
