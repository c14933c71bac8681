"""The device adaptations of TorchTitan, applied in each rank before torchtitan loads.

**CPU** (CUDA absent). TorchTitan 0.2.2 picks ``device_type = torch._utils._get_available_device_type()
or "cuda"`` at import time (``torchtitan/tools/utils.py``), so on a CPU-only host it would try CUDA. We
make that probe answer ``"cpu"`` (whose default distributed backend is gloo) and give ``torch.cpu`` the
few device-module calls TorchTitan makes (memory statistics, device name/properties, an integer
``current_device`` for ``barrier(device_ids=...)``).

**Ranks sharing a GPU** (a torchrun node with more ranks than CUDA devices, e.g. PP = 4 on one GPU).
NCCL refuses two ranks on one device, so: every rank uses device ``local rank % GPUs`` (TorchTitan
takes ``cuda:$LOCAL_RANK``, so ``LOCAL_RANK`` is set to that index), the default process group is
Gloo (CUDA's default backend is set to gloo before TorchTitan makes the group), the pipeline goes
over the delegated transport (:mod:`.transports`: Gloo has no point-to-point of device memory), and
the few blocking point-to-point calls torch's pipeline stage makes outside the schedule's batched
P2P (its shape inference's object lists) move host copies. Op times still come from CUDA events.

With one rank per GPU nothing is changed.
"""

import os
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
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
    """Adapt when CUDA is absent; returns whether the CPU adaptation is active. Idempotent. With CUDA,
    a torchrun rank of a node with more ranks than GPUs gets the shared-GPU adaptation instead
    (:func:`share_gpu`).

    Must run before ``torchtitan.tools.utils`` is imported (``titan_morph.train`` does it first).
    """
    global _applied
    if _applied:
        return True
    if not cuda_absent():
        share_gpu()
        return False

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


# --- ranks sharing a GPU ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SharedGPU:
    """This rank's place when a node's ranks share its GPUs."""

    ranks: int
    """Ranks on this node (torchrun's ``LOCAL_WORLD_SIZE``)."""
    devices: int
    """CUDA devices this node's ranks see."""
    index: int
    """The device this rank uses: its local rank modulo ``devices``."""

    def describe(self) -> str:
        return (
            f"{self.ranks} ranks share {self.devices} GPU(s) (this rank: cuda:{self.index}): the default process "
            "group is Gloo, the pipeline goes over the delegated transport, op times come from CUDA events"
        )


def ranks_share_gpus(ranks: int, cuda_devices: int) -> bool:
    """Whether ``ranks`` ranks of one node share GPUs: CUDA present, and fewer devices than ranks."""
    return 0 < cuda_devices < ranks


_shared: SharedGPU | None = None


def shared_gpu() -> SharedGPU | None:
    """This process's shared-GPU adaptation (None: one rank per GPU, or CPU)."""
    return _shared


def share_gpu(env: MutableMapping[str, str] | None = None, cuda_devices: int | None = None) -> SharedGPU | None:
    """In a torchrun rank whose node has more ranks than GPUs: the shared-GPU adaptation (module
    docstring); returns it, else None (and changes nothing). Idempotent. ``env`` and
    ``cuda_devices`` (default: ``os.environ``, torch's count) are for tests."""
    global _shared
    if _shared is not None:
        return _shared
    env = os.environ if env is None else env
    if "LOCAL_RANK" not in env or "LOCAL_WORLD_SIZE" not in env:
        return None  # not a torchrun rank (the launcher's own checks, a test)
    devices = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    ranks = int(env["LOCAL_WORLD_SIZE"])
    if not ranks_share_gpus(ranks, devices):
        return None
    if "torchtitan.tools.utils" in sys.modules:
        raise RuntimeError(
            "titan_morph's shared-GPU adaptation must run before torchtitan is imported; "
            "start training with `python -m titan_morph.train`"
        )
    import torch.distributed as dist

    shared = SharedGPU(ranks, devices, int(env["LOCAL_RANK"]) % devices)
    env["LOCAL_RANK"] = str(shared.index)  # TorchTitan's device is cuda:$LOCAL_RANK (written before any thread)
    # TorchTitan makes the default group with CUDA's default backend: Gloo takes two ranks on one device
    dist.Backend.default_device_backend_map["cuda"] = "gloo"
    _host_staged_p2p(dist)
    _shared = shared
    print(f"titan_morph: {shared.describe()}", file=sys.stderr, flush=True)
    return shared


def _on_gloo(group: Any) -> bool:
    import torch.distributed as dist

    try:
        return str(dist.get_backend(group)).lower() == "gloo"
    except (RuntimeError, ValueError):
        return False


def _host_staged_p2p(dist: Any) -> None:
    """torch's pipeline stage sends its shape inference's object lists (and, in later releases, a
    warm-up vote) with the blocking P2P calls, from the stage's device; Gloo moves host memory only.
    On a Gloo group these calls move host copies of CUDA tensors instead (the pipeline's own traffic
    goes through the transport, not here)."""

    def object_lists(original: Callable[..., Any]) -> Callable[..., Any]:
        def staged(object_list: list[Any], *args: Any, group: Any = None, device: Any = None, **kwargs: Any) -> Any:
            if device is not None and torch.device(device).type == "cuda" and _on_gloo(group):
                device = torch.device("cpu")
            return original(object_list, *args, group=group, device=device, **kwargs)

        staged.__titan_morph_host_staged__ = True  # type: ignore[attr-defined]
        return staged

    def send(original: Callable[..., Any]) -> Callable[..., Any]:
        def staged(tensor: torch.Tensor, *args: Any, group: Any = None, **kwargs: Any) -> Any:
            if tensor.is_cuda and _on_gloo(group):
                tensor = tensor.cpu()
            return original(tensor, *args, group=group, **kwargs)

        staged.__titan_morph_host_staged__ = True  # type: ignore[attr-defined]
        return staged

    def recv(original: Callable[..., Any]) -> Callable[..., Any]:
        def staged(tensor: torch.Tensor, *args: Any, group: Any = None, **kwargs: Any) -> Any:
            if not (tensor.is_cuda and _on_gloo(group)):
                return original(tensor, *args, group=group, **kwargs)
            host = torch.empty(tensor.shape, dtype=tensor.dtype)
            out = original(host, *args, group=group, **kwargs)
            tensor.copy_(host)
            return out

        staged.__titan_morph_host_staged__ = True  # type: ignore[attr-defined]
        return staged

    for name, wrap in (
        ("send_object_list", object_lists),
        ("recv_object_list", object_lists),
        ("send", send),
        ("recv", recv),
    ):
        setattr(dist, name, wrap(getattr(dist, name)))
