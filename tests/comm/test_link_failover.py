"""Real path failures under ``auto`` (FailoverTransport), on two real gloo ranks with real delegates.

The default path runs on per-link process groups (``LinkGroups``) that break for real (their sockets
shut down, both ends see gloo's own errors). Every scenario streams messages both ways over link 0
for several steps and checks every payload: no message may be lost, duplicated or reordered.

* ``break``: ``[morph.inject] mode = "break"`` on link 0 for steps 3-4: traffic fails over to the
  delegates at step 3 on both ranks, probes fail while the window lasts, then succeed, and the
  link moves back to a fresh default-path group;
* ``midstep``: the sender tears link 0 down after two messages of a step (some may have arrived,
  some not): both ranks replay the step on the delegates;
* ``fallback``: link 0 switched to the delegates; a send delegate is killed mid-step: the link falls
  back to the default path, and a later ``switch`` of it is refused on both ranks;
* ``standby``: a delegate of a link on the default path dies: reported, training goes on, and a
  later ``switch`` of the link is refused on both ranks;
* ``nopath``: the default path broke earlier, then a delegate dies: one error names both failures.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.comm.test_delegate_faults import children, process_name
from tests.launch import run_ranks

STEPS = 10
PER_STEP = 4


def _payload(direction: str, step: int, i: int):
    import torch

    g = torch.Generator().manual_seed(step * 1000 + i * 10 + (1 if direction == "bwd" else 0))
    return torch.randn(64, 8, generator=g)


def _kill(tr, name: str) -> None:
    (pid,) = [p for p in children(tr.delegate.proc.pid) if process_name(p) == name]
    os.kill(pid, signal.SIGKILL)


def _until_heard(tr, link: int, bound_s: float = 60.0) -> None:
    """Wait until this rank's failover transport heard that a delegate of ``link`` died."""
    deadline = time.monotonic() + bound_s
    while link not in tr.router.delegate_dead:
        assert time.monotonic() < deadline, f"the death of link {link}'s delegate was not heard within {bound_s} s"
        time.sleep(0.02)


def _stream(rank: int, world: int, scenario: str) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm import RecordedTransport, sync_clock
    from titan_morph.comm.delegate.transport import DelegateTransport
    from titan_morph.comm.failover.transport import FailoverTransport
    from titan_morph.comm.pairs import BreakPlan, LinkFailedError, LinkGroups, LinkTransport
    from titan_morph.comm.timeouts import CommTimeouts

    timeouts = CommTimeouts.fixed(30.0)
    epoch = sync_clock().epoch
    plan = {"break": BreakPlan(frozenset({0}), 3, 4), "nopath": BreakPlan(frozenset({0}), 2, 0)}.get(scenario)
    groups = LinkGroups(stage=rank, num_stages=world, namespace=f"test-{scenario}", timeouts=timeouts, breaks=plan)
    primary = RecordedTransport(LinkTransport(groups, epoch=epoch), stage=rank, num_stages=world, epoch=epoch)
    delegate = DelegateTransport(stage=rank, num_stages=world, epoch=epoch, strict=False, timeouts=timeouts)
    tr = FailoverTransport(
        primary,
        delegate,
        stage=rank,
        num_stages=world,
        pairs=groups,
        timeouts=timeouts,
        recover_probes=2,
        probe_interval_s=0.2,
    )
    mine, theirs, peer = ("fwd", "bwd", 1) if rank == 0 else ("bwd", "fwd", 0)
    out: dict = {"bad": [], "routed": {}, "error": ""}
    try:
        for step in range(1, STEPS + 1):
            tr.set_step(step)
            if scenario in ("fallback", "nopath") and step == (2 if scenario == "fallback" else 3):
                tr.switch([0])
            if scenario in ("fallback", "standby") and step == 6:
                tr.switch([0])  # refused on both ranks: the link's delegates failed
            if scenario == "standby" and step == 3 and rank == 0:
                _kill(tr, "tm-recv-l0b0")
                _until_heard(tr, 0)  # this rank heard of it before the next switch
            bufs = [torch.empty(64, 8) for _ in range(PER_STEP)]
            recvs = [tr.batch_p2p([dist.P2POp(dist.irecv, b, peer)])[0] for b in bufs]
            sends = []
            for i in range(PER_STEP):
                sends += tr.batch_p2p([dist.P2POp(dist.isend, _payload(mine, step, i), peer)])
                if i == 1 and scenario == "midstep" and step == 2 and rank == 0:
                    groups.break_link(0, "test: cable pulled after two messages")
                if i == 1 and step == 4 and rank == 1 and scenario in ("fallback", "nopath"):
                    _kill(tr, "tm-send-l0b0")
                    if scenario == "nopath":
                        _until_heard(tr, 0)  # reported before the next send: that send fails at issue
            for i, h in enumerate(recvs):
                h.wait()
                if not torch.equal(bufs[i], _payload(theirs, step, i)):
                    out["bad"].append(f"step {step} message {i} ({theirs})")
            for h in sends:
                h.wait()
            out["routed"][step] = sorted(tr.router.routed)
            out.setdefault("tags", {})[step] = groups.group(0).tag
            dist.barrier()
            if scenario == "break" and step >= 5:
                time.sleep(0.3)  # time for the probes
    except LinkFailedError as e:
        out["error"] = str(e)
    out.update(
        failovers=tr.failovers,
        fallbacks=tr.router.fallbacks,
        log=[(s, link, d) for s, link, d, _ in tr.router.failover_log],
        tag=groups.group(0).tag,
    )
    tr.close(timeout=5.0, drain=not out["error"])
    return out


