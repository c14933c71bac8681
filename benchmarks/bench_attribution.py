"""What each straggler costs: the attribution's estimate against the measured slowdown, side by side.

train_configs/synthetic_cpu.toml (PP = 4, N = 24, F = B = W = 10 ms), one job per case and
schedule, one after the other in this run:

* ``undisturbed``: nothing injected;
* ``link2``: 60 ms on link 2 (ranks 2-3) from step 4;
* ``rank3``: rank 3 computing twice as slow (``compute_factor`` 2) from step 4.

Per schedule it prints, over the steady steps (the detector's steps and the re-plan behind), the
measured slowdown -- the median pipeline time (``morph/pipeline_ms``) of the case less the
undisturbed run's over the same steps -- against the attribution's estimate: the median of
``morph/straggler_cost_ms/link2`` (``rank3``) over those steps and the run summary's figure for the
cause (its median over every step the cause was charged: above the noise), each as estimate / measured.
The acceptance is within 15 %. It also times the attribution itself: the simulations per step
(``morph/attribution_ms`` in the runs; and here, the planner's timing routine at S = 4, N = 24 and
S = 8, N = 32 with one cause and with every cause off its baseline).

    flock /tmp/tm-heavy.lock .venv/bin/python benchmarks/bench_attribution.py [--schedules PipeMorph,ZBH2] [--no-run]

About 3 minutes per schedule on a 2-core host.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

from titan_morph.compare.results import PIPELINE_TAG, read_scalars
from titan_morph.compare.runner import LOG_FILE, load_outcome, run_command, run_job
from titan_morph.monitor.attribution import Measured, straggler_costs
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.search.builders import build

CONFIG = Path("train_configs/synthetic_cpu.toml")
RANKS, START, STEPS, STEADY = 4, 4, 30, 12
CASES = {
    "undisturbed": [],
    "link2": ["--morph.inject.mode", "static", "--morph.inject.delays_ms", "0,0,60"],
    "rank3": ["--morph.inject.mode", "static", "--morph.inject.compute_factor", "1,1,1,2"],
}
CAUSE = {"link2": "link2", "rank3": "rank3"}
_SUMMARY_RE = re.compile(r"titan_morph:\s+(link|rank) (\d+)\s+(-?\d+) ms per step")


def _run(logdir: Path, schedule: str, case: str) -> None:
    dump = logdir / schedule / case
    overrides = [
        "--parallelism.pipeline_parallel_schedule",
        schedule,
        "--morph.inject.start_step",
        str(START),
        *CASES[case],
    ]
    command = run_command(CONFIG, dump, RANKS, STEPS, overrides)
    print("+", " ".join(command[command.index("titan_morph.train") :]), flush=True)
    outcome = run_job(command, dump, variant=case, case=schedule, timeout_s=120 + 6 * STEPS)
    if not outcome.ok:
        raise SystemExit(f"{schedule} / {case}: {outcome.status()}")


def _median(values: dict[int, float], steps: range) -> float:
    return statistics.median(values[s] for s in steps if s in values)


def summary_costs(log: str) -> dict[str, float]:
    """The run summary's cost per step of each cause it names (``link2``: ms)."""
    return {f"{kind}{index}": float(ms) for kind, index, ms in _SUMMARY_RE.findall(log)}


def report(logdir: Path, schedule: str) -> list[str]:
    steady = range(STEADY, STEPS + 1)
    base = read_scalars(logdir / schedule / "undisturbed")
    ref = _median(base[PIPELINE_TAG], steady)
    lines = [f"{schedule}: steady steps {steady.start}-{steady.stop - 1}; undisturbed {ref:.0f} ms per step"]
    took = [v for v in base.get("morph/attribution_ms", {}).values()]
    for case, cause in CAUSE.items():
        run = read_scalars(logdir / schedule / case)
        got = _median(run[PIPELINE_TAG], steady)
        measured = got - ref
        tb = _median(run[f"morph/straggler_cost_ms/{cause}"], steady)
        log = (logdir / schedule / case / LOG_FILE).read_text(errors="replace")
        summary = summary_costs(log).get(cause)
        took += list(run.get("morph/attribution_ms", {}).values())
        text = "n/a" if summary is None else f"{summary:.0f} ms ({summary / measured:.3f})"
        lines.append(
            f"  {case}: {got:.0f} ms per step, measured cost {measured:.0f} ms; attribution: TensorBoard median"
            f" {tb:.0f} ms ({tb / measured:.3f}), run summary {text}; within 15 %:"
            f" {abs(tb / measured - 1) <= 0.15 and summary is not None and abs(summary / measured - 1) <= 0.15}"
        )
    if took:
        lines.append(
            f"  attribution per step in these runs: median {statistics.median(took):.2f} ms, max {max(took):.2f} ms"
        )
    return lines


def timing() -> list[str]:
    """The attribution's simulations at two sizes: one cause off its baseline, and every cause."""
    lines = ["attribution time (ZB-H2 orders, queue depth 2, median of 20):"]
    for s, n in ((4, 24), (8, 32)):
        model = CostModel.uniform(s, n, 10.0, 10.0, 10.0)
        plan = build("zb-h2", model)
        links = s - 1
        for label, speeds, latency, off in (
            ("one slow link", (1.0,) * s, (0.0,) * (links - 1) + (60.0,), (f"link{links - 1}",)),
            (
                "every link and rank",
                (0.5,) * s,
                (60.0,) * links,
                (*(f"link{i}" for i in range(links)), *(f"rank{r}" for r in range(s))),
            ),
        ):
            measured = Measured(1, speeds, latency, (0.0,) * links, (0.0,) * links, off)
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                straggler_costs(model, plan.orders, measured, depth=2)
                times.append((time.perf_counter() - t0) * 1e3)
            lines.append(
                f"  S={s}, N={n}, {label} ({len(off)} + 1 simulations): {statistics.median(times):.2f} ms per step"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logdir", type=Path, default=Path("outputs/results/attribution"))
    ap.add_argument("--schedules", default="PipeMorph,ZBH2", help="comma-separated pipeline schedules")
    ap.add_argument("--no-run", action="store_true", help="only read a finished log directory")
    args = ap.parse_args(argv)
    schedules = args.schedules.split(",")
    print("\n".join(timing()), flush=True)
    if not args.no_run:
        for schedule in schedules:
            for case in CASES:
                _run(args.logdir, schedule, case)
    for schedule in schedules:
        for case in CASES:
            outcome = load_outcome(args.logdir / schedule / case)
            if outcome is not None and not outcome.ok:
                print(f"{schedule} / {case}: {outcome.status()}")
        print("\n".join(report(args.logdir, schedule)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
