"""Synthetic testbed: measured iteration times of real torchrun jobs vs the simulator.

Runs ``train_configs/synthetic_cpu.toml`` (PP=4, N=24, F=B=W=10 ms, padded on a device clock, see
``titan_morph.testbed``) as real 4-rank ``torchrun`` jobs for ZBH2 and PipeMorph with no delay,
30 ms on link 0-1 and 60 ms on link 2-3 (``[morph.inject]`` static delays on the default,
blocking transport: ``link_queue_depth`` messages in flight per link and direction). PipeMorph is
planned for the delay (``[morph] plan_delays_ms``). Each job runs ``--steps`` steps; the first
``--skip`` are dropped and the median of the rest is reported, read back from TensorBoard:

* ``iteration_ms``: the last stage's step (``morph/iteration_ms``);
* ``pipeline_ms``: first stage's start to the last stage's end (``morph/pipeline_ms``), which is
  what the simulator's makespan measures.

Predictions use the very plan the job ran (built from the same config) and the same link model:
``simulate(..., links=StaticDelays(delays), depth=link_queue_depth)`` (blocking, as run) and, for
the explanation only, ``depth=None`` (a non-blocking transport: pure dependency bubbles).
"No delay" runs plain torch.distributed; the delayed cases run through the emulator, which
records each message.
The host latency λ of a message on this CPU emulation, which the link model takes as 0, is
measured in the same run: ``morph/send_latency_ms`` (the producing op's device end to the send's
issue: sleep overshoot, the runtime loop) + ``morph/latency_ms`` (the link model's delivery time
to the arrival seen by a receiver already waiting: the emulator's link thread, store notices,
gloo over TCP). The "delays + λ" column is the same simulation with λ added to every link's
delay: the link model this host would realise if λ reached the devices. It does not, mostly: as a
GPU's NCCL would, the testbed's device clock starts the receiving op at the link model's delivery
time (the emulator's notice carries it) and times each send from the producing op's device end
(``EmulatedTransport.hint_issue``), hiding up to ``hide_host_gap_ms`` of λ per hop; so that column
is an upper bound, and the plain prediction is the one to match.

    .venv/bin/python benchmarks/bench_testbed.py [--steps 12] [--skip 2] [--out table.md]

Prints markdown tables; not a test (timings depend on the host's load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from titan_morph.compare.results import read_scalars
from titan_morph.compare.runner import Progress, run_checked

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "train_configs" / "synthetic_cpu.toml"
CASES = (("no delay", "0,0,0"), ("30 ms on link 0-1", "30,0,0"), ("60 ms on link 2-3", "0,0,60"))
SCHEDULES = ("ZBH2", "PipeMorph")
FAMILY = {"ZBH2": "zb-h2", "PipeMorph": "pipemorph"}


@dataclass
class Row:
    case: str
    delays: tuple[float, ...]
    schedule: str
    warmup: tuple[int, ...]
    iteration_ms: float
    pipeline_ms: float
    predicted_blocking: float
    predicted_nonblocking: float
    latency_ms: float
    predicted_latency: float
    steps: int

    def error(self, measured: float) -> float:
        return (measured - self.predicted_blocking) / self.predicted_blocking * 100


def overrides(schedule: str, delays: str, steps: int) -> list[str]:
    args = ["--training.steps", str(steps), "--parallelism.pipeline_parallel_schedule", schedule]
    if any(float(d) for d in delays.split(",")):  # "no delay" runs plain torch.distributed (no emulator)
        args += ["--morph.inject.mode", "static", "--morph.inject.delays_ms", delays]
        if schedule == "PipeMorph":
            args += ["--morph.plan_delays_ms", delays]
    return args


def simulated(plan, delays: tuple[float, ...], depth: int | None) -> float:
    from titan_morph.pipelining.core.links import StaticDelays
    from titan_morph.pipelining.timing.simulate import simulate

    model = plan.model.with_delays((0.0,) * len(delays))
    return simulate(model, plan.orders, links=StaticDelays(delays), depth=depth).makespan


def predict(schedule: str, args: list[str], delays: tuple[float, ...]):
    """The plan the job runs (same config, same builder) and its simulated makespans."""
    from torchtitan.config import ConfigManager

    from titan_morph.integration.plans import initial_plan
    from titan_morph.pipelining.core.links import StaticDelays
    from titan_morph.pipelining.timing.simulate import simulate

    cfg = ConfigManager().parse_args(["--job.config_file", str(CONFIG), *args])
    morph = cfg.morph
    stages = cfg.parallelism.pipeline_parallel_degree
    n = cfg.training.local_batch_size // cfg.parallelism.pipeline_parallel_microbatch_size
    plan = initial_plan(FAMILY[schedule], morph, stages, n)
    model = plan.model.with_delays((0.0,) * (stages - 1))
    links = StaticDelays(delays)
    blocking = simulate(model, plan.orders, links=links, depth=morph.link_queue_depth)
    nonblocking = simulate(model, plan.orders, links=links, depth=None)
    return plan, blocking, nonblocking, morph.link_queue_depth


def median_after(values: dict[int, float], skip: int) -> tuple[float, int]:
    kept = [v for step, v in sorted(values.items()) if step > skip]
    if not kept:
        raise RuntimeError(f"no measured steps after skipping {skip}: {values}")
    return statistics.median(kept), len(kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="training steps per job (>= skip + 10)")
    parser.add_argument("--skip", type=int, default=2, help="first steps left out of the median")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per job")
    parser.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    opts = parser.parse_args()
    if opts.steps < opts.skip + 1:
        parser.error("--steps must exceed --skip")

    from titan_morph.runtime.metrics import plan_scalar

    rows: list[Row] = []
    depth = None
    progress = Progress(len(CASES) * len(SCHEDULES))
    with tempfile.TemporaryDirectory(prefix="bench_testbed_") as tmp:
        for case, spec in CASES:
            delays = tuple(float(d) for d in spec.split(","))
            for schedule in SCHEDULES:
                args = overrides(schedule, spec, opts.steps)
                plan, blocking, nonblocking, depth = predict(schedule, args, delays)
                dump = Path(tmp) / f"{schedule}-{spec.replace(',', '_')}"
                started = time.monotonic()
                progress.start(f"{schedule} {case}")
                run_checked(CONFIG, dump, args, opts.timeout)
                progress.done(f"{schedule} {case}")
                tb = read_scalars(dump)
                ids = set(tb["morph/plan_id"].values())
                if ids != {plan_scalar(plan.plan_id)}:
                    raise RuntimeError(f"{schedule} {case}: the job ran plan(s) {ids}, predicted for {plan.plan_id}")
                it, kept = median_after(tb["morph/iteration_ms"], opts.skip)
                span, _ = median_after(tb["morph/pipeline_ms"], opts.skip)
                received = tb.get("morph/latency_ms", {})  # only through the emulator
                lat = median_after(received, opts.skip)[0] if received else 0.0
                lat += median_after(tb["morph/send_latency_ms"], opts.skip)[0]
                with_lat = simulated(plan, tuple(d + lat for d in delays), depth)
                row = Row(
                    case,
                    delays,
                    schedule,
                    plan.warmup,
                    it,
                    span,
                    blocking.makespan,
                    nonblocking.makespan,
                    lat,
                    with_lat,
                    kept,
                )
                rows.append(row)
                print(
                    f"{schedule:9s} {case:18s} x={list(plan.warmup)} iteration {it:7.1f} ms, pipeline {span:7.1f} ms,"
                    f" predicted {blocking.makespan:7.1f} ms ({row.error(span):+.1f} %), host latency {lat:.2f} ms"
                    f" -> predicted {with_lat:7.1f} ms ({(span - with_lat) / with_lat * 100:+.1f} %),"
                    f" job {time.monotonic() - started:.0f} s",
                    flush=True,
                )

    lines = [
        f"Synthetic testbed PP=4, N=24, F=B=W=10 ms; median of {rows[0].steps} steps (first {opts.skip} skipped);"
        f" default transport, link_queue_depth = {depth}; host load average {os.getloadavg()[0]:.1f}.",
        "",
        "| case | schedule | warm-up x | measured iteration_ms | measured pipeline_ms | predicted (blocking, "
        f"depth {depth}) | error iteration / pipeline | host latency λ | predicted, delays + λ | error pipeline "
        "vs delays + λ | predicted (non-blocking) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        err_lat = (r.pipeline_ms - r.predicted_latency) / r.predicted_latency * 100
        lines.append(
            f"| {r.case} | {r.schedule} | {','.join(map(str, r.warmup))} | {r.iteration_ms:.1f} | {r.pipeline_ms:.1f}"
            f" | {r.predicted_blocking:.1f} | {r.error(r.iteration_ms):+.1f} % / {r.error(r.pipeline_ms):+.1f} %"
            f" | {r.latency_ms:.2f} | {r.predicted_latency:.1f} | {err_lat:+.1f} % | {r.predicted_nonblocking:.1f} |"
        )
    lines += [
        "",
        "| case | ZBH2 / PipeMorph measured (pipeline) | predicted, blocking | predicted, non-blocking "
        "(dependency bubbles) | share of the slowdown gap due to blocking |",
        "|---|---:|---:|---:|---|",
    ]
    by = {(r.case, r.schedule): r for r in rows}
    for case, _ in CASES:
        z, p = by[(case, "ZBH2")], by[(case, "PipeMorph")]
        nb = z.predicted_nonblocking / p.predicted_nonblocking
        bl = z.predicted_blocking / p.predicted_blocking
        note = (
            f"ZBH2 +{z.predicted_blocking - z.predicted_nonblocking:.0f} ms, PipeMorph "
            f"+{p.predicted_blocking - p.predicted_nonblocking:.0f} ms from blocking"
        )
        lines.append(f"| {case} | {z.pipeline_ms / p.pipeline_ms:.2f} | {bl:.2f} | {nb:.2f} | {note} |")
    table = "\n".join(lines)
    print()
    print(table)
    if opts.out:
        opts.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
