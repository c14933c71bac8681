"""Losses of every one-stage-per-rank schedule over every transport, side by side (debug_cpu, 4 ranks).

``PYTHONPATH=. .venv/bin/python benchmarks/losses.py [--steps 3] [--schedules A,B] [--transports X,Y]``

Each run is ``./run_train.sh --training.steps N`` with the schedule and transport set; the losses
its last rank logs are read back from its output. A schedule and a transport only reorder
computation and move bytes, so every run must give the same losses: the script prints the table
and exits 1 when any run differs from the first, failed, or logged no loss.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCHEDULES = ("1F1B", "GPipe", "PipeMorph", "ZBH1", "ZBH2", "Morph1F1B")
TRANSPORTS = ("default", "delegate", "auto")
_LOSS_RE = re.compile(r"\bstep:\s*(\d+)\s+loss:\s*([-+0-9.eEnaif]+)")


def run(schedule: str, transport: str, steps: int, timeout_s: float) -> list[str]:
    """The losses one run logs, as printed (5 decimals), or ``["failed: ..."]``."""
    args = ["--training.steps", str(steps), "--parallelism.pipeline_parallel_schedule", schedule]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TITAN_MORPH_RUN_ID", None)
    try:
        done = subprocess.run(
            [str(REPO / "run_train.sh"), *args, "--morph.transport", transport],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return [f"failed: no exit within {timeout_s:g} s"]
    losses = {int(m.group(1)): m.group(2) for m in _LOSS_RE.finditer(done.stdout + done.stderr)}
    if done.returncode != 0 or sorted(losses) != list(range(1, steps + 1)):
        return [f"failed: exit {done.returncode}, steps logged {sorted(losses)}"]
    return [losses[s] for s in range(1, steps + 1)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--transports", default=",".join(TRANSPORTS))
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    opts = parser.parse_args(argv)
    reference: list[str] | None = None
    same, count = True, 0
    for schedule in opts.schedules.split(","):
        for transport in opts.transports.split(","):
            losses = run(schedule, transport, opts.steps, opts.timeout)
            reference = losses if reference is None else reference
            ok = losses == reference and not losses[0].startswith("failed")
            same, count = same and ok, count + 1
            print(f"{schedule:>10} {transport:>9}: {', '.join(losses)}{'' if ok else '   <- differs'}", flush=True)
    print(f"{count} runs: {'all the same losses' if same else 'NOT all the same'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
