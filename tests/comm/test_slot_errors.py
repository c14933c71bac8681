"""A device copy into or out of a slot that torch refuses keeps torch's exception type, with the
rank, link, message and slot put in front (callers catch what torch raised: a meta tensor's
``NotImplementedError``, ``torch.OutOfMemoryError``), and leaves the slot as it was. No GPU: the copy
is torch's real refusal to copy out of a meta tensor."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from titan_morph.comm.delegate.pool import DelegateEnd
from titan_morph.comm.delegate.slots import SlotPath, _locate
from titan_morph.comm.records import MessageRecord


def test_a_refused_copy_keeps_its_type_and_names_where(monkeypatch) -> None:
    def copy_from_meta(self, seg, slot, tensors, offsets, flag):
        torch.empty(4).copy_(torch.empty(4, device="meta"))  # torch: "Cannot copy out of meta tensor"

    monkeypatch.setattr(SlotPath, "_cuda_pack", copy_from_meta)
    clock = SimpleNamespace(epoch=0.0, timeout_s=1.0, now_ms=lambda: 0.0, where=lambda: "stage 0 (rank 0)")
    dg = DelegateEnd(0, "fwd", 0, True, f"titan_morph_test_meta{os.getpid()}_", 1, 0)
    path = SlotPath(clock, SimpleNamespace(check=lambda dg: None), 2, torch.device("cpu"))  # type: ignore[arg-type]
    tensor = SimpleNamespace(is_cuda=True, numel=lambda: 4, element_size=lambda: 4)
    rec = MessageRecord("send", 0, "fwd", 3, 16, 1, 1, issued=0.0)
    try:
        with pytest.raises(NotImplementedError) as err:
            path.put(dg, 0, [SimpleNamespace(tensor=tensor)], rec)  # type: ignore[list-item]
        assert type(err.value) is NotImplementedError
        assert str(err.value).startswith(
            "stage 0 (rank 0): send delegate #0 of link 0 (fwd, peer stage 1): device→host copy of message 3 "
        )
        assert "meta" in str(err.value)  # torch's own words follow
        assert dg.cursor == {0: 0} and path.copies_pending() == 0
    finally:
        for seg in dg.segments.values():
            seg.close()
            seg.unlink()
        for fd in (dg.cmd_r, dg.cmd_w, dg.out_r, dg.out_w):
            os.close(fd)


def test_locate_keeps_the_exception_and_its_other_arguments() -> None:
    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB")
    _locate(err, "stage 1 (rank 1): receive delegate #0 of link 0")
    assert type(err) is torch.OutOfMemoryError
    assert (
        str(err) == "stage 1 (rank 1): receive delegate #0 of link 0: CUDA out of memory. Tried to allocate 64.00 MiB"
    )
    pair = RuntimeError("first", 2)
    _locate(pair, "here")
    assert pair.args == ("here: first", 2)