def test_break_mode_fails_over_and_moves_back_after_good_probes() -> None:
    for r in run_ranks(_stream, 2, "break", timeout=240):
        assert not r["bad"] and not r["error"], r
        assert r["routed"][2] == [] and r["routed"][3] == [(0, "bwd"), (0, "fwd")], r["routed"]
        assert r["failovers"] == 2 and {s for s, *_ in r["log"]} == {3}, r
        assert r["routed"][STEPS] == [] and r["tag"].startswith("probe"), r  # back on a new group


def test_a_link_torn_down_mid_step_replays_the_step_on_the_delegates() -> None:
    for r in run_ranks(_stream, 2, "midstep", timeout=180):
        assert not r["bad"] and not r["error"], r
        assert r["routed"][1] == [] and r["routed"][2] == [(0, "bwd"), (0, "fwd")], r["routed"]
        assert r["failovers"] == 2, r


def test_a_dead_delegate_falls_back_to_the_default_path_mid_step() -> None:
    for r in run_ranks(_stream, 2, "fallback", timeout=180):
        assert not r["bad"] and not r["error"], r
        assert r["routed"][2] == r["routed"][3] == [(0, "bwd"), (0, "fwd")], r["routed"]
        # step 4 may end before a rank hears of the death (it then replays step 4 in step 5)
        assert all(r["routed"][s] == [] for s in range(5, STEPS + 1)), r["routed"]  # incl. the refused switch
        assert r["fallbacks"] == 2 and r["failovers"] == 0 and {s for s, *_ in r["log"]} == {4}, r


def test_a_dead_standby_delegate_keeps_its_link_on_the_default_path() -> None:
    for r in run_ranks(_stream, 2, "standby", timeout=180):
        assert not r["bad"] and not r["error"], r
        assert all(routed == [] for routed in r["routed"].values()), r["routed"]


@pytest.mark.parametrize("scenario", ["nopath"])
def test_no_path_left_is_one_error_naming_both_failures(scenario: str) -> None:
    for r in run_ranks(_stream, 2, scenario, timeout=180):
        assert not r["bad"], r
        msg = r["error"]
        assert "link 0 has no path left" in msg and "delegate path failed at step 4" in msg, msg
        assert "default path had failed before" in msg and "delegate #0 of link 0 (bwd" in msg, msg


