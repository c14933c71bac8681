"""Every plan computes the gradients of torch's 1F1B: a property test on real gloo ranks.

A tiny token model (an embedding, ``BLOCKS`` linear blocks, a head; the first stage's input needs
no gradient, as a language model's tokens) is split into pipeline stages on 4 ranks. Plans the
planner can produce -- the generator and the search under random stage times, delays, transmit
times and memory budgets, the robust plan, the baselines, the V schedules, partitions with layers
moved, another microbatch count -- are each switched in between steps of one running
``MorphSchedule``, and every step's gradients must equal the unsplit model's, microbatch by
microbatch (what 1F1B computes; torch's ``Schedule1F1B`` is run too and checked against it): per
parameter, the largest difference at most ``REL`` of the gradient's norm. Parameters do not move
(no optimizer step), so every step is compared with the same model on that step's batch.

The search's tabu moves once reordered the last stage's forwards, which torch's runtime files by
position: such a plan silently trained on swapped losses (issue 40). ``REGRESSION`` keeps the seeds
whose raw search output did so; plans that break the contract, or drop or repeat an op, are refused
before they run, and a step that ran other ops than its plan stops with one line.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.launch import run_ranks

WORLD = 4
BLOCKS = 8
VOCAB, WIDTH, CLASSES, SEQ, MB_SIZE = 16, 8, 5, 3, 2
REL = 1e-6
# (seed, microbatches) of random models whose search once reordered the last stage's forwards
REGRESSION = ((1, 8), (86, 8), (10, 12))


# ------------------------------------------------------------------------------ the model


def _layers() -> list[Any]:
    """The whole model as a list: embedding, BLOCKS blocks, head (same weights on every rank)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(BLOCKS)]
    return [nn.Embedding(VOCAB, WIDTH), *blocks, nn.Linear(WIDTH, CLASSES)]


def _stage_blocks(split: tuple[int, ...], stage: int) -> tuple[int, int]:
    """The blocks [first, last) of ``stage`` under ``split`` (blocks per stage)."""
    first = sum(split[:stage])
    return first, first + split[stage]


def _stage_module(layers: list[Any], split: tuple[int, ...], stage: int) -> Any:
    """Stage ``stage``'s module; its parameters named as in the whole model (``"3.0.weight"``)."""
    from torch import nn

    first, last = _stage_blocks(split, stage)
    names = ([0] if stage == 0 else []) + list(range(1 + first, 1 + last))
    names += [BLOCKS + 1] if stage == len(split) - 1 else []
    module = nn.Sequential()
    for i in names:
        module.add_module(str(i), layers[i])
    return module


def _batch(step: int, microbatches: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (microbatches * MB_SIZE, SEQ), generator=g)
    return tokens, torch.randint(0, CLASSES, (microbatches * MB_SIZE, SEQ), generator=g)


def _loss(logits: Any, target: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(0, 1))


