"""use_transport routes torch's pipeline runtime P2P through a Transport and always restores it."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from tests.launch import run_ranks
from tests.torch_release import warmup_messages

MICROBATCHES = 4


class _Recording:
    """A minimal in-process transport: records the batches it is given."""

    def __init__(self) -> None:
        self.batches: list[tuple[list, str | None]] = []

    def batch_p2p(self, ops, desc=None):
        self.batches.append((list(ops), desc))
        return []

    def close(self) -> None:
        pass


def test_swap_restore_nesting_and_errors():
    from torch.distributed.pipelining import schedules

    from titan_morph.comm import P2P, TorchTransport, Transport, active_transport, use_transport

    original = schedules._batch_p2p
    a, b = _Recording(), _Recording()
    assert isinstance(a, P2P) and not isinstance(a, Transport) and isinstance(TorchTransport(), Transport)
    with use_transport(a):
        assert schedules._batch_p2p is not original and active_transport() is a
        schedules._batch_p2p([], desc="fwd_send")  # looked up at call time, as the runtime does
        with use_transport(a):  # re-entry with the same transport nests
            schedules._batch_p2p([])
        assert schedules._batch_p2p is not original
        with pytest.raises(RuntimeError, match="already active"):
            with use_transport(b):
                pass
        assert active_transport() is a
    assert schedules._batch_p2p is original and active_transport() is None
    assert [d for _, d in a.batches] == ["fwd_send", None] and b.batches == []

    with pytest.raises(ValueError, match="boom"):
        with use_transport(b):
            raise ValueError("boom")
    assert schedules._batch_p2p is original and active_transport() is None
    with pytest.raises(TypeError, match="batch_p2p"):
        with use_transport(object()):  # type: ignore[arg-type]
            pass
    assert schedules._batch_p2p is original


def test_import_is_light():
    code = "import sys, threading, titan_morph.comm as c; assert 'torch' not in sys.modules; "
    code += "assert threading.active_count() == 1; assert 'EmulatedTransport' in c.__all__"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class _Counting:
    """A real transport wrapper: counts ops per (link, direction, send/recv), then uses torch."""

    def __init__(self, stage: int, num_stages: int) -> None:
        from titan_morph.comm import TorchTransport

        self.inner, self.stage, self.num_stages = TorchTransport(), stage, num_stages
        self.counts: Counter = Counter()

    def batch_p2p(self, ops, desc=None):
        from titan_morph.comm import classify_op

        for op in ops:
            lo = classify_op(op, self.stage, self.num_stages)
            self.counts[(lo.link, lo.direction, "send" if lo.is_send else "recv")] += 1
        return self.inner.batch_p2p(ops, desc)

    def close(self) -> None:
        self.inner.close()


class _Failing(_Counting):
    def batch_p2p(self, ops, desc=None):
        raise RuntimeError("injected transport failure")


def _pipeline(rank: int, world: int, schedule_name: str, kinds: list[str]) -> dict:
    """One training step of a tiny ``world``-stage MLP per transport kind (fresh model each time)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, schedules

    from titan_morph.comm import EmulatedTransport, TorchTransport, sync_clock, use_transport
    from titan_morph.comm.transport import _torch_batch_p2p
    from titan_morph.pipelining.core.links import StaticDelays

    out = {}
    for kind in kinds:
        torch.manual_seed(0)
        full = [nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(world)]
        stage = PipelineStage(full[rank], stage_index=rank, num_stages=world, device=torch.device("cpu"))
        cls = getattr(schedules, schedule_name)
        stages = [stage] if issubclass(cls, schedules.PipelineScheduleMulti) else stage
        sched = cls(stages, MICROBATCHES, loss_fn=nn.functional.mse_loss)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)

        def step():
            losses: list = []
            if rank == 0:
                sched.step(x)  # noqa: B023
            else:
                sched.step(target=y, losses=losses)  # noqa: B023
            return [float(v.detach()) for v in losses], [p.grad.clone() for p in full[rank].parameters()]  # noqa: B023

        if kind == "none":
            losses, grads = step()
            out[kind] = (losses, grads, {})
        elif kind == "failing":
            try:
                with use_transport(_Failing(rank, world)):
                    step()
            except RuntimeError as e:
                assert "injected transport failure" in str(e)
            out[kind] = schedules._batch_p2p is _torch_batch_p2p
        else:
            if kind == "counting":
                transport = _Counting(rank, world)
            else:
                model = StaticDelays((10.0,) * (world - 1), (20.0,) * (world - 1))
                transport = EmulatedTransport(
                    TorchTransport(), model, stage=rank, num_stages=world, depth=2, epoch=sync_clock().epoch
                )
            with use_transport(transport):
                losses, grads = step()
            transport.close()
            if kind == "counting":
                counts = dict(transport.counts)
            else:  # every emulated message was delivered and recorded
                assert all(r.status == "done" for r in transport.records() if r.side == "recv")
                counts = dict(Counter((r.link, r.direction, r.side) for r in transport.records()))
            out[kind] = (losses, grads, counts)
        dist.barrier()
    return out


