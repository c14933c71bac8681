"""The partition planner (``partition/``, ``partition/bounds.py``, ``cli/partition.py``): the
issue's figures, agreement with brute force over every contiguous split, memory, the V, the CLI.
Run: ``.venv/bin/pytest tests/pipelining/test_partition.py``."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from titan_morph.pipelining.cli.partition import main
from titan_morph.pipelining.core.model import validate_orders
from titan_morph.pipelining.partition import (
    LayerCost,
    PartitionProblem,
    SplitDoesNotFit,
    evaluate_split,
    even_split,
    partition,
    problem_from_dict,
    stage_ranges,
)
from titan_morph.pipelining.search import builders
from titan_morph.pipelining.timing.bounds import lower_bound_ms
from titan_morph.pipelining.timing.simulate import makespan

EQUAL16 = tuple(LayerCost(f"layers.{i}", 2.5, 2.5, 2.5) for i in range(16))


def _splits(layers: int, stages: int):
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        ends = (0, *cuts, layers)
        yield tuple(b - a for a, b in zip(ends, ends[1:]))


def _random_problem(rng: random.Random, *, v: bool = False) -> PartitionProblem:
    """Random costs with a heavy output head at times, speeds, links and (often) memory."""
    ranks = rng.choice((2,) if v else (2, 3, 4))
    stages = ranks * (2 if v else 1)
    count = rng.randint(stages, stages + (3 if v else 4))
    layers = []
    for i in range(count):
        f = rng.uniform(0.5, 3.0) * (rng.uniform(1.5, 3.0) if i == count - 1 and rng.random() < 0.5 else 1.0)
        layers.append(
            LayerCost(
                f"l{i}", f, f * rng.uniform(0.8, 1.2), f * rng.uniform(0.3, 1.0), rng.uniform(1, 3), rng.uniform(0.5, 1)
            )
        )
    return PartitionProblem(
        tuple(layers),
        tuple(rng.choice((1.0, 1.0, 0.5, 0.7, 1.3)) for _ in range(ranks)),
        rng.randint(2, 8),
        schedule=rng.choice(("pipemorph-v", "zb-v")) if v else rng.choice(("pipemorph", "pipemorph", "zb-h2", "1f1b")),
        delays=tuple(rng.choice((0.0, 0.0, 1.0, 5.0)) for _ in range(ranks - 1)),
        transmit=tuple(rng.choice((0.0, 0.0, 0.5)) for _ in range(ranks - 1)),
        memory=(rng.uniform(6, 20),) * ranks if rng.random() < 0.4 else None,
    )


def _brute(problem: PartitionProblem, *, final: bool) -> dict[tuple[int, ...], float]:
    out = {}
    for split in _splits(len(problem.layers), problem.stages):
        try:
            out[split] = evaluate_split(problem, split, final=final).makespan_ms
        except SplitDoesNotFit:
            pass
    return out


def test_slow_rank_gets_fewer_layers() -> None:
    """S = 4, N = 24, 16 layers of 2.5 ms, rank 3 at half speed: 5,5,4,2 plans 912.5 ms against the
    even split's 1470 (= ZB-H2 = the bound); at 1.5x slower 900 against 1110."""
    result = partition(PartitionProblem(EQUAL16, (1, 1, 1, 0.5), 24))
    assert result.best.layers_per_stage == (5, 5, 4, 2) and result.best.makespan_ms == pytest.approx(912.5)
    assert result.even is not None and result.even.layers_per_stage == (4, 4, 4, 4)
    assert result.even.makespan_ms == pytest.approx(1470.0) and result.even.lower_bound_ms == pytest.approx(1470.0)
    assert result.exact and result.bound_ms == pytest.approx(912.5) and result.speedup == pytest.approx(1470 / 912.5)
    zb = builders.build("zb-h2", result.even.model)
    assert makespan(result.even.model, zb.orders) == pytest.approx(1470.0)
    best = result.best
    validate_orders(best.model, best.plan.orders)
    assert makespan(best.model, best.plan.orders) == pytest.approx(best.makespan_ms)
    # The plan CLI's default search on the chosen stage times gives the same makespan.
    searched = builders.build("pipemorph", best.model, search=True)
    assert makespan(best.model, searched.orders) == pytest.approx(912.5)
    slower = partition(PartitionProblem(EQUAL16, (1, 1, 1, 1 / 1.5), 24))
    assert slower.best.makespan_ms == pytest.approx(900.0) and slower.even is not None
    assert slower.even.makespan_ms == pytest.approx(1110.0) and slower.exact


