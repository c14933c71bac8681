"""The monitor's bandwidth figures from a real run, read back from TensorBoard.

Two real ranks on the synthetic testbed (F = B = W = 10 ms), 256 KiB messages and an emulated
125 Mbit/s link (``[morph.inject] bandwidth_mbit``): each message takes 16.8 ms on the wire, longer
than a forward, so the warm-up's activations queue behind each other and the monitor can read the
rate off their arrival gaps. ``morph/bandwidth_mbps/link0`` must be that rate, measured from the
exchanged timings (not read from the emulator), beside ``morph/delay_ms/link0``.
"""

from __future__ import annotations

import statistics

import pytest

from tests.launch import REPO, torchrun

CONFIG = REPO / "train_configs" / "adapt_cpu.toml"
RATE_MBIT, MESSAGE_KB = 125.0, 256
TRANSMIT_MS = MESSAGE_KB * 1024 * 8 / (RATE_MBIT * 1e3)  # 16.8 ms


@pytest.mark.slow
def test_a_rate_limited_link_reports_its_bandwidth(tmp_path, no_leftovers):
    steps = 6
    # fmt: off
    run = torchrun(
        2, tmp_path / "bw",
        "--training.steps", str(steps),
        "--parallelism.pipeline_parallel_degree", "2",
        "--training.local_batch_size", "8",
        "--morph.memory_budget", "4",
        "--morph.inject.mode", "static",
        "--morph.inject.delays_ms", "0",
        "--morph.inject.start_step", "1",
        "--morph.inject.end_step", "0",
        "--morph.inject.bandwidth_mbit", str(RATE_MBIT),
        "--morph.synthetic.message_kb", str(MESSAGE_KB),
        config=CONFIG, timeout_s=300,
    )
    # fmt: on
    assert run.returncode == 0, f"run failed (exit {run.returncode}):\n{run.tail()}"
    no_leftovers(tmp_path / "bw")
    rate = run.scalars("morph/bandwidth_mbps/link0")
    delay = run.scalars("morph/delay_ms/link0")
    assert sorted(delay) == list(range(1, steps + 1)), delay
    assert len(rate) >= 2, rate  # the warm-up queues in every step; host hiccups may hide a few
    assert 0.8 * RATE_MBIT <= statistics.median(rate.values()) <= 1.2 * RATE_MBIT, rate
    transmit = run.scalars("morph/transmit_ms/link0")
    assert sorted(transmit) == sorted(rate)
    assert 0.8 * TRANSMIT_MS <= statistics.median(transmit.values()) <= 1.2 * TRANSMIT_MS, transmit
    # a message's delay is its transmit time + the host's latency, queueing behind the others left out
    assert all(TRANSMIT_MS * 0.8 <= d < TRANSMIT_MS + 15.0 for d in delay.values()), delay
    latency = run.scalars("morph/link_latency_ms/link0")
    assert latency and max(latency.values()) < 15.0, latency  # gloo on a loaded 2-core host, no injected delay
