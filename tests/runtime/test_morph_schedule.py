"""MorphSchedule on real gloo ranks: same losses/grads as torch's Schedule1F1B, re-planning works.

Each rank holds one ``PipelineStage`` of a tiny MLP (one stage per rank), on real gloo ranks.
"""

from __future__ import annotations

import pytest

from tests.launch import run_ranks

MICROBATCHES, BATCH, ITERS, LR, WIDTH = 8, 16, 3, 0.05, 16


def _build_model(stages: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(8 if s == 0 else WIDTH, WIDTH), nn.Tanh()) for s in range(stages - 1)]
    return nn.Sequential(*blocks, nn.Linear(WIDTH, 4))


def _data(it: int):
    import torch

    g = torch.Generator().manual_seed(100 + it)
    return torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 4, generator=g)


def _plans(mode: str, stages: int):
    """(initial plan, plan to switch to after iteration 0 or None) for a mode."""
    from titan_morph.pipelining.core.model import CostModel
    from titan_morph.pipelining.search.builders import build

    model = CostModel.uniform(stages, MICROBATCHES, 10.0, 10.0, 10.0)
    delayed = model.with_delays([0.0] * (stages - 2) + [40.0])
    if mode == "replan":
        return build("zb-h1", model), build("pipemorph", delayed)
    if mode == "mismatch":
        return build("zb-h1", model), None
    return build(mode, delayed if mode == "pipemorph" else model), None


def _worker(rank: int, world: int, mode: str) -> dict:
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import Schedule1F1B

    from titan_morph.runtime.schedule import MorphSchedule, PlanMismatchError
    from titan_morph.runtime.testbed import StageTimes, pad_stage_compute

    part = _build_model(world)[rank]
    stage = PipelineStage(part, rank, world, torch.device("cpu"))
    loss_fn = torch.nn.MSELoss()
    if mode == "torch-1f1b":
        schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    else:
        clock = None
        if mode == "padded":
            clock = pad_stage_compute(stage, StageTimes(4.0, 3.0, 2.0))
            first, switch = _plans("zb-h2", world)
        else:
            first, switch = _plans(mode, world)
        schedule = MorphSchedule([stage], MICROBATCHES, loss_fn, plan=first, device_clock=clock)
    record: dict = {"losses": [], "grads": [], "plan_ids": [], "ops": []}
    if mode == "mismatch":
        from titan_morph.pipelining.search.builders import build

        other = build("zb-h2", first.model) if rank == 0 else first
        try:
            schedule.set_plan(other)
        except PlanMismatchError as exc:
            record["mismatch"] = str(exc)
        return record
    opt = torch.optim.SGD(part.parameters(), lr=LR)
    for it in range(ITERS):
        if it == 1 and mode == "replan":
            schedule.set_plan(switch)
        x, y = _data(it)
        opt.zero_grad()
        losses: list = []
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y, losses=losses)
            record["losses"].append([loss.item() for loss in losses])
        else:
            schedule.step()
        record["grads"].append({n: p.grad.flatten().tolist() for n, p in part.named_parameters()})
        opt.step()
        if isinstance(schedule, MorphSchedule):
            rec = schedule.records[-1]
            record["plan_ids"].append(rec.plan_id)
            record["ops"].append([[k, mb, s, e] for k, mb, s, e in rec.op_ms])
    return record


def _run(mode: str, world: int) -> list[dict]:
    return run_ranks(_worker, world, mode, timeout=180, pg_timeout_s=60)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_morph_schedules_match_torch_1f1b_bit_for_bit(world: int) -> None:
    reference = _run("torch-1f1b", world)
    for mode in ("zb-h1", "zb-h2", "pipemorph", "replan"):
        got = _run(mode, world)
        assert got[-1]["losses"] == reference[-1]["losses"], f"{mode}: losses differ from Schedule1F1B"
        for r in range(world):
            assert got[r]["grads"] == reference[r]["grads"], f"{mode}: rank {r} gradients differ"
        if mode == "replan":
            ids = [rec["plan_ids"] for rec in got]
            assert all(i == ids[0] for i in ids), f"ranks ran different plans: {ids}"
            assert ids[0][0] != ids[0][1] == ids[0][2], f"set_plan did not take effect at step 1: {ids[0]}"


@pytest.mark.timeout(300)
def test_plan_mismatch_is_detected_on_every_rank() -> None:
    got = _run("mismatch", 2)
    for r, rec in enumerate(got):
        assert "different plans" in rec.get("mismatch", ""), f"rank {r} did not detect the mismatch: {rec}"


@pytest.mark.timeout(300)
def test_testbed_pads_each_op_to_its_configured_time() -> None:
    from titan_morph.runtime.testbed import DEFAULT_HIDE_HOST_GAP_MS as hide

    got = _run("padded", 2)
    targets = {"F": 4.0, "I": 3.0, "W": 2.0}
    for r, rec in enumerate(got):
        ops = rec["ops"][-1]
        assert len(ops) == 3 * MICROBATCHES, f"rank {r}: expected one F, I, W per microbatch, got {len(ops)}"
        # The device clock may start an op up to `hide` ms before it is called (host overhead and a
        # late wake-up hidden under the previous op), never more; the ops of a step never take less
        # than their device time (less what the first op hides). The excess is machine load.
        for kind, mb, start, end in ops:
            assert end - start >= targets[kind] - hide - 0.05, f"rank {r} {kind}{mb} took {end - start:.2f} ms"
        span = ops[-1][3] - ops[0][2]
        total = sum(targets[kind] for kind, *_ in ops)
        assert span >= total - hide - 0.05, f"rank {r}: ops span {span:.1f} ms < their device time {total} ms"
