"""Soak: a long synthetic-testbed run under dynamic stragglers; does any rank's memory creep?

One 4-rank ``torchrun`` job of ``train_configs/synthetic_cpu.toml`` (PP=4, F=B=W=10 ms) with
``--microbatches`` microbatches, every link delayed by N(30, 10) ms (``--mean-ms``, std a third of
it) re-drawn every U(100, 200) ms (the paper's §7.2 dynamic stragglers), ``[morph] transport =
"auto"`` and live adaptation on (so links move to the delegates and back and plans change, as in
production).

While it runs, every rank's resident set size is sampled (``/proc/<pid>/status``) and matched to
the step the job had logged. Printed, per rank: the median RSS over the ``--window`` steps after
``--warmup`` and over the last ``--window`` steps, and the growth in between (total and per step;
a median over tens of steps reads a level, where one sample may catch a transient allocation); the
slope of a least-squares line through the samples of the run's second half (KB per step, and that
slope over the half in MB: a leak's rate, not the warm-up's step up); the same growth for each rank's
delegate processes together (root and delegates, RSS summed: a delegate path that lives through the
run). Then the seconds from the
last step to the job's exit (the end-of-run summary and the close), plan changes, failovers and
delegated links, step time p50 / p99 after warm-up (TorchTitan's ``time_metrics/end_to_end(s)``).
The last line is JSON with at least ``rss_growth_mb`` (the largest growth over the ranks),
``second_half_mb`` and ``exit_s``; ``--samples`` writes every sample (RSS split into anonymous,
file and shared memory) to a CSV.

    .venv/bin/python benchmarks/soak.py --steps 1000 --warmup 200 [--window 50] [--samples rss.csv] \
        [-- --comm.trace_buf_size 0]

Not a test: figures depend on the host's load. The goal: every rank within 1 MB from step 200 to
1000 with TorchTitan's flight recorder off (``-- --comm.trace_buf_size 0``), 2 MB with it on, and
an exit within 5 s of the last step, whatever the run's length.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.jobs import WatchedJob  # noqa: E402
from titan_morph.comm.machine.system import proc_status  # noqa: E402
from titan_morph.compare.results import read_scalars  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SYNTHETIC = REPO / "train_configs" / "synthetic_cpu.toml"
RANKS = 4


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation (NaN when empty)."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


PARTS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")  # /proc/<pid>/status fields sampled, in KiB
DELEGATES = 100  # samples of rank R's delegate processes (their RSS summed) are keyed DELEGATES + R
DELEGATES_EVERY_S = 5.0  # how often the delegate processes are looked up again


def sample_rss(
    job: WatchedJob,
    samples: list[tuple[float, int, int]],
    stop: threading.Event,
    every_s: float,
    parts: list[tuple[float, int, tuple[int, ...]]],
) -> None:
    """(time, rank, rss KiB) of every rank process, every ``every_s`` seconds, until ``stop``; into
    ``parts`` the same with the RSS split (:data:`PARTS`)."""
    pids: dict[int, int] = {}
    helpers: dict[int, list[int]] = {}  # rank -> its delegate processes (root and delegates)
    looked = 0.0
    while not stop.is_set():
        now = time.monotonic()
        if len(pids) < RANKS or now - looked > DELEGATES_EVERY_S:  # delegates start and end with links
            found = job.processes()
            pids = {p.rank: p.pid for p in found if p.kind == "rank"}
            helpers = {}
            for p in found:
                if p.kind != "rank":
                    helpers.setdefault(p.rank, []).append(p.pid)
            looked = now
        for rank, pid in pids.items():
            status = proc_status(pid)
            if status.get("VmRSS"):
                split = tuple(int(status.get(k, "0 kB").split()[0]) for k in PARTS)
                samples.append((now, rank, split[0]))
                parts.append((now, rank, split))
        for rank, group in helpers.items():
            rss = [proc_status(pid).get("VmRSS") for pid in group]
            if all(rss):
                samples.append((now, DELEGATES + rank, sum(int(str(v).split()[0]) for v in rss)))
        stop.wait(every_s)


def write_samples(path: Path, parts: list[tuple[float, int, tuple[int, ...]]], seen: dict[int, float]) -> None:
    """The RSS samples as CSV: seconds since the first, the step the job was at, rank, :data:`PARTS`."""
    moments = sorted((t, s) for s, t in seen.items())
    t0 = parts[0][0] if parts else 0.0
    with open(path, "w") as fh:
        fh.write("t_s,step,rank," + ",".join(PARTS) + "\n")
        for t, rank, split in parts:
            k = bisect.bisect_right(moments, (t, 1 << 60)) - 1
            fh.write(f"{t - t0:.2f},{moments[k][1] if k >= 0 else 0},{rank}," + ",".join(map(str, split)) + "\n")


def rss_at(samples: list[tuple[float, int, int]], rank: int, t0: float, t1: float) -> float | None:
    """Median RSS (KiB) of ``rank``'s samples between ``t0`` and ``t1``."""
    xs = [rss for t, r, rss in samples if r == rank and t0 <= t <= t1]
    return statistics.median(xs) if xs else None


