"""The link emulator under a rate (links.Bandwidth) on real gloo ranks, and the synthetic testbed's
padded messages: back-to-back sends leave one transmit time (size / rate) apart, the messages that
cross have the configured size, and a rate only delays (same losses and gradients)."""

from __future__ import annotations

import pytest

from tests.launch import run_ranks
from tests.torch_release import warmup_messages

SIZE = 16384  # bytes per message: 4096 float32
RATE = 20.0  # Mbit/s: 16384 x 8 / 20000 = 6.5536 ms per message
DELAY = 3.0
TAU = SIZE * 8 / (RATE * 1e3)
BURST = 6


def _burst(rank: int, world: int) -> list:
    """Rank 0 issues BURST messages back to back on link 0 (non-blocking link), rank 1 receives them."""
    import torch
    import torch.distributed as dist

    from titan_morph.comm import EmulatedTransport, TorchTransport, sync_clock
    from titan_morph.pipelining.core.links import Bandwidth, StaticDelays

    links = Bandwidth(StaticDelays((DELAY,)), (RATE,), ((SIZE, SIZE),))
    clock = sync_clock()
    emu = EmulatedTransport(TorchTransport(), links, stage=rank, num_stages=world, depth=None, epoch=clock.epoch)
    payloads = [torch.full((SIZE // 4,), float(i)) for i in range(BURST)]
    if rank == 0:
        handles = [emu.batch_p2p([dist.P2POp(dist.isend, t, 1)])[0] for t in payloads]
    else:
        buffers = [torch.empty(SIZE // 4) for _ in range(BURST)]
        handles = [emu.batch_p2p([dist.P2POp(dist.irecv, b, 0)])[0] for b in buffers]
    for h in handles:
        h.wait(30.0)
    if rank == 1:
        assert all(torch.equal(b, p) for b, p in zip(buffers, payloads))
    emu.close()
    return emu.records()


def test_back_to_back_messages_are_spaced_by_size_over_rate():
    sends, recvs = run_ranks(_burst, 2, timeout=90)
    sends = sorted((r for r in sends if r.side == "send"), key=lambda r: r.seq)
    assert len(sends) == BURST and all(r.nbytes == SIZE for r in sends)
    first = sends[0]
    assert first.planned == pytest.approx(first.accepted + TAU + DELAY)
    for prev, cur in zip(sends, sends[1:]):
        # each waits for the wire (issued well within one transmit time of the previous)
        assert cur.accepted < prev.planned - DELAY
        assert cur.planned - prev.planned == pytest.approx(TAU)
        assert cur.released >= cur.planned - 1e-6  # never handed on before its planned delivery
    received = {r.seq: r for r in recvs if r.side == "recv"}
    assert sorted(received) == list(range(BURST))
    assert all(received[s.seq].planned == pytest.approx(s.planned, abs=1e-3) for s in sends)  # the notice: 0.1 us


MICROBATCHES = 4
WIDTH = 8
PADDED = 4096  # bytes per message: the (2, 8) float32 activations are 64 B


def _training(rank: int, world: int) -> dict:
    """One step of a tiny 2-stage MLP: plain torch, and padded to PADDED bytes per message through
    the emulator under a rate. Returns losses, gradients and the emulated records."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from titan_morph.comm import EmulatedTransport, TorchTransport, sync_clock, use_transport
    from titan_morph.pipelining.core.links import Bandwidth, StaticDelays
    from titan_morph.runtime.testbed import pad_stage_messages

    out: dict = {}
    for kind in ("plain", "padded"):
        torch.manual_seed(0)
        parts = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(world)]
        stage = PipelineStage(parts[rank], stage_index=rank, num_stages=world, device=torch.device("cpu"))
        schedule = ScheduleGPipe(stage, MICROBATCHES, loss_fn=nn.functional.mse_loss)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(2 * MICROBATCHES, WIDTH, generator=g), torch.randn(2 * MICROBATCHES, WIDTH, generator=g)
        losses: list = []
        if kind == "plain":
            schedule.step(x) if rank == 0 else schedule.step(target=y, losses=losses)
            records: list = []
        else:
            pad_stage_messages(stage, PADDED)
            links = Bandwidth(StaticDelays((1.0,)), (RATE,), ((PADDED, PADDED),))
            emu = EmulatedTransport(
                TorchTransport(), links, stage=rank, num_stages=world, depth=2, epoch=sync_clock().epoch
            )
            with use_transport(emu):
                schedule.step(x) if rank == 0 else schedule.step(target=y, losses=losses)
            emu.close()
            records = emu.records()
        out[kind] = ([float(v) for v in losses], [p.grad.clone() for p in parts[rank].parameters()], records)
        dist.barrier()
    return out


def test_padded_messages_have_the_configured_size_and_change_no_loss_or_gradient():
    import torch

    for rank, result in enumerate(run_ranks(_training, 2, timeout=120)):
        plain_losses, plain_grads, _ = result["plain"]
        losses, grads, records = result["padded"]
        assert losses == plain_losses and (rank == 0 or len(losses) == MICROBATCHES)
        assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
        sends = sorted((r for r in records if r.side == "send"), key=lambda r: r.seq)
        warmup = warmup_messages()  # torch 2.11's dummy before the step: one float32, not a stage's output
        assert [(r.seq, r.nbytes) for r in sends[:warmup]] == [(0, 4)] * warmup
        sends = sends[warmup:]
        assert len(sends) == MICROBATCHES  # activations from rank 0, gradients from rank 1
        assert {(r.direction, r.nbytes) for r in sends} == {("fwd" if rank == 0 else "bwd", PADDED)}
        gaps = sorted(r.planned for r in sends)
        assert all(b - a >= PADDED * 8 / (RATE * 1e3) - 1e-9 for a, b in zip(gaps, gaps[1:]))


def test_a_message_size_below_the_activations_is_one_error_naming_the_key():
    import torch
    from torch import nn

    from titan_morph.runtime.testbed import pad_stage_messages

    class Stage:
        stage_index, is_first, is_last = 0, True, False
        submod = nn.Linear(WIDTH, WIDTH)

    stage = Stage()
    pad_stage_messages(stage, 32)
    with pytest.raises(ValueError, match=r"^morph.synthetic.message_kb: 0.03125 KiB per message, but stage 0 sends"):
        stage.submod(torch.zeros(2, WIDTH))
    with pytest.raises(RuntimeError, match="already padded"):
        pad_stage_messages(stage, 64)
