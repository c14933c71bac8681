"""Emulated bandwidth: measured step times of real torchrun jobs vs the simulator, same link model.

Runs ``train_configs/synthetic_cpu.toml`` (PP=4, N=24, F=B=W=10 ms on the testbed's device clock)
as real 4-rank jobs for 1F1B (torch's), ZBH2 and PipeMorph with one slow link: ``[morph.inject]
bandwidth_mbit`` on ``--link`` (static mode, no extra latency) and ``[morph.synthetic] message_kb``
messages, so each message on that link takes message bytes x 8 / rate on the wire, one at a time
per direction (``links.Bandwidth`` in the emulator's ``LinkQueue``). PipeMorph plans for it
(``--morph.plan_delays_ms 0``: the initial plan takes the emulated links' transmit times,
``config.links.plan_transmit``). Default transport, ``link_queue_depth`` messages in flight.

Measured (medians over the steps after ``--skip``, read back from TensorBoard):

* ``pipeline_ms`` (``morph/pipeline_ms``: first stage's start to the last stage's end, what the
  simulator's makespan is) for titan_morph's schedules;
* ``step_ms`` (TorchTitan's ``time_metrics/end_to_end(s)``, every schedule): torch's 1F1B has only
  this, so its ratio is taken on it and includes the host's step overhead (optimizer, data, the
  gaps between steps), which the ZBH2/PipeMorph rows show as step - pipeline.

Simulated: ``compare.predict.simulated_ms`` on the run's own settings: the plan the job runs, built
as the runtime builds it, executed by ``pipelining.timing.simulate`` under the same ``link_model(...)``
(rates and message size included) with the testbed's stage times and the transport's queue depth.
For ZBH2/PipeMorph the runtime's own ``morph/predicted_ms`` (the simulator on the emulator's link
object, in the job) is printed next to it: they must agree. The last columns explain what is left:
the host latency per message the job measured on each link (``morph/send_latency_ms`` +
``morph/latency_ms/link<i>``: the CPU emulation's own, which the link model takes as 0 and the
testbed's device clock hides only in part) and the same simulation with it added to every link's
latency ("simulated + λ", the same plan): an explanation, not the prediction to match.

    .venv/bin/python benchmarks/bench_emulated_bandwidth.py [--rate 25] [--link 2] [--message-kb 64]
        [--steps 12] [--skip 2] [--out table.md]

Prints a markdown table; not a test (timings depend on the host's load: run it on a quiet machine,
``uptime`` load < 2.5, and rerun rather than tune when it is not).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from titan_morph.compare.results import ITERATION_TAG, PIPELINE_TAG, STEP_TIME_TAG, median_after, read_scalars
from titan_morph.compare.runner import Progress, run_checked

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "train_configs" / "synthetic_cpu.toml"
SCHEDULES = ("1F1B", "ZBH2", "PipeMorph")
PREDICTED_TAG = "morph/predicted_ms"


@dataclass
class Row:
    schedule: str
    simulated_ms: float
    runtime_predicted_ms: float | None
    pipeline_ms: float | None
    iteration_ms: float | None
    step_ms: float
    load: float
    latency_ms: tuple[float, ...] | None
    """Host latency per message and link (``morph/send_latency_ms`` + ``morph/latency_ms/link<i>``)."""
    simulated_lambda_ms: float | None
    """The simulation with ``latency_ms`` added to each link's latency (same plan)."""

    @property
    def measured_ms(self) -> float:
        """What is compared with the simulated makespan: the pipeline's span, else the whole step."""
        return self.pipeline_ms if self.pipeline_ms is not None else self.step_ms

    @property
    def ratio(self) -> float:
        return self.measured_ms / self.simulated_ms


def overrides(schedule: str, opts: argparse.Namespace) -> list[str]:
    rates = ["0"] * 3
    rates[opts.link] = f"{opts.rate:g}"
    args = [
        "--training.steps",
        str(opts.steps),
        "--parallelism.pipeline_parallel_schedule",
        schedule,
        "--morph.inject.mode",
        "static",
        "--morph.inject.delays_ms",
        "0",
        "--morph.inject.bandwidth_mbit",
        ",".join(rates),
        "--morph.synthetic.message_kb",
        f"{opts.message_kb:g}",
        "--morph.adapt",
        "false",  # the plan under test is the initial one, not the monitor's
    ]
    if schedule == "PipeMorph":
        args += ["--morph.plan_delays_ms", "0"]
    return args


def simulated(schedule: str, args: list[str], skip: int) -> float:
    """The offline prediction for the job, from its own settings (compare.predict)."""
    from titan_morph.compare.predict import simulated_ms
    from titan_morph.compare.variants import Variant
    from titan_morph.integration.titan022.jobconfig import load

    settings = load(CONFIG, args)[1]
    variant = Variant(schedule, schedule, settings.morph.transport, False, "")
    value, note = simulated_ms(settings, variant, skip)
    if value is None:
        raise RuntimeError(f"{schedule}: no simulated time: {note}")
    return value


