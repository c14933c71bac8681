"""The delegates' CUDA paths on fakes (no GPU): portable, checked host registration; the reader
thread on the rank's device and surviving its own errors; copies drained before unmapping; the
/dev/shm check before any rank starts; a refused device copy named, of its own type."""

from __future__ import annotations

import logging
import os
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from tests.comm.fakes import PollingEvent
from titan_morph.comm.delegate import pool as delegate_pool
from titan_morph.comm.delegate import shm
from titan_morph.comm.delegate import worker as wire
from titan_morph.comm.delegate.pool import DelegateEnd, DelegatePool
from titan_morph.comm.delegate.shm import CudaCallError, Segment
from titan_morph.comm.delegate.slots import SlotPath


class FakeCudart:
    def __init__(self, register: int = 0, unregister: int = 0) -> None:
        self.rc = {"register": register, "unregister": unregister}
        self.calls: list[tuple] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.calls.append(("register", size, flags))
        return self.rc["register"]

    def cudaHostUnregister(self, ptr: int) -> int:
        self.calls.append(("unregister",))
        return self.rc["unregister"]


@pytest.fixture
def cudart(monkeypatch):
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    monkeypatch.setattr(shm, "clear_cuda_error", lambda: 0)
    return fake


def _segment(tag: str, where: str = "stage 1 (rank 1): receive delegate #0 of link 0") -> Segment:
    return Segment(f"titan_morph_test_{tag}_{os.getpid()}", 256, 2, create=True, where=where)


def test_registration_is_portable_and_unregistration_is_checked_by_name(cudart) -> None:
    seg = _segment("portable")
    try:
        seg.pin()
        assert cudart.calls == [("register", seg.size, shm.HOST_REGISTER_PORTABLE)]
        cudart.rc["unregister"] = 713
        with pytest.raises(
            CudaCallError,
            match=r"stage 1 \(rank 1\): receive delegate #0 of link 0: cudaHostUnregister of shared-memory segment "
            r".* failed: cudaErrorHostMemoryNotRegistered \(713\)",
        ):
            seg.close()
        assert seg.data is None and not seg._pinned  # unmapped all the same
    finally:
        seg.unlink()


def test_a_failed_registration_names_rank_link_and_call(cudart) -> None:
    cudart.rc["register"] = 1
    seg = _segment("badpin")
    try:
        with pytest.raises(CudaCallError, match=r"rank 1\).*link 0: cudaHostRegister .* cudaErrorInvalidValue \(1\)"):
            seg.pin()
    finally:
        seg.close()
        seg.unlink()


def _clock() -> SimpleNamespace:
    return SimpleNamespace(epoch=0.0, timeout_s=1.0, now_ms=lambda: 0.0, where=lambda: "stage 0 (rank 0)")


def test_drain_waits_for_send_and_receive_copies_and_gives_up_at_the_bound() -> None:
    path = SlotPath(_clock(), None, 2, torch.device("cpu"))  # type: ignore[arg-type]
    released: list[int] = []
    path._track_copy(PollingEvent(10**9))  # a send copy that never completes
    path.releases.add(PollingEvent(3), lambda: released.append(1))
    assert path.copies_pending() == 2
    assert not path.drain(0.05)
    assert released == [1]  # the receive copy completed and its slot was released on the way
    path._copies.clear()
    path._track_copy(PollingEvent(2))
    assert path.drain(1.0) and path.copies_pending() == 0


def _bare_pool(roles: list[DelegateEnd], *, device=None, drained: bool = True) -> DelegatePool:
    """A pool without delegates: the trainer-side bookkeeping only (its constructor rendezvouses)."""
    pool = DelegatePool.__new__(DelegatePool)
    pool.stage, pool.num_stages, pool.where = 1, 2, "stage 1 (rank 1)"
    pool.k, pool.slots, pool.strict = 1, 2, False
    pool._prepare_segment = lambda seg: seg.pin()
    pool._releases_pending, pool._poll_releases = (lambda: 0), (lambda: 0)
    pool._drain_copies, pool.device = (lambda bound: drained), device
    pool.cond = threading.Condition()
    pool.closed = pool.closing = False
    pool.first_error = None
    pool._listeners = []
    pool._root_exit, pool._status_r, pool._status_eof, pool._status_buf = None, None, False, b""
    pool._reader = pool._master = pool.proc = None
    pool.token, pool.prefix = "", f"titan_morph_test_pool_{os.getpid()}_"
    pool.roles, pool.delegates = roles, {}
    return pool


