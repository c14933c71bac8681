"""The synthetic testbed (train_configs/synthetic_cpu.toml) as a real 4-rank torchrun, briefly.

Checks what the runtime records per step (TensorBoard, written by the last stage) and that a
schedule change alters timing only: ZBH2 and PipeMorph (planned for the delay) train to the same
losses under an emulated 30 ms delay on link 0-1. Timings themselves are the benchmark's business
(``benchmarks/bench_testbed.py``), not asserted here.
"""

from __future__ import annotations

import pytest

from tests.launch import REPO, torchrun

CONFIG = REPO / "train_configs" / "synthetic_cpu.toml"
STEPS = 3
DELAY = ("--morph.inject.mode", "static", "--morph.inject.delays_ms", "30,0,0")


def _run(tmp_path, schedule: str, *extra: str):
    result = torchrun(
        4,
        tmp_path / schedule,
        "--training.steps",
        str(STEPS),
        "--parallelism.pipeline_parallel_schedule",
        schedule,
        *DELAY,
        *extra,
        config=CONFIG,
        timeout_s=300,
    )
    assert result.returncode == 0, f"{schedule} failed (exit {result.returncode}):\n{result.tail()}"
    return result


@pytest.mark.slow
def test_testbed_records_and_losses_zbh2_vs_pipemorph(tmp_path, no_leftovers):
    zbh2 = _run(tmp_path, "ZBH2")
    steps = list(range(1, STEPS + 1))
    for tag in (
        "morph/iteration_ms",
        "morph/planned_makespan_ms",
        "morph/pipeline_ms",
        "morph/predicted_ms",
        "morph/bound_ms",
        "morph/plan_id",
        "morph/blocked_ms",
        "morph/latency_ms",
        *(f"morph/stage{s}/idle_ms" for s in range(4)),
        *(f"morph/stage{s}/blocked_ms" for s in range(4)),
    ):
        values = zbh2.scalars(tag)
        assert sorted(values) == steps, f"{tag}: {values}"
        assert all(v >= 0 for v in values.values()), f"{tag}: {values}"
    # ZBH2's plan knows nothing of the delay: planned = 750 ms (24 x 3 x 10 ms + fill/drain),
    # while the simulator under the injected link (blocking, depth 2) predicts 1040 ms.
    assert set(zbh2.scalars("morph/planned_makespan_ms").values()) == {750.0}
    assert set(zbh2.scalars("morph/predicted_ms").values()) == {1040.0}
    # No schedule beats (10 + 30) + 2 x 10 ms to the last stage, plus its 24 x 30 ms of work.
    assert set(zbh2.scalars("morph/bound_ms").values()) == {780.0}
    assert max(zbh2.scalars("morph/stage0/blocked_ms").values()) > 0  # stage 0 sends on the slow link

    pipemorph = _run(tmp_path, "PipeMorph", "--morph.plan_delays_ms", "30,0,0")
    assert set(pipemorph.scalars("morph/plan_id").values()) != set(zbh2.scalars("morph/plan_id").values())
    a, b = zbh2.losses(), pipemorph.losses()
    assert sorted(a) == sorted(b) == steps, (a, b)
    for step in steps:
        assert a[step] == pytest.approx(b[step], rel=1e-5), f"step {step}: ZBH2 {a[step]} vs PipeMorph {b[step]}"
    no_leftovers(tmp_path)
