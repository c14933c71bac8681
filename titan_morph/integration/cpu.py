"""The one CPU adaptation of TorchTitan: applied only when CUDA is absent, before torchtitan loads.

TorchTitan 0.2.2 picks ``device_type = torch._utils._get_available_device_type() or "cuda"``
at import time (``torchtitan/tools/utils.py``), so on a CPU-only host it would try CUDA. We make
that probe answer ``"cpu"`` (whose default distributed backend is gloo) and give ``torch.cpu`` the
few device-module calls TorchTitan makes (memory statistics, device name/properties, an integer
``current_device`` for ``barrier(device_ids=...)``). With CUDA present nothing is changed.
"""

import os
from types import SimpleNamespace
from typing import Any

import torch

_applied = False  # process-wide: the adaptation patches torch itself, once per process


def cuda_absent() -> bool:
    """True when no usable CUDA device exists (the only case we adapt)."""
    return not torch.cuda.is_available()


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 34


def adapt_torchtitan_to_cpu() -> bool:
    """Adapt when CUDA is absent; returns whether the adaptation is active. Idempotent.

    Must run before ``torchtitan.tools.utils`` is imported (``titan_morph.train`` does it first).
    """
    global _applied
    if _applied:
        return True
    if not cuda_absent():
        return False
    import sys

    if "torchtitan.tools.utils" in sys.modules:
        raise RuntimeError(
            "titan_morph's CPU adaptation must run before torchtitan is imported; "
            "start training with `python -m titan_morph.train`"
        )

    import torch._utils as tu

    original = tu._get_available_device_type

    def _device_type() -> str | None:
        return original() or "cpu"

    # TorchTitan reads this probe at import time and has no option for it: the one patch of torch here.
    tu._get_available_device_type = _device_type

    cpu: Any = torch.cpu  # the device-module calls TorchTitan makes, which torch.cpu lacks
    props = SimpleNamespace(name="CPU", total_memory=_total_memory())
    cpu.get_device_name = lambda device=None: "CPU"
    cpu.get_device_properties = lambda device=None: props
    cpu.memory_stats = lambda device=None: {}
    cpu.reset_peak_memory_stats = lambda device=None: None
    cpu.empty_cache = lambda: None
    cpu.current_device = lambda: 0
    _applied = True
    return True


def adapt_fsdp_to_gloo(module: Any) -> int:
    """FSDP2 on gloo: reduce gradients with a plain SUM. Returns the FSDP modules changed.

    FSDP2 reduce-scatters gradients with ``ReduceOp.PREMUL_SUM`` (its divide factor folded into the
    reduction), which gloo refuses. ``set_force_sum_reduction_for_comms(True)`` makes it reduce
    with SUM and apply the factor before/after instead; TorchTitan sets the divide factor to 1
    (the loss is already normalised by the global token count), so the result is the same sum.
    Only applied while the CPU adaptation is active: on GPUs NCCL runs PREMUL_SUM unchanged.
    """
    if not _applied:
        return 0
    from torch.distributed.fsdp import FSDPModule

    changed = 0
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.set_force_sum_reduction_for_comms(True)
            changed += 1
    return changed