def test_equal_ranks_keep_the_even_split() -> None:
    result = partition(PartitionProblem(EQUAL16, (1, 1, 1, 1), 24))
    assert result.even is not None and result.best.layers_per_stage == (4, 4, 4, 4)
    assert result.best.makespan_ms == pytest.approx(result.even.makespan_ms)


@pytest.mark.parametrize("seed", range(12))
def test_candidate_planner_matches_brute_force(seed: int) -> None:
    """Exactness for the candidate planner: the best of every contiguous split, and ``bound_ms``
    below every split's plan; the final plan is never worse than the best candidate."""
    rng = random.Random(seed)
    problem = _random_problem(rng, v=seed % 4 == 3)
    every = _brute(problem, final=False)
    if not every:
        with pytest.raises(SplitDoesNotFit):
            partition(problem)
        return
    result = partition(problem)
    least = min(every.values())
    assert result.exact
    assert result.candidates[0][1] == pytest.approx(least)
    assert result.best.makespan_ms <= least * (1 + 1e-9)
    assert result.bound_ms <= least * (1 + 1e-9)
    assert result.best.lower_bound_ms <= result.best.makespan_ms * (1 + 1e-9)


@pytest.mark.parametrize("seed", [s if s < 10 else pytest.param(s, marks=pytest.mark.slow) for s in range(40)])
def test_final_plan_within_one_percent_of_brute_force(seed: int) -> None:
    """Against the final planner (the full search) on every split: within 1 % (seeds from 10: slow)."""
    rng = random.Random(1000 + seed)
    problem = _random_problem(rng, v=seed % 5 == 4)
    every = _brute(problem, final=True)
    if not every:
        return
    result = partition(problem)
    assert result.best.makespan_ms <= min(every.values()) * 1.01
    assert result.bound_ms <= min(every.values()) * (1 + 1e-9)


