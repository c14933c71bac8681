"""Shared-memory slot buffers of the delegated data plane (paper §5.1).

A :class:`Segment` is one named POSIX shared-memory file (``/dev/shm/titan_morph_*``, so leftovers
are easy to spot) holding a ring of ``nslots`` equally sized data slots plus a header of per-slot
int64 flag words. The training process and one delegate map the same segment; a segment is made
once per message size (i.e. per tensor shapes/dtypes of a message) and reused for every later
message of that size, so the steady state allocates nothing.

Flag protocol (one writer per word, sequence numbers so no word is ever reset):

* send side — the trainer writes the payload, then ``FILLED = seq + 1`` (on CUDA a stream-ordered
  device→host copy of that value, after the data copy on the same side stream); the delegate
  waits for it, puts the bytes on the wire, then writes ``FREED = seq + 1``. A slot is free when
  ``FREED`` equals the trainer's own host-side count of what it put there (``issued``; on CUDA the
  FILLED word itself lands later).
* receive side — the delegate receives into the slot, then writes ``READY = seq + 1``; the trainer
  copies out and writes ``CONSUMED = seq + 1``. A slot is free when ``CONSUMED == READY``.

Aligned 8-byte stores and loads are atomic and, on x86-64 (total store order), observed in program
order by the other process, which is what makes "data, then flag" safe without locks.

Message layout: the tensors of one message are packed back to back, each at a 64-byte aligned
offset (:func:`layout`), so dtype views of a slot are always aligned.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Sequence

import torch

from titan_morph.comm.machine.system import SHM_DIR, SHM_PREFIX, mapped_paths, shm_segments

PREFIX = SHM_PREFIX
ALIGN = 64
FLAG_WORDS = 8  # int64 words per slot header (one cache line)
FILLED = READY = 0  # written by the producer of the slot's data
FREED = CONSUMED = 1  # written by its consumer
NBYTES = 2  # payload size of the message in the slot (written before FILLED/READY)
PAGE = mmap.PAGESIZE
# cudaHostRegisterPortable: the page-locked range is usable from every CUDA context of the process,
# not only the one current on the registering thread (the reader thread and the training thread
# may differ in which context they made current first)
HOST_REGISTER_PORTABLE = 0x01
# cudaError_t values a host registration can return (names as in CUDA's driver_types.h)
CUDA_ERRORS = {
    1: "cudaErrorInvalidValue",
    2: "cudaErrorMemoryAllocation",
    3: "cudaErrorInitializationError",
    100: "cudaErrorNoDevice",
    201: "cudaErrorDeviceUninitialized",
    712: "cudaErrorHostMemoryAlreadyRegistered",
    713: "cudaErrorHostMemoryNotRegistered",
    801: "cudaErrorNotSupported",
}


DEFAULT_SLOTS = 8  # slots per ring: messages a delegate can hold in flight per direction


def align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


def header_bytes(nslots: int) -> int:
    """Bytes of a segment's flag words (whole pages)."""
    return align(nslots * FLAG_WORDS * 8, 4096)


def segment_bytes(slot_bytes: int, nslots: int) -> int:
    """Size of a segment of ``nslots`` slots for messages of ``slot_bytes`` bytes (its file in /dev/shm)."""
    return header_bytes(nslots) + nslots * align(max(int(slot_bytes), 1))


def layout(tensors: Sequence[torch.Tensor]) -> tuple[list[int], int]:
    """Byte offset of each tensor in a packed message and the message's total size."""
    offsets, off = [], 0
    for t in tensors:
        offsets.append(off)
        off = align(off + t.numel() * t.element_size())
    return offsets, off


def _view(slot: torch.Tensor, off: int, t: torch.Tensor) -> torch.Tensor:
    """``slot[off:]`` seen as a contiguous tensor with ``t``'s dtype and shape."""
    n = t.numel() * t.element_size()
    return slot[off : off + n].view(t.dtype).view(t.shape)


def pack(slot: torch.Tensor, tensors: Sequence[torch.Tensor], offsets: Sequence[int]) -> None:
    """Copy ``tensors`` (any dtype, any strides) into a host slot (CPU path)."""
    with torch.no_grad():
        for t, off in zip(tensors, offsets):
            if t.numel():
                _view(slot, off, t).copy_(t)


def unpack(
    slot: torch.Tensor, tensors: Sequence[torch.Tensor], offsets: Sequence[int], non_blocking: bool = False
) -> None:
    """Copy a packed slot into ``tensors`` (the receive buffers — leaves that may require grad, as
    the pipeline's are; any strides; CPU or device), as gloo's receive writes them: outside autograd."""
    with torch.no_grad():
        for t, off in zip(tensors, offsets):
            if t.numel():
                t.copy_(_view(slot, off, t), non_blocking=non_blocking)