def latency(tb: dict[str, dict[int, float]], skip: int, links: int = 3) -> tuple[float, ...] | None:
    """Median host latency per message on each link: the send's lateness after its producing op
    plus the link model's delivery to the receiver's arrival (titan_morph's schedules record both)."""
    sent = median_after(tb.get("morph/send_latency_ms", {}), skip)
    received = [median_after(tb.get(f"morph/latency_ms/link{i}", {}), skip) for i in range(links)]
    if sent is None or any(r is None for r in received):
        return None
    return tuple(sent + (r or 0.0) for r in received)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=25.0, help="Mbit/s of the slow link (default 25)")
    parser.add_argument("--link", type=int, default=2, choices=(0, 1, 2), help="the slow link (default 2: 2-3)")
    parser.add_argument("--message-kb", type=float, default=64.0, help="KiB per message (default 64)")
    parser.add_argument("--steps", type=int, default=12, help="training steps per job")
    parser.add_argument("--skip", type=int, default=2, help="first steps left out of the medians")
    parser.add_argument("--timeout", type=float, default=400, help="seconds per job")
    parser.add_argument(
        "--schedules", default=",".join(SCHEDULES), help="comma-separated subset of 1F1B,ZBH2,PipeMorph"
    )
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    opts = parser.parse_args()
    if opts.steps <= opts.skip:
        parser.error("--steps must exceed --skip")
    schedules = [s for s in opts.schedules.split(",") if s]
    if not set(schedules) <= set(SCHEDULES):
        parser.error(f"--schedules: choose from {', '.join(SCHEDULES)}")

    tau = opts.message_kb * 1024 * 8 / (opts.rate * 1e3)
    rows: list[Row] = []
    progress = Progress(len(schedules))
    with tempfile.TemporaryDirectory(prefix="bench_emulated_bandwidth_") as tmp:
        for schedule in schedules:
            args = overrides(schedule, opts)
            sim = simulated(schedule, args, opts.skip)
            dump = Path(tmp) / schedule
            started = time.monotonic()
            load = os.getloadavg()[0]
            progress.start(schedule)
            run_checked(CONFIG, dump, args, opts.timeout)
            progress.done(schedule)
            tb = read_scalars(dump)
            lam = latency(tb, opts.skip)
            with_lam = None
            if lam is not None:  # the same plan (PipeMorph plans for plan_delays_ms, not the injected delays)
                at = args.index("--morph.inject.delays_ms") + 1
                spec = ",".join(f"{v:.3f}" for v in lam)
                with_lam = simulated(schedule, [*args[:at], spec, *args[at + 1 :]], opts.skip)
            step = median_after({s: v * 1e3 for s, v in tb[STEP_TIME_TAG].items()}, opts.skip)
            assert step is not None
            row = Row(
                schedule,
                sim,
                median_after(tb.get(PREDICTED_TAG, {}), opts.skip),
                median_after(tb.get(PIPELINE_TAG, {}), opts.skip),
                median_after(tb.get(ITERATION_TAG, {}), opts.skip),
                step,
                max(load, os.getloadavg()[0]),
                lam,
                with_lam,
            )
            rows.append(row)
            runtime = "" if row.runtime_predicted_ms is None else f", runtime prediction {row.runtime_predicted_ms:.1f}"
            print(
                f"{schedule:9s} measured {row.measured_ms:7.1f} ms ({'pipeline' if row.pipeline_ms else 'step'}),"
                f" step {step:7.1f} ms, simulated {sim:7.1f} ms{runtime}: ratio {row.ratio:.3f};"
                f" load {row.load:.1f}; job {time.monotonic() - started:.0f} s",
                flush=True,
            )

    slow = f"link {opts.link}-{opts.link + 1}"
    lines = [
        f"Synthetic testbed PP=4, N=24, F=B=W=10 ms; {slow} at {opts.rate:g} Mbit/s with {opts.message_kb:g} KiB"
        f" messages ({tau:.2f} ms each on the wire); median of steps {opts.skip + 1}-{opts.steps}.",
        "",
        "| schedule | measured (ms) | what | step (ms) | simulated (ms) | runtime prediction (ms)"
        " | measured / simulated | load | host latency per message, links 0-2 (ms) | simulated + λ (ms)"
        " | measured / (simulated + λ) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        runtime = "-" if r.runtime_predicted_ms is None else f"{r.runtime_predicted_ms:.1f}"
        lat = "-" if r.latency_ms is None else ", ".join(f"{v:.2f}" for v in r.latency_ms)
        sim_lam = "-" if r.simulated_lambda_ms is None else f"{r.simulated_lambda_ms:.1f}"
        ratio_lam = "-" if r.simulated_lambda_ms is None else f"{r.measured_ms / r.simulated_lambda_ms:.3f}"
        what = "pipeline_ms" if r.pipeline_ms is not None else "step (end_to_end)"
        lines.append(
            f"| {r.schedule} | {r.measured_ms:.1f} | {what} | {r.step_ms:.1f} | {r.simulated_ms:.1f} | {runtime}"
            f" | {r.ratio:.3f} | {r.load:.1f} | {lat} | {sim_lam} | {ratio_lam} |"
        )
    by = {r.schedule: r for r in rows}
    overheads = [r.step_ms - r.pipeline_ms for r in rows if r.pipeline_ms is not None]
    if "1F1B" in by and overheads:
        overhead = sorted(overheads)[len(overheads) // 2]
        est = by["1F1B"].step_ms - overhead
        lines += [
            "",
            f"Step overhead outside the pipeline (step - pipeline_ms of titan_morph's schedules): {overhead:.1f} ms;"
            f" 1F1B's step less it: {est:.1f} ms, {est / by['1F1B'].simulated_ms:.3f} x simulated.",
        ]
    if "ZBH2" in by and "PipeMorph" in by:
        z, p = by["ZBH2"], by["PipeMorph"]
        lines += [
            "",
            f"ZBH2 / PipeMorph: measured {z.measured_ms / p.measured_ms:.3f}, simulated"
            f" {z.simulated_ms / p.simulated_ms:.3f}",
        ]
    table = "\n".join(lines)
    print()
    print(table)
    if opts.out:
        opts.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
