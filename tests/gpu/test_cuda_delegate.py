"""The delegated data plane on CUDA: two gloo ranks sharing one GPU (``pytest -m gpu tests/gpu``).

Skipped without CUDA. Checked (correctness and ordering, no timings; the figures are
``benchmarks/bench_gpu.py``'s):

* bit identity of every dtype, non-contiguous and empty tensors, up to 64 MiB, slot reuse, K = 1, 2;
* a message mixing CPU and CUDA tensors travels intact, and a send that fails leaves the link as it was;
* a delayed send returns on the host before its delivery (the sender is never held by the link);
* a receive behind a busy device queue returns on the host before its copy has run (no
  ``synchronize``), and the slot is released once it has;
* ``auto`` fails a link whose NCCL default path is torn down over to the delegates mid-run with
  CUDA tensors, nothing lost (two GPUs: NCCL cannot pair two ranks on one; gloo P2P is CPU-only).
"""

from __future__ import annotations

import pytest
import torch

from tests.launch import run_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DTYPES = ("float32", "bfloat16", "float16", "int64")
MIB = 1 << 20


def _tensor(seed: int, dtype_name: str, shape: tuple[int, ...], device: str = "cuda"):
    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    t = (
        torch.randn(shape, generator=g).to(dtype)
        if dtype.is_floating_point
        else torch.randint(-(2**62), 2**62, shape, generator=g, dtype=torch.int64)
    )
    return t.to(device)


def _message(seq: int, big: bool, device: str = "cuda") -> list:
    dt = DTYPES[seq % len(DTYPES)]
    tensors = [
        torch.full((1,), seq, dtype=torch.int64, device=device),
        _tensor(seq, dt, (33, 17), device),
        _tensor(seq + 1, dt, (17, 33), device).t(),  # non-contiguous
        torch.empty((0, 5), device=device),
    ]
    if big:
        tensors.append(_tensor(seq + 2, "float32", ((16 << seq % 3) * MIB // 4,), device))  # 16, 32, 64 MiB
    return tensors


def _identity(rank: int, world: int, k: int) -> dict:
    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateTransport

    bad = []
    with DelegateTransport(stage=rank, num_stages=world, delegates_per_link=k, slots=2, device="cuda:0") as tr:
        for seq in range(6):
            expect = _message(seq, big=seq < 3)
            if rank == 0:
                for h in tr.batch_p2p([dist.P2POp(dist.isend, t, 1) for t in expect]):
                    h.wait()
            else:
                bufs = [torch.empty_like(t) for t in expect]
                bufs[2] = torch.empty(expect[2].shape[::-1], dtype=expect[2].dtype, device="cuda").t()
                (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, b, 0) for b in bufs])
                h.wait(120.0)
                torch.cuda.current_stream().synchronize()
                for i, (b, e) in enumerate(zip(bufs, expect)):
                    if not torch.equal(b.cpu().contiguous().view(torch.uint8), e.cpu().contiguous().view(torch.uint8)):
                        bad.append(f"message {seq} tensor {i} ({e.dtype}, {tuple(e.shape)})")
        dist.barrier()
    return {"bad": bad}


@pytest.mark.parametrize("k", [1, 2])
def test_bit_identical_every_dtype_and_layout_up_to_64_mib(k: int) -> None:
    for r in run_ranks(_identity, 2, k, timeout=300):
        assert not r["bad"], r["bad"]


def _mixed(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateTransport

    out: dict = {}
    with DelegateTransport(stage=rank, num_stages=world, device="cuda:0") as tr:
        cpu, gpu = torch.arange(10, dtype=torch.float32), torch.arange(10, 20, dtype=torch.float32, device="cuda")
        if rank == 0:
            broken = torch.empty(8, device="meta")
            try:
                tr.batch_p2p([dist.P2POp(dist.isend, gpu, 1), dist.P2POp(dist.isend, broken, 1)])
            except NotImplementedError:
                out["refused"] = True
            out["seq"] = dict(tr._send_seq)
            for h in tr.batch_p2p([dist.P2POp(dist.isend, cpu, 1), dist.P2POp(dist.isend, gpu, 1)]):
                h.wait()
        else:
            bufs = [torch.empty(10), torch.empty(10, device="cuda")]
            (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, b, 0) for b in bufs])
            h.wait(60.0)
            torch.cuda.synchronize()
            out["got"] = [b.cpu().tolist() for b in bufs]
        dist.barrier()
    return out


def test_a_message_of_cpu_and_cuda_tensors_travels_and_a_failed_one_leaves_no_trace() -> None:
    r0, r1 = run_ranks(_mixed, 2, timeout=120)
    assert r0["refused"] and r0["seq"] == {}, r0
    assert r1["got"] == [list(map(float, range(10))), list(map(float, range(10, 20)))], r1


