"""What each straggler costs, in a real 4-rank run of the synthetic testbed: 60 ms on link 2 and rank
3 computing twice as slow from step 4. The last stage writes ``morph/straggler_cost_ms/{link,rank}N``
to TensorBoard once the baseline is known (a warm-up and ``profile_steps`` steps), and the run
summary names the causes. How close the figures come to the measured slowdown is the benchmark's
business (``benchmarks/bench_attribution.py``), not asserted here."""

from __future__ import annotations

import pytest

from tests.launch import REPO, torchrun

CONFIG = REPO / "train_configs" / "synthetic_cpu.toml"
STEPS, START = 6, 4


@pytest.mark.slow
def test_straggler_costs_reach_tensorboard_and_the_summary(tmp_path, no_leftovers):
    result = torchrun(
        4,
        tmp_path / "run",
        "--training.steps",
        str(STEPS),
        "--morph.inject.mode",
        "static",
        "--morph.inject.delays_ms",
        "0,0,60",
        "--morph.inject.compute_factor",
        "1,1,1,2",
        "--morph.inject.start_step",
        str(START),
        config=CONFIG,
        timeout_s=300,
    )
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.tail()}"
    measured = range(START, STEPS + 1)  # steps 2-3 are the baseline (profile_steps = 2), step 1 a warm-up
    costs = {c: result.scalars(f"morph/straggler_cost_ms/{c}") for c in ("link0", "link1", "link2")}
    costs.update({c: result.scalars(f"morph/straggler_cost_ms/{c}") for c in ("rank0", "rank1", "rank2", "rank3")})
    for cause, values in costs.items():
        assert sorted(values) == list(measured), f"{cause}: {values}"
    for cause in ("link0", "link1", "rank0", "rank1", "rank2"):  # at their baseline: not even simulated
        assert set(costs[cause].values()) == {0.0}, f"{cause}: {costs[cause]}"
    assert all(v > 0 for v in costs["rank3"].values()), costs["rank3"]
    assert all(v > 0 for v in costs["link2"].values()), costs["link2"]
    assert sorted(result.scalars("morph/attribution_ms")) == list(measured)
    summary = result.output[result.output.index("what the stragglers cost") :].splitlines()
    named = {" ".join(line.split("titan_morph:")[-1].split()[:2]) for line in summary[1:3]}
    assert named == {"rank 3", "link 2"}, summary[:3]
    no_leftovers(tmp_path)
