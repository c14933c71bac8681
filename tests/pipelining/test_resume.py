"""Resumed timings (timeline.time_codes's ``resume``, tabu.tail_state's ``resume``) and the
search's seeds from plain codes give exactly what a full run gives: the search's plans depend only
on its inputs and its iteration count, so a shortcut may save work but never change a number."""

from __future__ import annotations

import random

import pytest

from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.reference.instances import random_instance
from titan_morph.pipelining.schedules.baselines import SCHEDULES, V_SCHEDULES, build_plain, plain_codes, split_codes
from titan_morph.pipelining.search import tabu
from titan_morph.pipelining.search.builders import split_fused
from titan_morph.pipelining.search.score import Topology
from titan_morph.pipelining.timing.timeline import time_codes, to_codes


def _models() -> list[CostModel]:
    rng = random.Random(11)
    out = [random_instance(rng, s_range=(2, 6), n_mult=(1, 3)) for _ in range(10)]
    out.append(CostModel.uniform(4, 8, 10.0, 0.0, 5.0, delays=[0.0, 3.0, 0.0]))  # zero-length ops
    out.append(CostModel.uniform(6, 9, 5.0, 5.0, 5.0, delays=[0.0, 20.0], stages_per_rank=2, memory=7))
    return out


def test_resumed_timing_equals_a_full_run_after_each_move() -> None:
    """Every valid critical-block move, timed forwards from the move's timeline and its tails
    walked from the tails before it, gives the full run's times and tails bit for bit."""
    checked = sum(_check_moves(model) for model in _models())
    assert checked > 50


def _check_moves(model: CostModel) -> int:
    name = "pipemorph" if model.stages_per_rank == 1 else "pipemorph-v"
    codes = to_codes(split_fused(build_plain(name, model).orders), model)
    delays = (model.delays, model.delays)
    topo = Topology(model)
    tl = time_codes(model, codes, delays=delays, detail=True)
    dur = tabu.durations_of(model, codes)
    state = tabu.tail_state(codes, dur, delays, model.microbatches, topo)
    caps = [model.budget(r) for r in range(model.ranks)]
    checked = 0
    for s, a, b in tabu.critical_blocks(codes, tl, topo):
        for i, j in tabu.block_insertions(a, b):
            moved = tabu.move(codes[s], i, j)
            if not tabu.stage_ok(moved, caps[s]):
                continue
            trial = codes[:]
            trial[s] = moved
            full = time_codes(model, trial, delays=delays, detail=True)
            resumed = time_codes(model, trial, delays=delays, detail=True, resume=(tl, s, min(i, j)))
            assert (resumed.makespan, resumed.start, resumed.end, resumed.ready, resumed.blocked, resumed.stuck) == (
                full.makespan,
                full.start,
                full.end,
                full.ready,
                full.blocked,
                full.stuck,
            )
            if full.stuck is not None:
                continue
            trial_dur = dur[:]
            trial_dur[s] = tabu.move(dur[s], i, j)
            want = tabu.tail_state(trial, trial_dur, delays, model.microbatches, topo)
            got = tabu.tail_state(trial, trial_dur, delays, model.microbatches, topo, (state, s, min(i, j), max(i, j)))
            assert got[:2] == want[:2]
            checked += 1
    return checked


def test_plain_codes_are_the_builders_orders() -> None:
    """The search's baseline seeds (plain codes, fused B split) are the builders' plans as codes."""
    rng = random.Random(3)
    models = [random_instance(rng, s_range=(2, 5), n_mult=(1, 3)) for _ in range(6)]
    models.append(CostModel.uniform(8, 5, 10.0, 10.0, 10.0, stages_per_rank=2))
    for model in models:
        for name in V_SCHEDULES if model.stages_per_rank == 2 else SCHEDULES:
            try:
                plan = build_plain(name, model)
            except ValueError:
                with pytest.raises(ValueError):
                    plain_codes(name, model)
                continue
            _, codes, fused = plain_codes(name, model)
            assert (split_codes(codes) if fused else codes) == to_codes(split_fused(plan.orders), model)