# -- a data path that stalls instead of failing (a blackholed route) -------------------------------
# A two-stage toy pipeline trains for real: stage 0 sends MICRO activations over link 0, stage 1
# computes the loss and sends the gradients back, both take an SGD step, and a barrier ends the step.
# From step 3's second activation on, stage 0's sends on its first default-path group go nowhere:
# they "complete" on stage 0 (as small sends do into the socket buffer of a blackholed route) and
# are never posted on gloo, so stage 1's real gloo receive stalls.
STALL_STEPS, MICRO, STALL_TIMEOUT_S = 6, 4, 8.0  # [comm] bound 8 s: the stall bound is 2 s


class _Gone:
    """A send that went into a blackhole: done on the sender, never on the wire."""

    record = None
    due_s = None

    def __init__(self, op) -> None:
        self.ops = (op,)

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _blackholed(inner_cls, rank: int, tag: callable):
    """``inner_cls`` whose sends of stage 0 vanish once ``_blackholed.on`` is set (while ``tag()`` is "0")."""

    class Blackholed(inner_cls):
        on = False

        def batch_p2p(self, ops, desc=None):
            if not (self.on and rank == 0 and tag() == "0"):
                return super().batch_p2p(ops, desc)
            return [_Gone(op) for op in ops if op.op.__name__ == "isend"] + super().batch_p2p(
                [op for op in ops if op.op.__name__ != "isend"], desc
            )

    return Blackholed


def _toy_model():
    import torch

    torch.manual_seed(0)
    return torch.randn(8, 8) * 0.5, torch.randn(8, 2) * 0.5


def _toy_data(step: int, i: int):
    import torch

    g = torch.Generator().manual_seed(step * 100 + i)
    return torch.randn(3, 8, generator=g), torch.randn(3, 2, generator=g)


def _toy_reference_losses() -> list[float]:
    """The same training in one process: the losses of an undisturbed run."""
    import torch

    w0, w1 = (w.requires_grad_() for w in _toy_model())
    losses = []
    for step in range(1, STALL_STEPS + 1):
        total = 0.0
        for i in range(MICRO):
            x, y = _toy_data(step, i)
            h = torch.tanh(x @ w0)
            loss = ((h @ w1 - y) ** 2).mean()
            loss.backward()
            total += loss.item()
        with torch.no_grad():
            for w in (w0, w1):
                w -= 0.1 * w.grad
                w.grad = None
        losses.append(total)
    return losses