def slope_kb_per_step(
    samples: list[tuple[float, int, int]], rank: int, seen: dict[int, float], first: int, last: int
) -> float | None:
    """Least-squares slope (KiB per step) of ``rank``'s RSS against the step the job was at, over the
    samples taken while it ran steps ``first`` to ``last``."""
    steps = sorted(s for s in seen if first <= s <= last)
    if len(steps) < 2:
        return None
    moments = [seen[s] for s in steps]
    points = []
    for t, r, rss in samples:
        if r == rank and moments[0] <= t <= moments[-1]:
            k = bisect.bisect_right(moments, t) - 1
            points.append((float(steps[k]), float(rss)))
    if len(points) < 3 or len({x for x, _ in points}) < 2:
        return None
    slope, _ = statistics.linear_regression([x for x, _ in points], [y for _, y in points])
    return slope


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50, help="steps before the first RSS reading")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--transport", default="auto", choices=("default", "delegate", "auto"))
    parser.add_argument("--mean-ms", type=float, default=30.0, help="straggler delay mean (0: no stragglers)")
    parser.add_argument("--sample-s", type=float, default=0.25)
    parser.add_argument(
        "--window", type=int, default=50, help="steps whose RSS samples make one reading (their median)"
    )
    parser.add_argument("--dump", type=Path, default=None, help="run folder (default: a temporary one)")
    parser.add_argument("--samples", type=Path, default=None, help="write every RSS sample (split) to this CSV")
    parser.add_argument("extra", nargs="*", help="more overrides after --, e.g. -- --comm.trace_buf_size 0")
    opts = parser.parse_args(argv)
    if not 1 <= opts.window <= opts.steps // 4:
        parser.error(f"--window must be in 1..{opts.steps // 4} (a quarter of --steps {opts.steps})")
    if not 1 <= opts.warmup <= opts.steps - 2 * opts.window:
        parser.error(
            f"--warmup must be in 1..{opts.steps - 2 * opts.window} (steps {opts.steps}, window {opts.window})"
        )
    overrides = [
        "--training.local_batch_size",
        str(opts.microbatches),
        "--morph.transport",
        opts.transport,
        "--metrics.log_freq",
        "1",
    ]
    overrides += opts.extra
    if opts.mean_ms > 0:
        overrides += ["--morph.inject.mode", "random", "--morph.inject.random_mean_ms", f"{opts.mean_ms:g}"]
        overrides += ["--morph.inject.random_std_ms", f"{opts.mean_ms / 3:g}"]
    with tempfile.TemporaryDirectory(prefix="titan_morph_soak_") as tmp:
        dump = opts.dump or Path(tmp) / "soak"
        job = WatchedJob(SYNTHETIC, dump, RANKS, opts.steps, overrides, timeout_s=120 + 3.0 * opts.steps).start()
        samples: list[tuple[float, int, int]] = []
        parts: list[tuple[float, int, tuple[int, ...]]] = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample_rss, args=(job, samples, stop, opts.sample_s, parts), daemon=True)
        sampler.start()
        print(f"soak: {opts.steps} steps, {opts.microbatches} microbatches, transport {opts.transport}, {dump}")
        last = 0
        while job.running:
            seen = job.poll()
            step = max(seen, default=0)
            if step >= last + 50:
                last = step
                print(f"  step {step}/{opts.steps} ({time.monotonic() - job.started:.0f} s)", flush=True)
            time.sleep(0.2)
        stop.set()
        sampler.join(2.0)
        outcome = job.join()
        if not outcome.ok:
            print(f"soak run failed: {outcome.status()}\n{job.log()[-3000:]}")
            return 1
        seen = job.poll()
        tb = read_scalars(dump)
    if opts.samples is not None:
        write_samples(opts.samples, parts, seen)
    window = opts.window
    t_warm = (seen[opts.warmup], seen[opts.warmup + window])
    t_end = (seen[opts.steps - window], seen[opts.steps])
    half = max(opts.warmup, opts.steps // 2)
    exit_s = job.seconds_after(seen[opts.steps])
    per_rank, per_half, slopes = {}, {}, {}
    print(
        "\n| rank | RSS after warm-up (MB) | RSS at the end (MB) | growth (MB) | growth per step (KB) "
        f"| slope over steps {half}-{opts.steps} (KB/step) | that slope over {opts.steps - half} steps (MB) |"
    )
    print("|---|---|---|---|---|---|---|")
    helpers: dict[int, float] = {}
    for key in [*range(RANKS), *(DELEGATES + r for r in range(RANKS))]:
        warm, end = rss_at(samples, key, *t_warm), rss_at(samples, key, *t_end)
        if warm is None or end is None:
            continue
        growth = (end - warm) / 1024
        per_step = (end - warm) / max(1, opts.steps - opts.warmup - window)
        name = str(key) if key < DELEGATES else f"{key - DELEGATES}'s delegates (sum)"
        if key >= DELEGATES:
            helpers[key - DELEGATES] = growth
            print(f"| {name} | {warm / 1024:.1f} | {end / 1024:.1f} | {growth:+.2f} | {per_step:+.2f} | | |")
            continue
        per_rank[key] = growth
        slope = slope_kb_per_step(samples, key, seen, half, opts.steps)
        text = "n/a"
        if slope is not None:
            slopes[key], per_half[key] = slope, slope * (opts.steps - half) / 1024
            text = f"{slope:+.2f} | {per_half[key]:+.2f}"
        print(f"| {name} | {warm / 1024:.1f} | {end / 1024:.1f} | {growth:+.2f} | {per_step:+.2f} | {text} |")
    step_s = [v for s, v in tb.get("time_metrics/end_to_end(s)", {}).items() if s > opts.warmup]
    plan_changes = max(tb.get("morph/plan_changes", {0: 0.0}).values())
    failovers = max(tb.get("morph/failovers", {0: 0.0}).values())
    delegated = {
        tag.rsplit("link", 1)[1]: sum(1 for v in series.values() if v > 0)
        for tag, series in tb.items()
        if tag.startswith("morph/delegated/link")
    }
    summary = {
        "steps": opts.steps,
        "warmup": opts.warmup,
        "microbatches": opts.microbatches,
        "transport": opts.transport,
        "straggler_mean_ms": opts.mean_ms,
        "rss_growth_mb": round(max(per_rank.values()), 3) if per_rank else None,
        "rss_growth_mb_per_rank": {r: round(g, 3) for r, g in per_rank.items()},
        "second_half_mb": round(max(per_half.values()), 3) if per_half else None,
        "second_half_mb_per_rank": {r: round(g, 3) for r, g in per_half.items()},
        "slope_kb_per_step_per_rank": {r: round(g, 3) for r, g in slopes.items()},
        "delegates_growth_mb_per_rank": {r: round(g, 3) for r, g in helpers.items()},
        "exit_s": round(exit_s, 1),
        "plan_changes": int(plan_changes),
        "failovers": int(failovers),
        "delegated_steps_per_link": delegated,
        "step_ms_p50": round(percentile(step_s, 0.5) * 1e3, 1),
        "step_ms_p99": round(percentile(step_s, 0.99) * 1e3, 1),
        "wall_s": round(outcome.seconds, 1),
    }
    print(
        f"\nplan changes {summary['plan_changes']}, failovers {summary['failovers']}, steps with a delegated "
        f"link {delegated}; step time p50 {summary['step_ms_p50']} ms, p99 {summary['step_ms_p99']} ms; "
        f"{summary['exit_s']} s from the last step to the exit"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