def _end(prefix: str) -> DelegateEnd:
    return DelegateEnd(0, "fwd", 0, False, prefix, 0, 0)


def test_the_reader_runs_on_the_rank_device_and_a_failed_pin_fails_its_delegate_by_name(cudart, monkeypatch) -> None:
    cudart.rc["register"] = 2
    bound: list[tuple[str, object]] = []
    monkeypatch.setattr(delegate_pool, "bind_device", lambda d: bound.append((threading.current_thread().name, d)))
    prefix = f"titan_morph_test_rd{os.getpid()}_"
    dg = _end(prefix)
    pool = _bare_pool([dg], device=torch.device("meta"))
    reports: list[str] = []
    pool.add_listener(lambda link, d, err: reports.append(str(err)))
    made = Segment(f"{prefix}d0", 128, 2, create=True)
    reader = threading.Thread(target=pool._read_loop, name="reader", daemon=True)
    reader.start()
    try:
        wire.write_record(dg.out_w, wire.NEWSEG, 0, 128, 2)
        wire.write_record(dg.out_w, wire.MSG, 5, 0, 0, 128, 1.0)  # later reports are still read
        deadline = time.monotonic() + 5
        while (dg.error is None or 5 not in dg.arrived) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bound == [("reader", torch.device("meta"))]
        assert dg.error is not None and reader.is_alive()
        assert "stage 1 (rank 1): receive delegate #0 of link 0 (fwd, peer stage 0)" in str(dg.error)
        assert "cudaHostRegister" in str(dg.error) and "cudaErrorMemoryAllocation (2)" in str(dg.error)
        assert reports == [str(dg.error)] and 5 in dg.arrived
        with pytest.raises(delegate_pool.DelegateError, match="cudaHostRegister"):
            pool.check(dg)
    finally:
        pool.closed, pool._status_eof = True, True
        reader.join(5)
        for fd in (dg.cmd_r, dg.cmd_w, dg.out_r, dg.out_w):
            os.close(fd)
        made.close()
        made.unlink()


def test_close_unmaps_only_after_the_device_copies_drained(cudart, caplog) -> None:
    for drained in (False, True):
        dg = _end(f"titan_morph_test_cl{os.getpid()}_")
        seg = _segment(f"close{drained}")
        seg.pin()
        cudart.rc["unregister"] = 4 if drained else 0
        dg.segments[0] = seg
        pool = _bare_pool([dg], drained=drained)
        with caplog.at_level(logging.WARNING, logger="titan_morph.comm.delegate.pool"):
            pool.stop(0.1, drain=False)
        try:
            if drained:
                assert seg.data is None
                assert "cudaHostUnregister" in caplog.text and "stage 1 (rank 1)" in caplog.text
            else:
                assert seg.data is not None and seg._pinned  # still mapped: a queued copy may touch it
                assert "still queued after the close bound" in caplog.text
        finally:
            seg.unlink()
            for fd in (dg.cmd_r, dg.out_w):
                os.close(fd)
        caplog.clear()


