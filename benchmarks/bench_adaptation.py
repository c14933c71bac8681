"""Live adaptation's figures on the synthetic testbed (PP=4, N=24, F=B=W=10 ms), as ratios.

Runs four comparisons with ``python -m titan_morph.compare`` (skip with ``--no-run`` to re-read a
finished log directory), then prints, from the TensorBoard events:

1. static 60 ms on link 2-3 from step 5: the step the monitor declared the link slow, PipeMorph's
   steady pipeline time after adapting vs its own steps before the delay, and ZBH2 / PipeMorph;
2. dynamic stragglers (§7.2, Fig. 18 trace B): mean step time ZBH2 / PipeMorph;
3. the Table 3 trace (200 steps, link 2-3 of the paper goes down): mean throughput, and what
   happened to each schedule at the link-down event;
4. 100 quiet steps: plan changes made by the monitor (must be 0).

    .venv/bin/python benchmarks/bench_adaptation.py [--logdir outputs/results/issue6] [--no-run]

About 25 minutes on a 2-core host. Ratios, not absolute times: the host is shared.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from titan_morph.compare.results import PIPELINE_TAG, STEP_TIME_TAG, TPS_TAG, read_scalars
from titan_morph.compare.runner import Progress, load_outcome

CONFIG = "train_configs/synthetic_cpu.toml"
RUNS = [
    ("none", "PipeMorph", 100, []),
    ("last-link-60ms", "ZBH2,PipeMorph", 24, ["--", "--morph.inject.start_step", "5"]),
    ("fig18-B", "ZBH2,PipeMorph", 60, []),
    ("table3", "1F1B,ZBH2,PipeMorph", 200, []),
]
DELAY_FROM = 5


def _compare(logdir: Path) -> None:
    progress = Progress(len(RUNS), lambda line: print(line, flush=True))
    for scenario, variants, steps, extra in RUNS:
        cmd = [sys.executable, "-m", "titan_morph.compare", "--config", CONFIG, "--scenario", scenario]
        cmd += ["--variants", variants, "--steps", str(steps), "--logdir", str(logdir), *extra]
        progress.start(f"comparison {scenario} ({variants}, {steps} steps)")
        print("+", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True)
        progress.done(f"comparison {scenario}")


def _mean(values: dict[int, float], after: int = 0) -> float:
    return statistics.fmean(v for s, v in values.items() if s > after)


def _median(values: dict[int, float], steps: range) -> float:
    return statistics.median(values[s] for s in steps if s in values)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logdir", type=Path, default=Path("outputs/results/issue6"))
    ap.add_argument("--no-run", action="store_true", help="only read a finished log directory")
    args = ap.parse_args(argv)
    if not args.no_run:
        _compare(args.logdir)
    root = args.logdir

    quiet = read_scalars(root / "none" / "PipeMorph")
    changes = max(quiet.get("morph/plan_changes", {0: float("nan")}).values())
    print(f"\nno false positives: {len(quiet[STEP_TIME_TAG])} quiet steps, {changes:.0f} plan changes")

    pm = read_scalars(root / "last-link-60ms" / "PipeMorph")
    zb = read_scalars(root / "last-link-60ms" / "ZBH2")
    slow = [s for s, v in sorted(pm["morph/straggling/link2"].items()) if v > 0]
    detected = slow[0] if slow else None
    steps = max(pm[PIPELINE_TAG])
    before = _median(pm[PIPELINE_TAG], range(2, DELAY_FROM))
    if detected is None:
        print("static 60 ms on link 2-3: NOT detected")
    else:
        steady = range(detected + 3, steps + 1)
        after = _median(pm[PIPELINE_TAG], steady)
        zbh2 = _median(zb[PIPELINE_TAG], steady)
        print(
            f"static 60 ms on link 2-3 from step {DELAY_FROM}: slow after step {detected} "
            f"({detected - DELAY_FROM + 1} slow steps); PipeMorph steady / before the delay = {after / before:.3f} "
            f"({after:.0f} / {before:.0f} ms pipeline, steps {steady.start}-{steady.stop - 1}); "
            f"ZBH2 / PipeMorph = {zbh2 / after:.2f}"
        )

    pm = read_scalars(root / "fig18-B" / "PipeMorph")
    zb = read_scalars(root / "fig18-B" / "ZBH2")
    ratio = _mean(zb[STEP_TIME_TAG], 1) / _mean(pm[STEP_TIME_TAG], 1)
    print(
        f"dynamic N(30,10) ms every U(100,200) ms, {len(pm[STEP_TIME_TAG])} steps: mean step time ZBH2 / PipeMorph "
        f"= {ratio:.2f} (PipeMorph plan changes {max(pm['morph/plan_changes'].values()):.0f})"
    )

    print("Table 3 trace (200 steps; the paper's link 2<->3, mapped to link 0 at PP=4, goes down for good at 94 %):")
    for variant in ("1F1B", "ZBH2", "PipeMorph"):
        run = root / "table3" / variant
        scalars = read_scalars(run)
        outcome = load_outcome(run)
        tps = _mean(scalars[TPS_TAG], 1) if TPS_TAG in scalars else float("nan")
        last = max(scalars[STEP_TIME_TAG]) if STEP_TIME_TAG in scalars else 0
        status = "completed" if outcome is None or outcome.ok else outcome.status()
        changes = max(scalars.get("morph/plan_changes", {0: 0.0}).values())
        print(f"  {variant:10s} mean tokens/s {tps:7.1f} over {last} steps, plan changes {changes:.0f}; {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
