"""What each straggler costs, in a real 4-rank run of the synthetic testbed: 60 ms on link 2 and rank
3 computing twice as slow from step 4. The last stage writes ``morph/straggler_cost_ms/{link,rank}N``
to TensorBoard once the baseline is known (a warm-up and ``profile_steps`` steps): the costs charged
(above the step's noise, from the step the gate confirmed them: ``detect_steps`` in a row), 0 for the
causes at their baseline; the run summary names the causes. How close the figures come to the
measured slowdown is the benchmark's business (``benchmarks/bench_attribution.py``), not asserted
here."""

from __future__ import annotations

import pytest

from tests.launch import REPO, torchrun

CONFIG = REPO / "train_configs" / "synthetic_cpu.toml"
STEPS, START = 8, 4
CONFIRMED = START + 2  # detect_steps = 3 steps above the noise


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
    causes = ("link0", "link1", "link2", "rank0", "rank1", "rank2", "rank3", "host", "links")
    costs = {c: result.scalars(f"morph/straggler_cost_ms/{c}") for c in causes}
    for cause, values in costs.items():
        assert sorted(values) == list(measured), f"{cause}: {values}"
    for cause in ("link0", "link1", "rank0", "rank1", "rank2", "host", "links"):  # never above the noise
        assert set(costs[cause].values()) == {0.0}, f"{cause}: {costs[cause]}"
    for cause in ("rank3", "link2"):
        assert all(v > 0 for s, v in costs[cause].items() if s >= CONFIRMED), costs[cause]
    assert sorted(result.scalars("morph/attribution_ms")) == list(measured)
    summary = result.output[result.output.index("what the stragglers cost") :].splitlines()
    named = {" ".join(line.split("titan_morph:")[-1].split()[:2]) for line in summary[1:3]}
    assert named == {"rank 3", "link 2"}, summary[:3]
    no_leftovers(tmp_path)