def _toy_train(rank: int, world: int, scenario: str) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm import RecordedTransport, sync_clock
    from titan_morph.comm.timeouts import CommTimeouts
    from titan_morph.comm.transport import TorchTransport

    timeouts = CommTimeouts.fixed(STALL_TIMEOUT_S)
    epoch = sync_clock().epoch
    out: dict = {"losses": [], "error": "", "failovers": 0, "stalls": 0, "routed": {}}
    if scenario == "default":
        inner = _blackholed(TorchTransport, rank, lambda: "0")(epoch)
        tr = RecordedTransport(inner, stage=rank, num_stages=world, epoch=epoch)
    else:
        from titan_morph.comm.delegate.transport import DelegateTransport
        from titan_morph.comm.failover.transport import FailoverTransport
        from titan_morph.comm.pairs import LinkGroups, LinkTransport

        groups = LinkGroups(stage=rank, num_stages=world, namespace=f"toy-{scenario}", timeouts=timeouts)
        inner = _blackholed(LinkTransport, rank, lambda: groups.group(0).tag)(groups, epoch=epoch)
        primary = RecordedTransport(inner, stage=rank, num_stages=world, epoch=epoch)
        delegate = DelegateTransport(stage=rank, num_stages=world, epoch=epoch, strict=False, timeouts=timeouts)
        tr = FailoverTransport(
            primary, delegate, stage=rank, num_stages=world, pairs=groups, timeouts=timeouts, recover_probes=2
        )
    w0, w1 = (w.requires_grad_() for w in _toy_model())
    peer = 1 - rank
    try:
        for step in range(1, STALL_STEPS + 1):
            tr.set_step(step)
            total = 0.0
            if rank == 0:
                hs, sent = [], []
                for i in range(MICRO):
                    if step == 3 and i == 1:
                        inner.on = scenario != "slow"
                        if scenario == "slow":  # a busy sender: longer than the stall bound, then it sends
                            time.sleep(3.0)
                    h = torch.tanh(_toy_data(step, i)[0] @ w0)
                    hs.append(h)
                    sent += tr.batch_p2p([dist.P2POp(dist.isend, h.detach().clone(), peer)])
                grads = [torch.empty(3, 8) for _ in range(MICRO)]
                handles = [tr.batch_p2p([dist.P2POp(dist.irecv, g, peer)])[0] for g in grads]
                for h, g, handle in zip(hs, grads, handles):
                    handle.wait()
                    h.backward(g)
                for handle in sent:
                    handle.wait()
            else:
                acts = [torch.empty(3, 8) for _ in range(MICRO)]
                handles = [tr.batch_p2p([dist.P2POp(dist.irecv, a, peer)])[0] for a in acts]
                sends = []
                for i, (a, handle) in enumerate(zip(acts, handles)):
                    handle.wait()
                    a.requires_grad_()
                    loss = ((a @ w1 - _toy_data(step, i)[1]) ** 2).mean()
                    loss.backward()
                    total += loss.item()
                    sends += tr.batch_p2p([dist.P2POp(dist.isend, a.grad, peer)])
                for s in sends:
                    s.wait()
            with torch.no_grad():
                for w in (w0, w1):
                    if w.grad is not None:
                        w -= 0.1 * w.grad
                        w.grad = None
            out["losses"].append(total)
            if scenario != "default":
                out["routed"][step] = sorted(tr.router.routed)
            dist.barrier()
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    if scenario != "default":
        out.update(failovers=tr.failovers, stalls=tr.stalls.stalls)
    tr.close(timeout=5.0, drain=not out["error"])
    return out


def test_a_stalled_data_path_fails_over_and_training_keeps_its_losses() -> None:
    ref = _toy_reference_losses()
    r0, r1 = run_ranks(_toy_train, 2, "stall", timeout=180, pg_timeout_s=STALL_TIMEOUT_S)
    assert not r0["error"] and not r1["error"], (r0, r1)
    assert r1["losses"] == pytest.approx(ref, rel=1e-6, abs=0.0), (r1["losses"], ref)
    assert r0["routed"][2] == [] and r0["routed"][3] == [(0, "bwd"), (0, "fwd")], r0["routed"]
    assert r0["failovers"] == r1["failovers"] == 2, (r0, r1)
    assert r1["stalls"] == 1 and r0["stalls"] == 0, (r0, r1)  # the receiver noticed; the sender was told


def test_a_busy_peer_is_no_stall_of_the_link() -> None:
    ref = _toy_reference_losses()
    r0, r1 = run_ranks(_toy_train, 2, "slow", timeout=180, pg_timeout_s=STALL_TIMEOUT_S)
    assert not r0["error"] and not r1["error"], (r0, r1)
    assert r1["losses"] == pytest.approx(ref, rel=1e-6, abs=0.0), (r1["losses"], ref)
    assert r0["failovers"] == r1["failovers"] == 0 and r0["stalls"] == r1["stalls"] == 0, (r0, r1)


def test_a_stalled_data_path_under_default_is_one_error_naming_rank_link_and_operation() -> None:
    r0, r1 = run_ranks(_toy_train, 2, "default", timeout=180, pg_timeout_s=STALL_TIMEOUT_S)
    assert r1["losses"] == pytest.approx(_toy_reference_losses()[:2], rel=1e-6, abs=0.0), r1
    err = r1["error"]
    assert err.startswith(
        "CommTimeoutError: stage 1 (rank 1): receive from stage 0 on link 0 (fwd), message 9 of step 3"
    ), err
    assert len(err.splitlines()) == 1 and f"Timed out waiting {STALL_TIMEOUT_S * 1000:.0f}ms" in err, err


