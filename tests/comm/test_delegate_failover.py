"""Failover (§5.3): a link goes down (``inf``) mid-run; traffic moves to the delegates on
both ranks without restart, nothing is lost or reordered, and the failover is counted."""

from __future__ import annotations

import math

import pytest

from tests.launch import run_ranks

STEPS = 5
PER_STEP = 3


def _payload(direction: str, step: int, i: int):
    import torch

    g = torch.Generator().manual_seed(step * 100 + i * 10 + (1 if direction == "bwd" else 0))
    return torch.randn(16, 8, generator=g)


def _failover(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm import EmulatedTransport, TorchTransport, sync_clock
    from titan_morph.comm.delegate.transport import DelegateTransport
    from titan_morph.comm.failover.transport import FailoverTransport
    from titan_morph.pipelining.core.stragglers import TraceDelays, TraceEvent

    links = TraceDelays(1, (TraceEvent(3, 0, math.inf),), key="step")  # link 0 down from step 3 on
    epoch = sync_clock().epoch  # one t=0 for both paths (FailoverTransport requires it)
    primary = EmulatedTransport(TorchTransport(), links, stage=rank, num_stages=world, depth=2, epoch=epoch)
    delegate = DelegateTransport(stage=rank, num_stages=world, links=links, epoch=epoch)
    bad = []
    with FailoverTransport(primary, delegate, stage=rank, num_stages=world) as tr:
        mine, theirs, peer = ("fwd", "bwd", 1) if rank == 0 else ("bwd", "fwd", 0)
        for step in range(1, STEPS + 1):
            tr.set_step(step)
            bufs = [torch.empty(16, 8) for _ in range(PER_STEP)]
            recvs = [tr.batch_p2p([dist.P2POp(dist.irecv, b, peer)])[0] for b in bufs]
            sends = []
            for i in range(PER_STEP):
                sends += tr.batch_p2p([dist.P2POp(dist.isend, _payload(mine, step, i), peer)])
            for i, h in enumerate(recvs):
                h.wait(30.0)
                if not torch.equal(bufs[i], _payload(theirs, step, i)):
                    bad.append(f"step {step} message {i} ({theirs})")
            for h in sends:
                h.wait(30.0)
            dist.barrier()
        routed, delegated = sorted(tr.router.routed), sorted(tr.delegated())
        return {
            "bad": bad,
            "failovers": tr.failovers,
            "log": tr.router.failover_log,
            "routed": routed,
            "delegated": delegated,
        }


def test_link_down_mid_run_fails_over_to_delegates() -> None:
    for r in run_ranks(_failover, 2, timeout=120):
        assert not r["bad"], r["bad"]
        assert r["failovers"] == 2, r["log"]  # its send direction and its receive direction
        assert r["routed"] == [(0, "bwd"), (0, "fwd")] and r["delegated"] == [0]
        assert all(step == 3 for step, *_ in r["log"]), r["log"]


COMMON = ("--training.steps", "5", "--training.seq_len", "32", "--metrics.log_freq", "1")
COMMON += ("--parallelism.pipeline_parallel_schedule", "PipeMorph")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """llama3 debug, PP=2, 5 steps, nothing injected: the losses every faulted run must reproduce."""
    from tests.launch import torchrun

    ref = torchrun(2, tmp_path_factory.mktemp("ref"), *COMMON)
    assert ref.returncode == 0, ref.tail()
    assert sorted(ref.losses()) == [1, 2, 3, 4, 5]
    return ref.losses()


FAULTS = {
    # the emulated NIC goes down (inf) from step 3 on: sends are refused at issue
    "down": ("--morph.inject.mode", "static", "--morph.inject.delays_ms", "inf"),
    # the link's real process group is torn down at step 3 (gloo errors on both ends)
    "break": ("--morph.inject.mode", "break", "--morph.inject.links", "0"),
}


@pytest.mark.slow  # a real job per fault; tests/comm/test_link_failover.py breaks real groups by default
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_training_survives_a_link_going_down(fault, reference, tmp_path, no_leftovers) -> None:
    """llama3 debug, PP=2, transport "auto": link 0 fails from step 3 on; all 5 steps complete with
    the losses of an undisturbed run and the log reports the failover on both ranks."""
    from tests.launch import torchrun

    run = torchrun(
        2, tmp_path / fault, *COMMON, "--morph.transport", "auto", *FAULTS[fault], "--morph.inject.start_step", "3"
    )
    assert run.returncode == 0, run.tail()
    assert run.losses() == reference
    for stage in (0, 1):
        assert f"failed on its default path at step 3 on stage {stage}" in run.output, run.tail()
    failovers = run.scalars("morph/failovers")  # TensorBoard shows it too
    assert failovers[1] == 0 and failovers[5] > 0, failovers
    no_leftovers(tmp_path)