def _delayed_and_busy(rank: int, world: int) -> dict:
    import time

    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateTransport
    from titan_morph.pipelining.core.links import StaticDelays

    out: dict = {}
    with DelegateTransport(stage=rank, num_stages=world, links=StaticDelays((60.0,)), device="cuda:0") as tr:
        x = torch.randn(16 * MIB // 4, device="cuda")
        dist.barrier()
        if rank == 0:
            (h,) = tr.batch_p2p([dist.P2POp(dist.isend, x, 1)])
            h.wait()
            out["returned"] = tr.now_ms()
            out["planned"] = tr.records()[-1].planned
        else:
            buf = torch.empty_like(x)
            (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, buf, 0)])
            a = torch.randn(4096, 4096, device="cuda")
            h.wait(60.0)  # first make sure the data is here, then queue work and consume again below
            out["arrived"] = tr.records()[-1].arrived
            (h2,) = tr.batch_p2p([dist.P2POp(dist.irecv, buf, 0)])
            time.sleep(0.5)  # the second copy arrives in the meantime (60 ms link)
            for _ in range(50):  # a busy queue: tens of ms of matmuls ahead of the copy
                a = a @ a / 4096
            t0 = time.monotonic()
            h2.wait(60.0)
            out["host_ms"] = (time.monotonic() - t0) * 1e3
            out["pending_after_wait"] = tr._releases.pending()
            torch.cuda.synchronize()
            tr._releases.poll()
            out["pending_after_sync"] = tr._releases.pending()
        if rank == 0:
            for h in tr.batch_p2p([dist.P2POp(dist.isend, x, 1)]):
                h.wait()
        dist.barrier()
    return out


def test_a_delayed_send_returns_before_delivery_and_unpack_does_not_wait_for_the_device() -> None:
    r0, r1 = run_ranks(_delayed_and_busy, 2, timeout=180)
    assert r0["returned"] < r0["planned"], r0  # the host was back before the link delivered
    assert r1["arrived"] >= r0["planned"] - 1.0, (r0, r1)
    assert r1["pending_after_wait"] >= 1, r1  # its slot is still held: the copy had not run yet
    assert r1["pending_after_sync"] == 0, r1


def _failover(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from titan_morph.comm import sync_clock
    from titan_morph.comm.delegate.transport import DelegateTransport
    from titan_morph.comm.failover.transport import FailoverTransport
    from titan_morph.comm.pairs import BreakPlan, LinkGroups, LinkTransport
    from titan_morph.comm.timeouts import CommTimeouts

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    epoch = sync_clock().epoch
    timeouts = CommTimeouts.fixed(60.0)
    # the default path really carries the CUDA tensors: NCCL, one group per direction of link 0,
    # torn down for real (the communicator aborted) from step 3 on
    pairs = LinkGroups(
        stage=rank,
        num_stages=world,
        namespace="gpu-failover",
        backend="nccl",
        timeouts=timeouts,
        device=device,
        breaks=BreakPlan(frozenset({0}), 3, 0),
    )
    primary = LinkTransport(pairs, epoch=epoch)
    delegate = DelegateTransport(
        stage=rank, num_stages=world, epoch=epoch, timeouts=timeouts, strict=False, device=device
    )
    bad = []
    mine, theirs, peer = ("fwd", "bwd", 1) if rank == 0 else ("bwd", "fwd", 0)
    with FailoverTransport(primary, delegate, stage=rank, num_stages=world, pairs=pairs, timeouts=timeouts) as tr:
        for step in range(1, 6):
            tr.set_step(step)
            bufs = [torch.empty(64, 64, device=device) for _ in range(3)]
            recvs = [tr.batch_p2p([dist.P2POp(dist.irecv, b, peer)])[0] for b in bufs]
            sends = []
            for i in range(3):
                t = _tensor(step * 10 + i + (100 if mine == "bwd" else 0), "float32", (64, 64), str(device))
                sends += tr.batch_p2p([dist.P2POp(dist.isend, t, peer)])
            for i, h in enumerate(recvs):
                h.wait(60.0)
                expect = _tensor(step * 10 + i + (100 if theirs == "bwd" else 0), "float32", (64, 64), str(device))
                if not torch.equal(bufs[i], expect):
                    bad.append(f"step {step} message {i}")
            for h in sends:
                h.wait(60.0)
            dist.barrier()
        return {"bad": bad, "failovers": tr.failovers, "routed": sorted(tr.router.routed)}


@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="the default path must carry CUDA tensors for real: gloo point-to-point is CPU-only, and NCCL "
    "cannot pair two ranks on one GPU, so this needs two GPUs",
)
def test_auto_fails_over_mid_run_with_cuda_tensors_on_nccl() -> None:
    for r in run_ranks(_failover, 2, timeout=240):
        assert not r["bad"] and r["failovers"] == 2 and r["routed"] == [(0, "bwd"), (0, "fwd")], r