# -- a send cut mid-write ---------------------------------------------------------------------------
# gloo fails the pending receives of a pair torn down under it, but not a send it was writing then:
# that send ends only at its bound. Stage 1 posts the receive of a big message and stops (SIGSTOP,
# resumed by a helper), so stage 0's write stalls on a full socket buffer; stage 0 tears link 0 down
# mid-write. Neither end's operation fails (stage 1's receive was cut mid-read): the stall check
# moves the link after a quarter of the [comm] bound, and each end's wait must end with that move
# (the delegates carry the message), not at the bound.
MIDWRITE_BOUND_S = 24.0  # the stall check moves the link after a quarter of it
MIDWRITE_ELEMS = 8 << 20  # 32 MiB of float32: far beyond a socket buffer


def _midwrite(rank: int, world: int) -> dict:
    import subprocess

    import torch
    import torch.distributed as dist

    from titan_morph.comm import RecordedTransport, sync_clock
    from titan_morph.comm.delegate.transport import DelegateTransport
    from titan_morph.comm.failover.transport import FailoverTransport
    from titan_morph.comm.pairs import LinkGroups, LinkTransport
    from titan_morph.comm.timeouts import CommTimeouts

    timeouts = CommTimeouts.fixed(MIDWRITE_BOUND_S)
    epoch = sync_clock().epoch
    groups = LinkGroups(stage=rank, num_stages=world, namespace="test-midwrite", timeouts=timeouts)
    primary = RecordedTransport(LinkTransport(groups, epoch=epoch), stage=rank, num_stages=world, epoch=epoch)
    delegate = DelegateTransport(stage=rank, num_stages=world, epoch=epoch, strict=False, timeouts=timeouts)
    tr = FailoverTransport(
        primary, delegate, stage=rank, num_stages=world, pairs=groups, timeouts=timeouts, recover_probes=1000
    )
    big = torch.arange(MIDWRITE_ELEMS, dtype=torch.float32)
    store = dist.distributed_c10d._get_default_store()
    out: dict = {}
    tr.set_step(1)
    dist.barrier()
    if rank == 1:
        got = torch.empty_like(big)
        (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, got, 0)])
        time.sleep(0.3)  # the receive is announced to the sender
        subprocess.Popen(["sh", "-c", f"sleep 2; kill -CONT {os.getpid()}"])
        store.set("midwrite/stopping", "1")
        os.kill(os.getpid(), signal.SIGSTOP)
        t0 = time.monotonic()
        h.wait()
        out["waited_s"] = time.monotonic() - t0
        out["equal"] = torch.equal(got, big)
    else:
        store.wait(["midwrite/stopping"])
        time.sleep(0.3)  # the peer stopped
        (h,) = tr.batch_p2p([dist.P2POp(dist.isend, big, 1)])
        time.sleep(0.5)  # the write stalls on the full socket buffer
        t0 = time.monotonic()
        groups.break_link(0, "test: cable pulled mid-write")
        h.wait()
        out["waited_s"] = time.monotonic() - t0
    out["routed"] = sorted(tr.router.routed)
    dist.barrier()
    tr.close(timeout=5.0)
    return out


def test_a_send_cut_mid_write_ends_with_the_move_not_at_the_bound() -> None:
    r0, r1 = run_ranks(_midwrite, 2, timeout=240, pg_timeout_s=2 * MIDWRITE_BOUND_S)
    assert r1["equal"], "the message re-sent over the delegates differs"
    assert r0["routed"] == r1["routed"] == [(0, "bwd"), (0, "fwd")], (r0, r1)
    # a quarter of the bound to the move, then the replay; gloo alone holds each wait to the bound
    assert r0["waited_s"] < MIDWRITE_BOUND_S / 2 and r1["waited_s"] < MIDWRITE_BOUND_S / 2, (r0, r1)
