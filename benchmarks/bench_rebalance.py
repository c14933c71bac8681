"""A slow DP replica: microbatches moved between replicas against the even split, as ratios.

train_configs/hybrid_cpu.toml with N = 8 per replica: DP 2 x PP 2 on 4 CPU ranks (gloo), the
synthetic testbed's F = B = W = 10 ms ops, the topology orchestrator on. Rank 3 (stage 1 of
replica 1) computes ``factor`` times slower from step 4 to the end. One invocation runs, one job
at a time:

* ``undisturbed``: no straggler (``rebalance_microbatches`` on: it must never move anything);
* per factor (2 and 1.5), ``even`` (``rebalance_microbatches = false``) and ``rebalanced``.

It prints the steady step time (TorchTitan's ``time_metrics/end_to_end(s)``, median of the steps
after the move has settled), the split the rebalanced run chose, its first uneven step, the
ratios even / rebalanced and X / undisturbed, the bound microbatches / speed predicts, and whether
every run's losses equal the undisturbed run's (1e-5 relative). Run it under the heavy-work lock:

    flock /tmp/tm-heavy.lock .venv/bin/python benchmarks/bench_rebalance.py [--factors 2,1.5] [--no-run]

About 4 minutes on a 2-core host. DP 2 x PP 4 needs 8 ranks: not on a 2-core host.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from titan_morph.compare.results import LOSS_TAG, STEP_TIME_TAG, read_scalars
from titan_morph.compare.runner import run_command, run_job
from titan_morph.monitor.rebalance import pace, split_by_speed

CONFIG = Path("train_configs/hybrid_cpu.toml")
RANKS, N, STEPS, START = 4, 8, 24, 4
STEADY = range(12, STEPS + 1)
SPLIT = "morph/microbatches/replica"
BASE = ["--training.local_batch_size", str(N)]


def _slow(factor: float) -> list[str]:
    factors = ",".join(["1"] * (RANKS - 1) + [f"{factor:g}"])
    return ["--morph.inject.mode", "static", "--morph.inject.compute_factor", factors, "--morph.inject.start_step", "4"]


def _runs(factors: list[float]) -> dict[str, list[str]]:
    out = {"undisturbed": list(BASE)}
    for f in factors:
        out[f"{f:g}/even"] = [*BASE, *_slow(f), "--morph.rebalance_microbatches", "false"]
        out[f"{f:g}/rebalanced"] = [*BASE, *_slow(f)]
    return out


def _run(logdir: Path, name: str, overrides: list[str]) -> None:
    dump = logdir / name
    command = run_command(CONFIG, dump, RANKS, STEPS, overrides)
    print("+", " ".join(command[command.index("titan_morph.train") :]), flush=True)
    outcome = run_job(command, dump, variant=name, case="rebalance", timeout_s=400)
    if not outcome.ok:
        raise SystemExit(f"{name}: {outcome.status()}")


def _steady_ms(scalars: dict[str, dict[int, float]]) -> float:
    return statistics.median(scalars[STEP_TIME_TAG][s] for s in STEADY) * 1e3


def _same_losses(a: dict[int, float], b: dict[int, float]) -> bool:
    return sorted(a) == sorted(b) == list(range(1, STEPS + 1)) and all(abs(a[s] - b[s]) <= 1e-5 * abs(b[s]) for s in a)


def report(logdir: Path, factors: list[float]) -> list[str]:
    base = read_scalars(logdir / "undisturbed")
    t_base = _steady_ms(base)
    moved = max(base.get("morph/rebalances", {0: 0.0}).values())
    lines = [
        f"DP 2 x PP 2, N = {N} per replica, F = B = W = 10 ms, rank 3 slow from step {START}; steady = median of"
        f" steps {STEADY.start}-{STEADY.stop - 1} of {STEPS}",
        f"undisturbed: {t_base:.0f} ms per step, rebalances {moved:g}",
    ]
    for f in factors:
        even, reb = read_scalars(logdir / f"{f:g}/even"), read_scalars(logdir / f"{f:g}/rebalanced")
        t_even, t_reb = _steady_ms(even), _steady_ms(reb)
        counts = tuple(int(reb[f"{SPLIT}{k}"][STEPS]) for k in range(2))
        first = min((s for s, v in reb[f"{SPLIT}1"].items() if v != N), default=None)
        best = split_by_speed((1.0, 1.0 / f), 2 * N, 2 * N - 1)
        bound = pace((N, N), (1.0, 1.0 / f)) / pace(best, (1.0, 1.0 / f))
        same = _same_losses(even[LOSS_TAG], base[LOSS_TAG]) and _same_losses(reb[LOSS_TAG], base[LOSS_TAG])
        lines += [
            f"factor {f:g}: even {t_even:.0f} ms ({t_even / t_base:.2f}x undisturbed), rebalanced {t_reb:.0f} ms"
            f" ({t_reb / t_base:.2f}x undisturbed); split {list(counts)} from step {(first or 0) + 1}",
            f"  even / rebalanced = {t_even / t_reb:.2f} (microbatches / speed bound {bound:.2f});"
            f" losses equal the undisturbed run's: {same}",
        ]
    if 2.0 in factors:
        even, reb = (_steady_ms(read_scalars(logdir / f"2/{v}")) for v in ("even", "rebalanced"))
        lines.append(f"acceptance: even / rebalanced at factor 2 = {even / reb:.2f} >= 1.35: {even / reb >= 1.35}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logdir", type=Path, default=Path("outputs/results/rebalance"))
    ap.add_argument("--factors", default="2,1.5", help="comma-separated compute factors of rank 3")
    ap.add_argument("--no-run", action="store_true", help="only read a finished log directory")
    args = ap.parse_args(argv)
    factors = [float(f) for f in args.factors.split(",")]
    if not args.no_run:
        for name, overrides in _runs(factors).items():
            _run(args.logdir, name, overrides)
    print("\n".join(report(args.logdir, factors)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