class Segment:
    """A named shared-memory ring of ``nslots`` slots of ``slot_bytes`` each, plus flag words."""

    def __init__(self, name: str, slot_bytes: int, nslots: int, *, create: bool, where: str = "") -> None:
        if not name.startswith(PREFIX):
            raise ValueError(f"shared-memory segment names must start with {PREFIX!r}, got {name!r}")
        if nslots < 1:
            raise ValueError(f"a segment needs >= 1 slot, got {nslots}")
        self.name, self.slot_bytes, self.nslots = name, int(slot_bytes), int(nslots)
        self.where = where  # rank and link, for the errors of the CUDA calls on this segment
        self.path = os.path.join(SHM_DIR, name)
        self.stride = align(max(self.slot_bytes, 1))
        self.header = header_bytes(nslots)
        self.size = segment_bytes(self.slot_bytes, nslots)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, self.size)
            self._mm = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.owner = create
        self._words = memoryview(self._mm)[: nslots * FLAG_WORDS * 8].cast("q")
        self.data = torch.frombuffer(self._mm, dtype=torch.uint8)
        self._flag_tensor: torch.Tensor | None = None
        self.issued = [0] * nslots  # send side, trainer only: seq + 1 of the message last put in each slot
        self._pinned = False

    # -- flags -----------------------------------------------------------------------------
    def flag(self, slot: int, word: int) -> int:
        return self._words[slot * FLAG_WORDS + word]

    def set_flag(self, slot: int, word: int, value: int) -> None:
        self._words[slot * FLAG_WORDS + word] = value

    def flag_view(self, slot: int, word: int) -> torch.Tensor:
        """The flag word as a one-element int64 tensor (target of the CUDA stream-ordered write)."""
        if self._flag_tensor is None:
            self._flag_tensor = self.data[: self.nslots * FLAG_WORDS * 8].view(torch.int64)
        i = slot * FLAG_WORDS + word
        return self._flag_tensor[i : i + 1]

    def slot(self, i: int) -> torch.Tensor:
        """uint8 view of slot ``i``'s data."""
        start = self.header + i * self.stride
        return self.data[start : start + self.slot_bytes]

    def touch(self) -> None:
        """Fault every page of the mapping in now (one byte per page), so the first message through a
        slot does not pay the page faults: written on the creator's side (the pages get allocated),
        read on the other (a concurrent writer's data is left alone)."""
        pages = self.data[::PAGE]
        if self.owner:
            pages.zero_()
        else:
            int(pages.sum())

    # -- CUDA ------------------------------------------------------------------------------
    def _named(self, call: str) -> str:
        return f"{self.where + ': ' if self.where else ''}{call} of shared-memory segment {self.name} ({self.size} B)"

    def pin(self) -> None:
        """Page-lock the mapping for CUDA (``cudaHostRegister``, portable) so device↔host copies are
        async DMA from whichever thread and context issues them.

        A failed registration also sets CUDA's last error, which the next kernel-launch check would
        report as its own: it is cleared here, and the error is raised by name."""
        if self._pinned:
            return
        rc = int(torch.cuda.cudart().cudaHostRegister(self.data.data_ptr(), self.size, HOST_REGISTER_PORTABLE))  # type: ignore[no-untyped-call]
        if rc != 0:
            clear_cuda_error()
            raise CudaCallError(
                self._named("cudaHostRegister"),
                rc,
                ": this host memory is already page-locked (registered twice?)" if rc == 712 else "",
            )
        self._pinned = True

    def unpin(self) -> None:
        """Undo :meth:`pin` (``cudaHostUnregister``); a failure is raised by name, and the segment
        counts as unpinned either way (a second unregister could only fail again)."""
        if not self._pinned:
            return
        self._pinned = False
        rc = int(torch.cuda.cudart().cudaHostUnregister(self.data.data_ptr()))  # type: ignore[no-untyped-call]
        if rc != 0:
            clear_cuda_error()
            raise CudaCallError(self._named("cudaHostUnregister"), rc)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Unpin and unmap (best effort: views handed out keep the mapping alive until collected).
        The caller drains the device copies into and out of the segment first; a failed
        ``cudaHostUnregister`` is raised (:class:`CudaCallError`) after the mapping is released."""
        error: CudaCallError | None = None
        try:
            self.unpin()
        except CudaCallError as e:
            error = e
        self._flag_tensor = None
        self.data = None  # type: ignore[assignment]
        try:
            self._words.release()
            self._mm.close()
        except (BufferError, ValueError):
            pass
        if error is not None:
            raise error

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class CudaCallError(RuntimeError):
    """A CUDA runtime call that returned an error: ``what`` names rank, link and call; ``code`` is
    the ``cudaError_t``."""

    def __init__(self, what: str, code: int, hint: str = "") -> None:
        super().__init__(f"{what} failed: {cuda_error_name(code)} ({code}){hint}")
        self.code = code


def _libcudart() -> ctypes.CDLL | None:
    """The CUDA runtime library this process has loaded (torch's), or None."""
    for path in sorted(p for p in mapped_paths() if "libcudart.so" in p):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def clear_cuda_error() -> int:
    """Reset CUDA's last error (``cudaGetLastError``); returns the code it held (0 when none or no CUDA)."""
    lib = _libcudart()
    return 0 if lib is None else int(lib.cudaGetLastError())


def cuda_error_name(code: int) -> str:
    """The name of a ``cudaError_t`` (``cudaErrorHostMemoryAlreadyRegistered`` for 712)."""
    if code in CUDA_ERRORS:
        return CUDA_ERRORS[code]
    lib = _libcudart()
    if lib is not None:
        lib.cudaGetErrorName.restype = ctypes.c_char_p
        name: bytes | None = lib.cudaGetErrorName(ctypes.c_int(code))
        if name:
            return name.decode()
    return f"cudaError {code}"


def unlink_prefix(prefix: str) -> list[str]:
    """Remove every segment whose name starts with ``prefix`` (crash cleanup); returns the names."""
    if not prefix.startswith(PREFIX):
        raise ValueError(f"refusing to unlink segments outside the {PREFIX!r} namespace: {prefix!r}")
    removed = []
    for name in shm_segments(prefix):
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def leftovers(prefix: str = PREFIX) -> list[str]:
    """Names of existing segments starting with ``prefix``."""
    return sorted(shm_segments(prefix))
