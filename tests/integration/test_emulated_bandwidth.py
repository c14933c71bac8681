"""A rate-limited link on the synthetic testbed as a real 4-rank torchrun: the job runs with the
configured message size, its runtime simulator and the offline predictor use one link model (the
same prediction), PipeMorph plans for the link's transmit time, and a rate only delays (same
losses as without). Timings themselves are ``benchmarks/bench_emulated_bandwidth.py``'s business."""

from __future__ import annotations

import pytest

from tests.launch import REPO, torchrun

CONFIG = REPO / "train_configs" / "synthetic_cpu.toml"
STEPS = 3
SIZE = ("--morph.synthetic.message_kb", "64", "--morph.inject.mode", "static", "--morph.inject.delays_ms", "0")
RATE = ("--morph.inject.bandwidth_mbit", "0,0,25")  # 64 KiB at 25 Mbit/s: 20.97 ms per message on link 2-3


def _args(schedule: str, *extra: str) -> list[str]:
    return ["--training.steps", str(STEPS), "--parallelism.pipeline_parallel_schedule", schedule, *SIZE, *extra]


def _run(tmp_path, name: str, args: list[str]):
    result = torchrun(4, tmp_path / name, *args, config=CONFIG, timeout_s=300)
    assert result.returncode == 0, f"{name} failed (exit {result.returncode}):\n{result.tail()}"
    return result


@pytest.mark.slow
def test_rate_limited_link_predicted_as_simulated_and_losses_unchanged(tmp_path, no_leftovers):
    from titan_morph.compare.predict import simulated_ms
    from titan_morph.compare.variants import Variant
    from titan_morph.integration.titan022.jobconfig import load

    pipemorph = _args("PipeMorph", *RATE, "--morph.plan_delays_ms", "0", "--morph.adapt", "false")
    rated = _run(tmp_path, "rated", pipemorph)
    settings = load(CONFIG, pipemorph)[1]
    offline, note = simulated_ms(settings, Variant("PipeMorph", "PipeMorph", "default", False, ""), 0)
    assert offline is not None, note
    predicted = rated.scalars("morph/predicted_ms")
    assert sorted(predicted) == list(range(1, STEPS + 1))
    assert all(v == pytest.approx(offline, rel=1e-6) for v in predicted.values()), (predicted, offline)
    assert offline > 24 * 20.97  # link 2 carries 24 messages each way, one at a time

    plain = _run(tmp_path, "plain", _args("PipeMorph", "--morph.plan_delays_ms", "0", "--morph.adapt", "false"))
    assert set(plain.scalars("morph/plan_id").values()) != set(rated.scalars("morph/plan_id").values())
    a, b = plain.losses(), rated.losses()
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1)), (a, b)
    for step in a:
        assert a[step] == pytest.approx(b[step], rel=1e-5), f"step {step}: {a[step]} vs {b[step]} with the rate"
    no_leftovers(tmp_path)
