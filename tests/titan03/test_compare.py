"""TorchTitan 0.3.0: one comparison scenario end to end, with the same command line as on 0.2.2.

``python -m titan_morph.compare --config train_configs/synthetic_cpu.toml ...`` names the job by
its TOML on both releases; on 0.3.0 the file name picks the config function ``synthetic_cpu``
(:mod:`titan_morph.integration.release`).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch import REPO

CONFIG = REPO / "train_configs" / "synthetic_cpu.toml"


def test_compare_two_variants_end_to_end(tmp_path: Path) -> None:
    from titan_morph.compare.results import read_scalars

    logdir = tmp_path / "logs"
    args = ["--scenario", "last-link-60ms", "--variants", "ZBH2,PipeMorph", "--steps", "3", "--skip-warmup", "1"]
    cmd = [sys.executable, "-m", "titan_morph.compare", "--config", str(CONFIG), "--logdir", str(logdir), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    scenario = logdir / "last-link-60ms"
    losses = []
    for variant in ("ZBH2", "PipeMorph"):
        scalars = read_scalars(scenario / variant)
        assert sorted(scalars.get("morph/pipeline_ms", {})) == [1, 2, 3], variant
        losses.append(scalars["loss_metrics/global_avg_loss"])
    for step in (1, 2, 3):  # same seed and data: the schedule changes timing, not the losses
        assert losses[0][step] == pytest.approx(losses[1][step], rel=2e-4)
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    for name in ("ZBH2", "PipeMorph"):
        cells = [c.strip() for c in rows[name].strip("|").split("|")]
        step_ms, tps, pipeline_ms, simulated_ms, bound = (float(c) for c in cells[1:6])
        assert all(math.isfinite(v) and v > 0 for v in (step_ms, tps, pipeline_ms, simulated_ms)), rows[name]
        # 30 ms of forwards and 60 ms to the last rank, then 24 x 30 ms; a plan re-made during the run (its
        # model holds the measured stage times, at least the nominal 30 ms) can only raise it
        changes = cells[-2]
        assert bound == 810.0 if changes in ("0", "—") else bound >= 810.0, rows[name]
        assert cells[-1] == "ok"
