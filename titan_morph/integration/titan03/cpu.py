"""The CPU adaptation for TorchTitan 0.3.0: 0.2.2's (:mod:`titan_morph.integration.cpu`) plus attention.

0.3.0 still picks its device at import time (``torchtitan/tools/utils.py``, read by name in a dozen
modules), and still asks the device module for names, memory statistics and ``current_device``:
the 0.2.2 adaptation covers all of it, so it is reused; only the advice given when torchtitan was
imported too early names 0.3.0's entry point.

New in 0.3.0: its language models attend with FlexAttention (document masks from the positions),
which has no backward on CPU, and it refuses ``sdpa`` by name. Without CUDA,
:func:`adapt_attention` swaps each FlexAttention of the model config for the SDPA module (causal,
no document masks: every sequence attends across its packed documents, as 0.2.2's sdpa did).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from titan_morph.integration.cpu import adapt_fsdp_to_gloo, cuda_absent

if TYPE_CHECKING:  # torchtitan loads after the adaptation
    from torchtitan.protocols.model import BaseModel

__all__ = ["adapt", "adapt_attention", "adapt_fsdp_to_gloo"]

ENTRY = "python -m titan_morph.integration.titan03.train --module titan_morph.configs --config <fn>"


def adapt() -> bool:
    """Adapt TorchTitan to CPU when CUDA is absent (before torchtitan loads); returns whether the
    adaptation is active. A torchtitan already loaded on a CPU-only host is one error naming the
    entry point that adapts first."""
    from titan_morph.integration import cpu

    if not cuda_absent() or cpu._applied:
        return cpu.adapt_torchtitan_to_cpu()
    if "torchtitan.tools.utils" in sys.modules:
        raise RuntimeError(
            f"titan_morph: on a host without CUDA, TorchTitan 0.3.0 must be adapted before it loads: start with {ENTRY}"
            " (or ./run_train.sh with TORCHTITAN=0.3.0)"
        )
    return cpu.adapt_torchtitan_to_cpu()


def adapt_attention(model_config: BaseModel.Config) -> int:
    """While the CPU adaptation is active: FlexAttention -> SDPA in ``model_config`` (in place).
    Returns the attention modules changed."""
    from titan_morph.integration import cpu

    if not cpu._applied:
        return 0
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention

    found = list(model_config.traverse(FlexAttention.Config))
    for _, _, parent, attr in found:  # the root (no parent) is a model, never an attention module
        if isinstance(parent, list) and isinstance(attr, int):
            parent[attr] = ScaledDotProductAttention.Config()
        elif parent is not None and isinstance(attr, str):
            setattr(parent, attr, ScaledDotProductAttention.Config())
    return len(found)