def _expected_counts(rank: int, world: int) -> dict:
    """Per (link, direction, side) of this rank: one op per microbatch, and torch's warm-up where
    it sends one through ``_batch_p2p`` (torch 2.11): a transport carries every P2P op of a step."""
    m, c = MICROBATCHES + warmup_messages(), {}
    if rank + 1 < world:
        c.update({(rank, "fwd", "send"): m, (rank, "bwd", "recv"): m})
    if rank > 0:
        c.update({(rank - 1, "fwd", "recv"): m, (rank - 1, "bwd", "send"): m})
    return c


@pytest.mark.parametrize(
    "schedule_name, world", [("Schedule1F1B", 2), ("ScheduleInterleavedZeroBubble", 2), ("Schedule1F1B", 4)]
)
def test_runtime_routes_every_p2p_through_transport(schedule_name, world):
    """Counting and emulated transports see every op per link; losses and grads stay bit-identical."""
    import torch

    kinds = ["none", "counting", "emulated"]
    res = run_ranks(_pipeline, world, schedule_name, kinds, timeout=90)
    for rank, r in enumerate(res):
        plain = r["none"]
        for kind in ("counting", "emulated"):
            assert r[kind][2] == _expected_counts(rank, world), kind
            assert r[kind][0] == plain[0]  # identical losses
            assert all(torch.equal(a, b) for a, b in zip(r[kind][1], plain[1]))  # bit-identical grads


def test_swap_restored_after_exception_in_real_step():
    res = run_ranks(_pipeline, 2, "Schedule1F1B", ["failing"], timeout=60)
    assert all(r["failing"] for r in res)


def test_emulator_rejects_bad_settings_with_clear_errors():
    from titan_morph.comm import EmulatedTransport, TorchTransport
    from titan_morph.comm.timeouts import CommTimeouts
    from titan_morph.pipelining.core.links import StaticDelays

    def make(**kw):
        args = dict(stage=0, num_stages=2, depth=1, epoch=0.0)
        args.update(kw)
        return EmulatedTransport(TorchTransport(), StaticDelays((0.0,)), **args)

    with pytest.raises(ValueError, match="1 links but 3 stages need 2"):
        make(num_stages=3)
    with pytest.raises(ValueError, match=r"stage must be in 0\.\.1"):
        make(stage=2)
    with pytest.raises(ValueError, match="depth must be >= 1"):
        make(depth=0)
    with pytest.raises(ValueError, match=r"CommTimeouts.train_s must be a finite number of seconds > 0"):
        make(timeouts=CommTimeouts(train_s=float("inf")))
    with pytest.raises(RuntimeError, match="needs torch.distributed to be initialized"):
        make()