def reference_grads(step: int, microbatches: int) -> dict[str, Any]:
    """The unsplit model's gradients on step ``step``'s batch: one backward per microbatch, summed
    (torch's 1F1B with ``scale_grads=False``, as TorchTitan runs it)."""
    import torch

    model = torch.nn.Sequential(*_layers())
    tokens, target = _batch(step, microbatches)
    for x, y in zip(tokens.chunk(microbatches), target.chunk(microbatches)):
        _loss(model(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


# ------------------------------------------------------------------------------ the ranks


def _run_step(schedule: Any, stages: list[Any], step: int, microbatches: int) -> None:
    tokens, target = _batch(step, microbatches)
    for st in stages:
        for p in st.submod.parameters():
            p.grad = None
    first = any(st.is_first for st in stages)
    last = any(st.is_last for st in stages)
    inputs = (tokens,) if first else ()
    schedule.step(*inputs, **({"target": target} if last else {}))


def _grads(stages: list[Any]) -> dict[str, Any]:
    return {n: p.grad.clone() for st in stages for n, p in st.submod.named_parameters()}


def _worker(rank: int, world: int, cases: list[dict[str, Any]]) -> list[Any]:
    """Run every case on this rank: per case a split, then steps, each with the plan to switch to
    (and its microbatch count); returns per case the per-step gradients of this rank's parameters,
    and what was refused where a case asks for it."""
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import BACKWARD_WEIGHT, Schedule1F1B

    from titan_morph.runtime.schedule import MorphSchedule

    out: list[Any] = []
    step = 0
    for case in cases:
        split, per_rank = case["split"], case["per_rank"]
        layers = _layers()
        stage_ids = [rank] if per_rank == 1 else [rank, 2 * world - 1 - rank]
        stages = [
            PipelineStage(_stage_module(layers, split, s), s, world * per_rank, torch.device("cpu")) for s in stage_ids
        ]
        got: dict[str, Any] = {"steps": [], "refused": [], "failed": []}
        if case.get("torch_1f1b"):
            n = case["steps"][0][1]
            schedule: Any = Schedule1F1B(stages[0], n_microbatches=n, loss_fn=_loss, scale_grads=False)
            _run_step(schedule, stages, step, n)
            got["torch_1f1b"] = (step, n, _grads(stages))
            step += 1
        first_plan, first_n = case["steps"][0]
        most = max(n for _, n in case["steps"])
        schedule = MorphSchedule(stages, first_n, _loss, plan=first_plan, scale_grads=False, max_microbatches=most)
        for plan, n in case["steps"]:
            if n != schedule._n_microbatches:
                schedule.set_microbatches(n, plan)
            else:
                schedule.set_plan(plan)
            _run_step(schedule, stages, step, n)
            got["steps"].append((step, n, plan.plan_id, _grads(stages)))
            step += 1
        for bad in case.get("refuse", ()):
            try:
                schedule.set_plan(bad)
            except (ValueError, RuntimeError) as exc:
                got["refused"].append(str(exc))
        if case.get("drop_op"):
            # the real runtime made to skip one op of its lowered program: the step must stop
            plan, n = case["steps"][-1]
            schedule.set_plan(plan)
            program = schedule.pipeline_order_with_comms[schedule.rank]
            drop = next(i for i, a in enumerate(program) if a.computation_type == BACKWARD_WEIGHT)  # sends nothing
            schedule.pipeline_order_with_comms[schedule.rank] = program[:drop] + program[drop + 1 :]
            try:
                _run_step(schedule, stages, step, n)
            except RuntimeError as exc:
                got["failed"].append(str(exc))
        out.append(got)
    return out


# ------------------------------------------------------------------------------ the plans


def _random_model(rng: random.Random, microbatches: int, per_rank: int = 1) -> Any:
    from titan_morph.pipelining.core.model import CostModel

    stages = WORLD * per_rank
    links = WORLD - 1
    return CostModel.uniform(
        stages,
        microbatches,
        [rng.uniform(1, 20) for _ in range(stages)],
        [rng.uniform(0.1, 25) for _ in range(stages)],
        [rng.uniform(1, 25) for _ in range(stages)],
        delays=[rng.choice([0.0, 0.0, 5.0, 20.0, 60.0]) for _ in range(links)],
        memory=rng.choice([None, WORLD * per_rank, 2 * WORLD * per_rank]),
        stages_per_rank=per_rank,
        transmit=[rng.choice([0.0, 0.0, 2.0, 8.0]) for _ in range(links)],
    )


def random_plans(seed: int, count: int, microbatches: int, *, per_rank: int = 1, iterations: int = 300) -> list[Any]:
    """``count`` plans of the families the planner builds, for random models (seeded)."""
    from titan_morph.pipelining.search.builders import build

    rng = random.Random(seed)
    names = ["pipemorph", "zb-h1", "zb-h2", "1f1b", "1f1b-iw"] if per_rank == 1 else ["pipemorph-v", "zb-v"]
    plans: list[Any] = []
    while len(plans) < count:
        model = _random_model(rng, microbatches, per_rank)
        name = rng.choice(names + [names[0]] * 3)  # mostly PipeMorph's
        how = rng.choice(["plain", "search", "search", "robust"]) if name.startswith("pipemorph") else "plain"
        try:
            if how == "plain":
                plans.append(build(name, model))
            elif how == "search":
                plans.append(build(name, model, search=True, iterations=iterations))
            else:
                base = model.delays
                samples = [[max(0.0, d + rng.gauss(0, 10)) for d in base] for _ in range(3)]
                plans.append(build(name, model, search=True, samples=samples, iterations=iterations // 3))
        except ValueError:  # the memory budget does not fit this family: draw again
            continue
    return plans


def partition_plans(seed: int, splits: list[tuple[int, ...]], microbatches: int) -> list[tuple[tuple[int, ...], Any]]:
    """Per split, the plan the re-partition's planner makes for random layer costs (with layers
    moved between stages: the splits differ)."""
    from titan_morph.pipelining.partition.planner import LayerCost, PartitionProblem, evaluate_split

    rng = random.Random(seed)
    out = []
    for split in splits:
        layers = tuple(
            LayerCost(f"b{i}", rng.uniform(1, 8), rng.uniform(0.1, 8), rng.uniform(1, 8)) for i in range(BLOCKS)
        )
        speeds = tuple(rng.choice([1.0, 1.0, 0.5]) for _ in range(WORLD))
        delays = tuple(rng.choice([0.0, 0.0, 20.0]) for _ in range(WORLD - 1))
        problem = PartitionProblem(layers, speeds, microbatches, delays=delays)
        out.append((split, evaluate_split(problem, split).plan))
    return out


def regression_plans() -> list[Any]:
    """The search's plans for the seeds that once reordered the last stage's forwards."""
    from titan_morph.pipelining.search.builders import build

    plans = []
    for seed, n in REGRESSION:
        model = _random_model(random.Random(seed), n).with_memory(None)
        plans.append(build("pipemorph", model, search=True, iterations=300))
    return plans


def cases_for(seed: int, plans_per_case: int) -> list[dict[str, Any]]:
    """The runs of one sweep: one stage per rank (torch's 1F1B first, random plans, the regression
    plans, another microbatch count, refusals, a dropped op), partitions, and the V."""
    even = (BLOCKS // WORLD,) * WORLD
    one = random_plans(seed, plans_per_case, 8)
    six = random_plans(seed + 1, 2, 6)
    steps = [(p, 8) for p in one[: len(one) // 2]] + [(six[0], 6), (six[1], 6)] + [(p, 8) for p in one[len(one) // 2 :]]
    steps += [(p, p.model.microbatches) for p in regression_plans()]
    cases: list[dict[str, Any]] = [
        {
            "split": even,
            "per_rank": 1,
            "torch_1f1b": True,
            "steps": steps,
            "refuse": bad_plans(steps[-1][0]),
            "drop_op": True,
        }
    ]
    for split, plan in partition_plans(seed, [(3, 2, 2, 1), (1, 2, 2, 3), (2, 3, 1, 2)], 8):
        cases.append({"split": split, "per_rank": 1, "steps": [(plan, 8), (one[-1], 8)]})
    v = random_plans(seed + 2, max(2, plans_per_case // 3), 8, per_rank=2)
    cases.append({"split": (1,) * (2 * WORLD), "per_rank": 2, "steps": [(p, 8) for p in v]})
    return cases


def bad_plans(plan: Any) -> list[Any]:
    """``plan`` with an op removed, with an op repeated, and with its last stage's first two microbatches swapped."""
    import dataclasses

    from titan_morph.pipelining.core.model import Op

    last = len(plan.orders) - 1
    orders = [list(o) for o in plan.orders]
    w = next(i for i, op in enumerate(orders[1]) if op.kind in ("W", "B"))
    removed = [*orders[:1], orders[1][:w] + orders[1][w + 1 :], *orders[2:]]
    repeated = [*orders[:2], orders[2] + [orders[2][-1]], *orders[3:]]
    swapped = [o[:] for o in orders]  # the last stage runs microbatch 1's ops where 0's were, and 0's for 1's
    swapped[last] = [Op(op.kind, {0: 1, 1: 0}.get(op.mb, op.mb), op.stage) for op in orders[last]]
    return [dataclasses.replace(plan, orders=tuple(tuple(o) for o in bad)) for bad in (removed, repeated, swapped)]


# ------------------------------------------------------------------------------ the checks


def check_sweep(results: list[list[dict[str, Any]]], cases: list[dict[str, Any]]) -> int:
    """Every step of every case against the reference; returns the number of plan-steps checked."""
    refs: dict[tuple[int, int], dict[str, Any]] = {}

    def ref(step: int, n: int) -> dict[str, Any]:
        if (step, n) not in refs:
            refs[(step, n)] = reference_grads(step, n)
        return refs[(step, n)]

    checked = 0
    for c, case in enumerate(cases):
        per_rank = [results[r][c] for r in range(WORLD)]
        if case.get("torch_1f1b"):
            step, n = per_rank[0]["torch_1f1b"][:2]
            merged = {k: v for got in per_rank for k, v in got["torch_1f1b"][2].items()}
            _assert_close(merged, ref(step, n), "torch's Schedule1F1B")
        for k, (plan, n) in enumerate(case["steps"]):
            step = per_rank[0]["steps"][k][0]
            merged = {name: g for got in per_rank for name, g in got["steps"][k][3].items()}
            _assert_close(merged, ref(step, n), f"case {c} step {step}: plan {plan.plan_id} ({plan.schedule}, N={n})")
            checked += 1
    return checked


def _assert_close(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    assert got.keys() == want.keys(), f"{what}: parameters {sorted(got)} != {sorted(want)}"
    for name, ref in want.items():
        diff = float((got[name] - ref).abs().max())
        assert diff <= REL * float(ref.norm()), f"{what}: {name} differs by {diff:.3g} (norm {float(ref.norm()):.3g})"


def _sweep(seed: int, plans_per_case: int) -> int:
    cases = cases_for(seed, plans_per_case)
    results = run_ranks(_worker, WORLD, cases, timeout=900, pg_timeout_s=120)
    checked = check_sweep(results, cases)
    first = [results[r][0] for r in range(WORLD)]
    for r, got in enumerate(first):
        assert len(got["refused"]) == 3, f"rank {r} ran a bad plan: refused only {got['refused']}"
        for text in got["refused"]:
            assert "\n" not in text, f"rank {r}: the refusal is not one line: {text!r}"
        removed, repeated, swapped = got["refused"]
        assert "missing [" in removed or "microbatch" in removed, removed
        assert "repeated" in repeated or "unexpected" in repeated, repeated
        assert "torch's runtime needs the last stage's forwards in microbatch order" in swapped, swapped
    failed = [text for got in first for text in got["failed"]]
    assert failed, "a step that skipped an op of its plan was not stopped"
    assert all("the step's gradients are not those of the plan" in t and "\n" not in t for t in failed), failed
    return checked


@pytest.mark.timeout(600)
def test_every_plan_switched_in_gives_1f1b_gradients() -> None:
    checked = _sweep(seed=7, plans_per_case=30)
    assert checked >= 45


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("seed", [101, 202, 303])
def test_plan_gradients_sweep(seed: int) -> None:
    checked = _sweep(seed=seed, plans_per_case=120)
    assert checked >= 160
