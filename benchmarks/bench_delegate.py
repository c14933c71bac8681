"""Delegated data plane vs the default transport on the synthetic testbed (§5).

Real 4-rank ``torchrun`` jobs of ``train_configs/synthetic_cpu.toml`` (PP=4, N=24, F=B=W=10 ms):

* **overhead** (no delay): median iteration time with ``[morph] transport = "delegate"`` divided by
  the default transport's (target ≤ 1.2; paper Fig. 21: ≤ 16.4 %);
* **HOL share** (60 ms on link 2–3, ``[morph.inject]`` static): per stage, the time the training
  thread spent blocked in sends (``morph/stage{i}/blocked_ms``: head-of-line blocking of the
  default transport's ``link_queue_depth`` FIFO; back-pressure waits for a free shared-memory slot
  with delegation) as a share of the iteration; the max over stages is reported (target < 5 % with
  delegation). Delegated sends' copy into shared memory is compute-side work, not counted as
  blocking (``DelegateTransport.copy_ms``).

``--llama`` adds the overhead ratio for the llama3 debug model (``train_configs/debug_cpu.toml``).
Each job runs ``--steps`` steps; the first ``--skip`` are dropped; medians come from TensorBoard.

    .venv/bin/python benchmarks/bench_delegate.py [--steps 12] [--skip 2] [--schedules ZBH2,PipeMorph] [--llama]

Prints markdown tables; not a test (timings depend on the host's load).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from titan_morph.compare.results import read_scalars
from titan_morph.compare.runner import Progress, run_checked

REPO = Path(__file__).resolve().parent.parent
SYNTHETIC = REPO / "train_configs" / "synthetic_cpu.toml"
DEBUG = REPO / "train_configs" / "debug_cpu.toml"
DELAY = "0,0,60"


def run_job(config: Path, args: list[str], dump: Path, timeout_s: float) -> dict[str, dict[int, float]]:
    """One 4-rank torchrun (killed on timeout, nothing left behind); its TensorBoard scalars."""
    run_checked(config, dump, args, timeout_s)
    return read_scalars(dump)


def median_after(series: dict[int, float], skip: int) -> float:
    values = [v for step, v in sorted(series.items()) if step > skip]
    return statistics.median(values) if values else float("nan")


def blocked_share(tb: dict[str, dict[int, float]], skip: int, stages: int = 4) -> tuple[float, float]:
    """(max over stages, mean over stages) of blocked_ms / iteration_ms, medians over steps."""
    iteration = tb.get("morph/iteration_ms", {})
    shares = []
    for s in range(stages):
        blocked = tb.get(f"morph/stage{s}/blocked_ms", {})
        per_step = [blocked[k] / iteration[k] for k in blocked if k > skip and k in iteration and iteration[k] > 0]
        shares.append(statistics.median(per_step) if per_step else float("nan"))
    return max(shares), statistics.fmean(shares)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--schedules", default="ZBH2,PipeMorph")
    ap.add_argument("--delegates-per-link", type=int, default=1)
    ap.add_argument("--llama", action="store_true", help="also the llama3 debug model's overhead ratio")
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_delegate_") as tmp:
        jobs = [(s, d) for s in args.schedules.split(",") for d in ("", DELAY)]
        progress = Progress(len(jobs) * 2 + (2 if args.llama else 0))
        for schedule, delay in jobs:
            result = {}
            for transport in ("default", "delegate"):
                extra = [
                    "--training.steps",
                    str(args.steps),
                    "--parallelism.pipeline_parallel_schedule",
                    schedule,
                    "--morph.transport",
                    transport,
                    "--morph.delegates_per_link",
                    str(args.delegates_per_link),
                ]
                if delay:
                    extra += ["--morph.inject.mode", "static", "--morph.inject.delays_ms", delay]
                    if schedule == "PipeMorph":
                        extra += ["--morph.plan_delays_ms", delay]
                t0 = time.monotonic()
                progress.start(f"{schedule} {transport} delay={delay or 'none'}")
                tb = run_job(SYNTHETIC, extra, Path(tmp) / f"{schedule}-{transport}-{delay or 'none'}", args.timeout)
                progress.done(f"{schedule} {transport} delay={delay or 'none'}")
                result[transport] = (
                    median_after(tb.get("morph/iteration_ms", {}), args.skip),
                    median_after(tb.get("morph/pipeline_ms", {}), args.skip),
                    *blocked_share(tb, args.skip),
                )
                took = time.monotonic() - t0
                print(
                    f"# {schedule} {transport} delay={delay or 'none'}: {result[transport]} ({took:.0f} s)", flush=True
                )
            rows.append((schedule, delay or "none", result))
        print(f"\n## Synthetic testbed (PP=4, N=24, F=B=W=10 ms), median of steps > {args.skip}\n")
        print(
            "| schedule | delay (ms) | default iter ms | delegate iter ms | ratio "
            "| default blocked (max/mean stage) | delegate blocked (max/mean stage) |"
        )
        print("|---|---|---|---|---|---|---|")
        for schedule, delay, r in rows:
            d, g = r["default"], r["delegate"]
            print(
                f"| {schedule} | {delay} | {d[0]:.1f} | {g[0]:.1f} | {g[0] / d[0]:.3f} | "
                f"{d[2] * 100:.1f}% / {d[3] * 100:.1f}% | {g[2] * 100:.2f}% / {g[3] * 100:.2f}% |"
            )
        if args.llama:
            res = {}
            for transport in ("default", "delegate"):
                extra = [
                    "--training.steps",
                    str(args.steps),
                    "--parallelism.pipeline_parallel_schedule",
                    "PipeMorph",
                    "--morph.transport",
                    transport,
                ]
                progress.start(f"llama3 debug model, {transport}")
                tb = run_job(DEBUG, extra, Path(tmp) / f"llama-{transport}", args.timeout)
                progress.done(f"llama3 debug model, {transport}")
                res[transport] = median_after(tb.get("morph/iteration_ms", {}), args.skip)
            print("\n## llama3 debug model (PP=4, PipeMorph), no delay\n")
            print("| default iter ms | delegate iter ms | ratio |\n|---|---|---|")
            print(f"| {res['default']:.1f} | {res['delegate']:.1f} | {res['delegate'] / res['default']:.3f} |")


if __name__ == "__main__":
    main()