@pytest.mark.parametrize("v", [False, True])
def test_enumeration_yields_exactly_the_splits_under_the_threshold(v: bool) -> None:
    """Each split under the threshold once, none that does not fit; one stage per rank: exactly
    those under it (the V's walk prunes by a weaker bound and yields a superset of those)."""
    rng = random.Random(7)
    layers = tuple(LayerCost(f"l{i}", rng.uniform(1, 3), 2.0, 1.0, rng.uniform(1, 2), 1.0) for i in range(9))
    problem = PartitionProblem(
        layers,
        (1.0, 0.6) if v else (1.0, 0.6, 1.2),
        6,
        schedule="pipemorph-v" if v else "pipemorph",
        delays=(2.0,) if v else (2.0, 0.0),
        memory=(14.0, 14.0) if v else (9.0, 9.0, 9.0),
    )
    space = problem.split_space()
    fitting = []
    for split in _splits(len(layers), problem.stages):
        try:
            problem.cost_model(split)
        except SplitDoesNotFit:
            continue
        fitting.append(split)
    bounds = sorted(space.bound(s) for s in fitting)
    threshold = bounds[len(bounds) // 3]
    got = [split for _, split in space.splits(threshold)]
    assert len(got) == len(set(got)) and got
    if not v:
        want = {s for s in fitting if space.bound(s) <= threshold}
        assert set(got) == want
        assert space.floor() == pytest.approx(bounds[0])
        return
    assert set(got) <= set(fitting)
    assert {s for s in fitting if space.bound(s) <= threshold} <= set(got)
    assert space.floor() <= bounds[0]


def test_memory_bounds_the_split() -> None:
    """A heavy output layer (parameters) must sit alone; the in-flight budget follows the bytes."""
    layers = [LayerCost(f"l{i}", 1.0, 1.0, 1.0, param_bytes=10.0, act_bytes=1.0) for i in range(7)]
    layers.append(LayerCost("output", 1.0, 1.0, 1.0, param_bytes=90.0, act_bytes=2.0))
    problem = PartitionProblem(tuple(layers), (1, 1, 1, 1), 8, memory=(100.0,) * 4)
    result = partition(problem)
    assert result.best.layers_per_stage[-1] == 1 and result.exact
    assert result.best.model.memory is not None and result.best.model.memory[3] == 5  # (100 - 90) / 2
    assert result.even is None  # 2 layers + the output do not fit rank 3
    with pytest.raises(SplitDoesNotFit, match="rank 3"):
        evaluate_split(problem, (2, 2, 2, 2))
    with pytest.raises(SplitDoesNotFit):
        partition(PartitionProblem(tuple(layers), (1, 1, 1, 1), 8, memory=(50.0,) * 4))
    # ZB-H2 needs 2(S - s) - 1 in flight: stage 0 must keep its activations small enough for 7.
    zb = partition(PartitionProblem(tuple(layers), (1, 1, 1, 1), 8, schedule="zb-h2", memory=(100.0,) * 4))
    assert zb.best.model.memory is not None and zb.best.model.memory[0] >= 7


def test_v_placement_moves_layers_off_the_slow_rank() -> None:
    result = partition(PartitionProblem(EQUAL16, (1, 0.5), 12, schedule="pipemorph-v"))
    split = result.best.layers_per_stage
    assert len(split) == 4 and sum(split) == 16
    assert split[1] + split[2] < split[0] + split[3]  # rank 1 runs stages 1 and 2
    assert result.even is not None and result.best.makespan_ms < result.even.makespan_ms
    assert result.bound_ms <= result.best.makespan_ms


def test_links_are_planned_for() -> None:
    problem = PartitionProblem(EQUAL16, (1, 1, 1, 0.5), 24, delays=(0.0, 30.0, 0.0), transmit=(0.5, 0.5, 0.5))
    result = partition(problem)
    best = result.best
    assert best.model.delays == (0.0, 30.0, 0.0) and best.model.transmit == (0.5, 0.5, 0.5)
    assert makespan(best.model, best.plan.orders) == pytest.approx(best.makespan_ms)
    assert lower_bound_ms(best.model) <= best.makespan_ms < result.even.makespan_ms  # type: ignore[union-attr]


def test_helpers_and_bad_problems() -> None:
    assert even_split(10, 4) == (3, 3, 2, 2) and stage_ranges((2, 3)) == ((0, 2), (2, 5))
    with pytest.raises(ValueError, match="rank_speed"):
        PartitionProblem(EQUAL16, (1, 0), 4)
    with pytest.raises(ValueError, match="cannot fill 4 stages"):
        PartitionProblem(EQUAL16[:3], (1, 1, 1, 1), 4)
    with pytest.raises(ValueError, match="delays needs 1 or 3"):
        PartitionProblem(EQUAL16, (1, 1, 1, 1), 4, delays=(1.0, 2.0))
    with pytest.raises(ValueError, match="l0.fwd"):
        LayerCost("l0", -1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="layers_per_stage"):
        evaluate_split(PartitionProblem(EQUAL16, (1, 1), 4), (10, 5))
    with pytest.raises(ValueError, match=r"layers\[1\]"):
        problem_from_dict({"layers": [{"fwd": 1, "bwd": 1, "wgt": 1}, {"fwd": 1, "bwd": 1}]}, microbatches=2)


# ---------------------------------------------------------------------------------------------
# The CLI
# ---------------------------------------------------------------------------------------------


def _costs(tmp_path: Path, speeds: list[float], layers: int = 16, **extra: object) -> Path:
    path = tmp_path / "costs.json"
    rows = [{"name": f"layers.{i}", "fwd": 2.5, "bwd": 2.5, "wgt": 2.5, **extra} for i in range(layers)]
    path.write_text(json.dumps({"layers": rows, "rank_speed": speeds}))
    return path


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_json_and_summary(capsys, tmp_path: Path) -> None:
    costs = str(_costs(tmp_path, [1, 1, 1, 0.5]))
    rc, out, err = _run(capsys, "--costs", costs, "--stages", "4", "--microbatches", "24", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["layers_per_stage"] == [5, 5, 4, 2] and d["makespan_ms"] == pytest.approx(912.5)
    assert d["even_layers_per_stage"] == [4, 4, 4, 4] and d["even_makespan_ms"] == pytest.approx(1470.0)
    assert d["lower_bound_ms"] == pytest.approx(912.5) and d["exact"] is True
    assert d["stage_layers"][3] == ["layers.14", "layers.15"] and d["stage_ranks"] == [0, 1, 2, 3]
    rc, out, _ = _run(capsys, "--costs", costs, "--microbatches", "24", "--rank-speed", "1,1,1,0.6666666666666666")
    assert rc == 0 and "makespan 900.0 ms" in out and "1110.0 ms" in out and "layers.14..layers.15" not in out


@pytest.mark.parametrize(
    ("argv", "speeds", "layers", "needle"),
    [
        ([], [1, 1, 0, 1], 16, "rank_speed: 0 is out of range"),
        ([], [1, 1, -2, 1], 16, "rank_speed: -2 is out of range"),
        (["--stages", "3"], [1, 1, 1, 0.5], 16, "rank_speed has 4 values"),
        ([], [1, 1, 1, 0.5], 3, "cannot fill 4 stages"),
        (["--delays", "1,2"], [1, 1, 1, 0.5], 16, "--delays needs 3 values"),
        (["--memory", "10,10"], [1, 1, 1, 0.5], 16, "--memory needs 1 or 4 values"),
        (["--memory", "5"], [1, 1, 1, 0.5], 16, "memory: no split"),
        (["--schedule", "zb-x"], [1, 1, 1, 0.5], 16, "unknown schedule"),
        (["--delays", "0,inf,0"], [1, 1, 1, 0.5], 16, "link 1 (1<->2) is down"),
    ],
)
def test_cli_bad_input(capsys, tmp_path: Path, argv: list[str], speeds: list[float], layers: int, needle: str) -> None:
    costs = _costs(tmp_path, speeds, layers, param_bytes=1.0, act_bytes=1.0)
    rc, out, err = _run(capsys, "--costs", str(costs), "--microbatches", "24", *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err


def test_cli_bad_files(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    for path, needle in ((bad, "not JSON"), (tmp_path / "missing.json", "cannot read")):
        rc, _, err = _run(capsys, "--costs", str(path), "--microbatches", "4")
        assert rc == 2 and err.startswith("error: ") and needle in err and err.count("\n") == 1
    bad.write_text(json.dumps({"layers": [{"fwd": 1, "bwd": 1, "wgt": 1, "bwd_ms": 2}]}))
    rc, _, err = _run(capsys, "--costs", str(bad), "--microbatches", "4")
    assert rc == 2 and "unknown key(s) ['bwd_ms']" in err


def test_cli_module_entry_point(tmp_path: Path) -> None:
    costs = _costs(tmp_path, [1, 1, 1, 0.5])
    cmd = [sys.executable, "-m", "titan_morph.pipelining.partition", "--costs", str(costs), "--stages", "4"]
    done = subprocess.run([*cmd, "--microbatches", "24", "--json"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["makespan_ms"] == pytest.approx(912.5)
    done = subprocess.run([*cmd, "--microbatches", "0"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