def test_the_shm_check_names_the_size_and_how_to_raise_it(monkeypatch, capsys) -> None:
    from titan_morph.integration import shm_space
    from titan_morph.integration.titan022 import launcher
    from titan_morph.integration.titan022.jobconfig import load

    job, settings = load("train_configs/debug_cpu.toml", ["--morph.transport", "auto"])
    message = launcher.message_bytes(job, settings)
    assert message is not None and message > 0
    needed = shm_space.delegate_shm_bytes(settings, message)
    rings = settings.num_links * 4 * settings.morph.delegates_per_link * settings.dp_degree
    assert needed == rings * shm.segment_bytes(message, shm.DEFAULT_SLOTS)
    shm_space.check_ring_space(settings, message, free=needed)  # fits: nothing to say
    # one node of two (2 of the 4 ranks) holds half of the ring ends
    half = shm_space.delegate_shm_bytes(settings, message, ranks_here=2)
    assert half == rings // 2 * shm.segment_bytes(message, shm.DEFAULT_SLOTS)
    shm_space.check_ring_space(settings, message, free=half, ranks_here=2)
    with pytest.raises(Exception, match="need"):
        shm_space.check_ring_space(settings, message, free=half, ranks_here=4)
    with pytest.raises(
        Exception, match=r"need .* in /dev/shm .* but only 1.0 KiB is free: raise it \(docker run --shm-size="
    ):
        shm_space.check_ring_space(settings, message, free=1024)
    # the synthetic testbed's message_kb is the message, whatever the model's width
    _, sized = load(
        "train_configs/synthetic_cpu.toml", ["--morph.transport", "auto", "--morph.synthetic.message_kb", "4096"]
    )
    big = shm_space.delegate_shm_bytes(sized, 4096 * 1024)
    shm_space.check_ring_space(sized, message, free=big)
    with pytest.raises(Exception, match="4.0 MiB each"):
        shm_space.check_ring_space(sized, message, free=big - 1)
    _, default = load("train_configs/debug_cpu.toml", ["--morph.transport", "default"])
    assert shm_space.delegate_shm_bytes(default, message) == 0

    monkeypatch.setattr(shm_space, "shm_free_bytes", lambda: 1024)
    monkeypatch.setattr(launcher.os, "execv", lambda *a: pytest.fail("a rank was started"))
    code = launcher.main(["run", "train_configs/debug_cpu.toml", "--morph.transport", "delegate"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: [morph] transport = 'delegate'")


def _illegal_access(*args, **kwargs):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def _copy_from_meta(*args, **kwargs):
    torch.empty(4).copy_(torch.empty(4, device="meta"))  # torch's own refusal: NotImplementedError


@pytest.mark.parametrize(
    "copy, kind, words",
    [
        (_illegal_access, RuntimeError, "CUDA error: an illegal memory access"),
        (_copy_from_meta, NotImplementedError, "meta"),
    ],
    ids=["cuda-error", "meta-tensor"],
)
def test_a_failed_device_copy_names_rank_link_and_message_keeps_its_type_and_leaves_the_slot(
    monkeypatch, copy, kind, words
) -> None:
    from titan_morph.comm.records import MessageRecord

    monkeypatch.setattr(SlotPath, "_cuda_pack", copy)
    dg = DelegateEnd(0, "fwd", 0, True, f"titan_morph_test_cp{os.getpid()}_", 1, 0)
    path = SlotPath(_clock(), SimpleNamespace(check=lambda dg: None), 2, torch.device("cpu"))  # type: ignore[arg-type]
    tensor = SimpleNamespace(is_cuda=True, numel=lambda: 4, element_size=lambda: 4)
    rec = MessageRecord("send", 0, "fwd", 7, 16, 1, 1, issued=0.0)
    try:
        with pytest.raises(
            kind,
            match=r"stage 0 \(rank 0\): send delegate #0 of link 0 \(fwd, peer stage 1\): device→host copy of "
            rf"message 7 into slot 0 .* failed: .*{words}",
        ) as err:
            path.put(dg, 0, [SimpleNamespace(tensor=tensor)], rec)  # type: ignore[list-item]
        assert type(err.value) is kind  # a caller still catches what torch raised
        assert dg.cursor == {0: 0} and path.copies_pending() == 0  # the slot is as it was
    finally:
        for seg in dg.segments.values():
            seg.close()
            seg.unlink()
        for fd in (dg.cmd_r, dg.cmd_w, dg.out_r, dg.out_w):
            os.close(fd)


def test_locate_keeps_the_exception_and_its_other_arguments() -> None:
    from titan_morph.comm.delegate.slots import _locate

    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB")
    _locate(err, "stage 1 (rank 1): receive delegate #0 of link 0")
    assert type(err) is torch.OutOfMemoryError
    assert (
        str(err) == "stage 1 (rank 1): receive delegate #0 of link 0: CUDA out of memory. Tried to allocate 64.00 MiB"
    )
    pair = RuntimeError("first", 2)
    _locate(pair, "here")
    assert pair.args == ("here: first", 2)
