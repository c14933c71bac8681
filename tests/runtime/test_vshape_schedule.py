"""MorphSchedule with two stages per rank (the V) on real gloo ranks.

Each rank holds stages r and 2R-1-r of a tiny MLP, as torch's ZB-V places them. titan_morph's V
plans (ZB-V, DualPipeV and PipeMorph-V by the one generator, a re-plan between steps, and orders
through the link emulator) must give the losses and gradients of torch's own
``ScheduleZBVZeroBubble`` bit for bit, and the per-step exchange must report per-stage times.
torch 2.11's ZB-V warms P2P up with a dummy to the stage on its own rank (the V's turn), which gloo
cannot carry: there the reference's P2P goes through titan_morph's scope, which pairs that dummy
within the call and hands every other op to torch's own ``_batch_p2p``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial

import pytest

from tests.launch import run_ranks

# The same tiny MLP, data and training settings as the one-stage runtime test (2R blocks here).
from tests.runtime.test_morph_schedule import ITERS, LR, MICROBATCHES, _build_model, _data
from tests.torch_release import warmup_messages


def _plans(mode: str, ranks: int):
    """(initial plan, plan to switch to after iteration 0 or None) for a mode."""
    from titan_morph.pipelining.core.model import CostModel
    from titan_morph.pipelining.search.builders import build

    model = CostModel.uniform(2 * ranks, MICROBATCHES, 10.0, 10.0, 10.0, stages_per_rank=2)
    delayed = model.with_delays([0.0] * (ranks - 2) + [40.0])
    if mode == "replan":
        return build("zb-v", model), build("pipemorph-v", delayed, search=True, iterations=60)
    if mode in ("pipemorph-v", "emulated"):
        return build("pipemorph-v", delayed), None
    return build(mode, model), None


def _worker(rank: int, world: int, modes: tuple[str, ...]) -> dict[str, dict]:
    """Every mode in turn on the same ranks (one launch): its per-rank record."""
    return {mode: _run_mode(rank, world, mode) for mode in modes}


def _run_mode(rank: int, world: int, mode: str) -> dict:
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import ScheduleZBVZeroBubble

    from titan_morph.runtime.schedule import MorphSchedule

    stages_n = 2 * world
    model = _build_model(stages_n)
    indices = (rank, stages_n - 1 - rank)
    parts = [model[s] for s in indices]
    stages = [PipelineStage(part, s, stages_n, torch.device("cpu")) for part, s in zip(parts, indices)]
    loss_fn = torch.nn.MSELoss()
    p2p: Callable[[], AbstractContextManager[object]] = nullcontext
    if mode == "torch-zbv":
        schedule = ScheduleZBVZeroBubble(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
        if warmup_messages():  # torch 2.11 (module docstring)
            from titan_morph.comm.scope import use_transport
            from titan_morph.comm.transport import TorchTransport

            p2p = partial(use_transport, TorchTransport())
    else:
        first, switch = _plans(mode, world)
        transport = None
        if mode == "emulated":
            from titan_morph.comm.clock import sync_clock
            from titan_morph.comm.emulator.transport import EmulatedTransport
            from titan_morph.comm.transport import TorchTransport
            from titan_morph.pipelining.core.links import StaticDelays

            epoch = sync_clock(stages[0].group or torch.distributed.group.WORLD).epoch
            links = StaticDelays(tuple(first.model.delays))
            transport = EmulatedTransport(
                TorchTransport(epoch), links, stage=rank, num_stages=world, group=None, depth=2, epoch=epoch
            )
        schedule = MorphSchedule(stages, MICROBATCHES, loss_fn, plan=first, transport=transport)
    record: dict = {"losses": [], "grads": [], "plan_ids": [], "stage_times": [], "messages": []}
    params = [p for part in parts for p in part.parameters()]
    opt = torch.optim.SGD(params, lr=LR)
    for it in range(ITERS):
        if it == 1 and mode == "replan":
            schedule.set_plan(switch)
        x, y = _data(it)
        opt.zero_grad()
        losses: list = []
        with p2p():
            if rank == 0:  # the V's first and last stages both run on rank 0
                schedule.step(x, target=y, losses=losses)
                record["losses"].append([loss.item() for loss in losses])
            else:
                schedule.step()
        record["grads"].append(
            {
                f"{s}.{n}": p.grad.flatten().tolist()
                for s, part in zip(indices, parts)
                for n, p in part.named_parameters()
            }
        )
        opt.step()
        if isinstance(schedule, MorphSchedule):
            record["plan_ids"].append(schedule.records[-1].plan_id)
            record["stage_times"].append(
                {p.stage: {s: sorted(k) for s, k in p.stage_times().items()} for p in schedule.profiles}
            )
            record["messages"].append(sum(len(p.messages) for p in schedule.profiles))
    if isinstance(schedule, MorphSchedule):
        record["is_last"] = schedule.is_last_stage
        schedule.transport.close()
    return record


def _run(modes: tuple[str, ...], world: int) -> dict[str, list[dict]]:
    """Per mode, the per-rank records."""
    got = run_ranks(_worker, world, modes, timeout=300, pg_timeout_s=60)
    return {mode: [per_rank[mode] for per_rank in got] for mode in modes}


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "world, modes",
    [
        pytest.param(2, ("zb-v", "dualpipe-v", "pipemorph-v", "replan", "emulated"), id="pp2x2"),
        pytest.param(4, ("zb-v", "dualpipe-v", "pipemorph-v", "replan"), id="pp4x2", marks=pytest.mark.slow),
    ],
)
def test_v_plans_match_torch_zbv_bit_for_bit(world: int, modes: tuple[str, ...]) -> None:
    runs = _run(("torch-zbv", *modes), world)
    reference = runs["torch-zbv"]
    assert len(reference[0]["losses"][0]) == MICROBATCHES
    for mode in modes:
        got = runs[mode]
        assert got[0]["losses"] == reference[0]["losses"], f"{mode}: losses differ from ScheduleZBVZeroBubble"
        for r in range(world):
            assert got[r]["grads"] == reference[r]["grads"], f"{mode}: rank {r} gradients differ"
        assert [rec["is_last"] for rec in got] == [True] + [False] * (world - 1)
        ids = [rec["plan_ids"] for rec in got]
        assert all(i == ids[0] for i in ids), f"{mode}: ranks ran different plans: {ids}"
        if mode == "replan":
            assert ids[0][0] != ids[0][1] == ids[0][2], f"set_plan did not take effect at step 1: {ids[0]}"
        # The exchange carries every stage's own F/I/W times: rank r reports stages r and 2R-1-r.
        times = got[0]["stage_times"][-1]
        assert sorted(times) == list(range(world))
        for r, per_stage in times.items():
            assert sorted(per_stage) == sorted((r, 2 * world - 1 - r))
            assert all(kinds == ["F", "I", "W"] for kinds in per_stage.values()), per_stage
        if mode == "emulated":
            # Both legs cross the one link: per microbatch 2 activations and 2 gradients, each
            # stamped by its sender and its receiver; the last rank's local hop sends nothing.
            assert got[0]["messages"][-1] == 8 * MICROBATCHES
