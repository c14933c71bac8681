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


def _stream(rank: int, world: int, scenario: str) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm import RecordedTransport, sync_clock
    from titan_morph.comm.delegate import DelegateTransport
    from titan_morph.comm.failover import FailoverTransport
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
                time.sleep(1.5)  # both ranks hear of it before the next switch
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
                        time.sleep(1.5)  # reported before the next send: that send fails at issue
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
