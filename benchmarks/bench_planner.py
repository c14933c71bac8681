"""Planner benchmark: planning time, gap to the exact optimum, anytime behaviour, robust planning.

Prints measured figures as markdown tables, side by side in one run (no assertions; the tests check
correctness):

(a) planning_ms: PipeMorph without search and with the default search (S=8, N=32 and S=32, N=256);
(b) the gap table: the default search (and fewer iterations, the plain builders) against the exact
    CP-SAT optimum on random instances (``instances.planner_set``: S 3–6, N S..3S, heterogeneous
    F/I/W, delays 0–3×t^F, memory tight / loose / one budget for all);
(c) mean gap against the iteration count (monotone by construction);
(d) robust planning: expected makespan under N(30,10) ms on every link, on held-back samples, of the
    plan for the distribution vs the plan for the mean delay, memory loose and tight;
(e) the synthetic testbed's Fig. 18 trace B in the simulator (PP=4, N=24, F=B=W=10 ms, every link
    N(30,10) ms re-drawn every U(100,200) ms, 40 steps): ZB-H2 / PipeMorph, planning for the mean
    vs for the distribution, and ZB-H2 / the lower bound on any schedule (the most a plan could gain).

Exact optima take minutes; they are cached in ``--optima-cache`` (JSON keyed by the instance).
CP-SAT starts from the shortest baseline within the memory, never from the search's plan, and every
gap names its reference (:mod:`benchmarks.gaps`): the proven optimum, else the best schedule known.

    python benchmarks/bench_planner.py                  # everything (exact part: minutes, cached)
    python benchmarks/bench_planner.py --quick          # fewer instances and repetitions
    python benchmarks/bench_planner.py --skip-exact     # no CP-SAT
    python benchmarks/bench_planner.py --skip speed,robust,testbed   # the gap tables only
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gaps import gap_row, header, optima, reference_line, references, within  # noqa: E402
from benchmarks.timing import timed  # noqa: E402
from titan_morph.pipelining.core.model import CostModel, Plan  # noqa: E402
from titan_morph.pipelining.core.stragglers import RandomDelays  # noqa: E402
from titan_morph.pipelining.reference.instances import planner_set, random_instance  # noqa: E402
from titan_morph.pipelining.search.builders import build  # noqa: E402
from titan_morph.pipelining.search.driver import default_iterations, search_detailed  # noqa: E402
from titan_morph.pipelining.search.robust import expected_makespan, robust_search, sample_delays  # noqa: E402
from titan_morph.pipelining.timing.bounds import lower_bound_under  # noqa: E402
from titan_morph.pipelining.timing.simulate import makespan  # noqa: E402


def bench_speed(seed: int, quick: bool) -> list[str]:
    rows = [
        "| planning | default iterations | wall ms (median) | CPU ms (median) | target |",
        "|---|---:|---:|---:|---:|",
    ]
    for stages, n, reps, targets in (
        (8, 32, 3 if quick else 7, ("20", "250")),
        (32, 256, 1 if quick else 3, ("—", "1000")),
    ):
        for memory in ("loose", "tight"):
            model = random_instance(
                random.Random(seed), s_range=(stages, stages), n_mult=(n / stages,) * 2, memory=memory
            )
            w, c = timed(lambda model=model: build("pipemorph", model), reps)
            rows.append(f"| S={stages} N={n} {memory} memory, no search | 0 | {w:.1f} | {c:.1f} | {targets[0]} |")
            w, c = timed(lambda model=model: build("pipemorph", model, search=True), reps)
            rows.append(
                f"| S={stages} N={n} {memory} memory, default search | {default_iterations(model)} | {w:.0f} | {c:.0f}"
                f" | {targets[1]} |"
            )
    return rows


def _best_baseline(model: CostModel) -> float:
    spans = []
    for name in ("1f1b", "zb-h1", "zb-h2"):
        try:
            spans.append(makespan(model, build(name, model).orders))
        except ValueError:  # the warm-up does not fit the memory budget
            continue
    return min(spans)


def bench_gap(seed: int, count: int, cache: Path, limit_s: float) -> tuple[list[str], list[str]]:
    models = planner_set(seed, count)
    opt = optima(models, cache, limit_s)
    runs: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}

    def record(name: str, fn: Callable[[CostModel], float]) -> None:
        for model in models:
            c0 = time.process_time()
            runs.setdefault(name, []).append(fn(model))
            cpu.setdefault(name, []).append((time.process_time() - c0) * 1e3)

    record("PipeMorph, default search", lambda m: search_detailed(m).makespan)
    for k in (0, 30, 100, 300, 1000, 3000):
        record(f"search, {k} iterations", lambda m, k=k: search_detailed(m, iterations=k).makespan)
    record("PipeMorph, no search (Alg. 1/2 + Alg. 3/4)", lambda m: makespan(m, build("pipemorph", m).orders))
    record("best of 1F1B / ZB-H1 / ZB-H2 within memory", _best_baseline)
    refs = references(models, opt, list(runs.values()))

    table = [
        f"{count} instances (seed {seed}); {reference_line(refs, limit_s)}",
        "",
        *header("planner", refs, ("within 0.5 %", "within 2 %", "CPU ms per instance (median)")),
    ]
    for name in (
        "PipeMorph, default search",
        "PipeMorph, no search (Alg. 1/2 + Alg. 3/4)",
        "best of 1F1B / ZB-H1 / ZB-H2 within memory",
    ):
        extra = (within(runs[name], refs, 0.005), within(runs[name], refs, 0.02), f"{statistics.median(cpu[name]):.0f}")
        table.append(gap_row(name, runs[name], refs, extra))
    anytime = header("iterations", refs, ("CPU ms per instance (median)",))
    for k in (0, 30, 100, 300, 1000, 3000):
        name = f"search, {k} iterations"
        anytime.append(gap_row(str(k), runs[name], refs, (f"{statistics.median(cpu[name]):.0f}",)))
    return table, anytime


ROBUST_CASES: dict[str, CostModel] = {
    "S=4 N=12 F=B=W=10, no memory cap": CostModel.uniform(4, 12, 10, 10, 10),
    "S=4 N=12 F=B=W=10, M=6": CostModel.uniform(4, 12, 10, 10, 10, memory=6),
    "S=4 N=24 F=B=W=10 (testbed), no cap": CostModel.uniform(4, 24, 10, 10, 10),
    "S=4 N=24 F=B=W=10 (testbed), M=7": CostModel.uniform(4, 24, 10, 10, 10, memory=7),
    "S=8 N=24 F=B=W=10, no memory cap": CostModel.uniform(8, 24, 10, 10, 10),
    "S=8 N=24 F=B=W=10, M=10": CostModel.uniform(8, 24, 10, 10, 10, memory=10),
}


def bench_robust(samples: int, held_back: int) -> list[str]:
    rows = [
        f"Every link N(30, 10) ms. Plans from {samples} samples (seed 1); expected makespan over {held_back}"
        " held-back samples (seed 2); default iterations.",
        "",
        "| pipeline | ZB-H2 ms | plan for the mean ms | plan for N(30,10) ms | mean / robust"
        " | planning ms (mean, robust) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, model in ROBUST_CASES.items():
        links = model.stages - 1
        train = sample_delays(30.0, 10.0, links=links, samples=samples, seed=1)
        test = sample_delays(30.0, 10.0, links=links, samples=held_back, seed=2)
        w0 = time.perf_counter()
        for_mean = build("pipemorph", model.with_delays((30.0,) * links), search=True)
        w1 = time.perf_counter()
        robust = robust_search(model, train).plan
        w2 = time.perf_counter()
        try:
            zb = f"{expected_makespan(model, build('zb-h2', model).orders, test):.1f}"
        except ValueError:
            zb = "(over M)"
        a = expected_makespan(model, for_mean.orders, test)
        b = expected_makespan(model, robust.orders, test)
        rows.append(
            f"| {name} | {zb} | {a:.1f} | {b:.1f} | {a / b:.3f} | {1e3 * (w1 - w0):.0f}, {1e3 * (w2 - w1):.0f} |"
        )
    return rows


def _trace_b(model: CostModel, plan: Plan, depth: int | None, seed: int, steps: int) -> tuple[float, float]:
    """(mean step time of fixed orders, mean lower bound on any schedule at the same step starts)
    over ``steps`` consecutive steps under Fig. 18 trace B."""
    links = RandomDelays(model.stages - 1, 30.0, 10.0, (100.0, 200.0), seed=seed)
    t0, spans, bounds = 0.0, [], []
    for step in range(steps):
        span = makespan(model, plan.orders, links=links, depth=depth, t0=t0, step=step)
        spans.append(span)
        bounds.append(lower_bound_under(model, links, step=step, t0=t0))
        t0 += span
    return statistics.fmean(spans), statistics.fmean(bounds)


def bench_testbed(steps: int, seeds: int) -> list[str]:
    model = CostModel.uniform(4, 24, 10, 10, 10)
    zb = build("zb-h2", model)
    for_mean = build("pipemorph", model.with_delays((30.0, 30.0, 30.0)), search=True)
    robust = robust_search(model, sample_delays(30.0, 10.0, links=3, samples=32, seed=1)).plan
    rows = [
        f"PP=4, N=24, F=B=W=10 ms; {steps} consecutive steps per seed, seeds 1..{seeds}; ZB-H2 on the NCCL-like"
        " blocking transport (depth 2, as in synthetic_cpu.toml), PipeMorph non-blocking (delegated). The lower"
        " bound (`timing.bounds.lower_bound_under`) holds for any schedule at the robust plan's step starts: ZB-H2 /"
        " it is the most any plan could gain.",
        "",
        "| plan | x_i | mean step ms | ZB-H2 / it |",
        "|---|---|---:|---:|",
    ]
    zb_ms = statistics.fmean(_trace_b(model, zb, 2, s, steps)[0] for s in range(1, seeds + 1))
    rows.append(f"| ZB-H2 | {','.join(map(str, zb.warmup))} | {zb_ms:.0f} | 1.000 |")
    bound = math.nan
    for name, plan in (
        ("PipeMorph planned for the mean (30 ms)", for_mean),
        ("PipeMorph planned for N(30,10)", robust),
    ):
        runs = [_trace_b(model, plan, None, s, steps) for s in range(1, seeds + 1)]
        ms = statistics.fmean(r[0] for r in runs)
        rows.append(f"| {name} | {','.join(map(str, plan.warmup))} | {ms:.0f} | {zb_ms / ms:.3f} |")
        if plan is robust:  # the bound at the robust plan's step starts
            bound = statistics.fmean(r[1] for r in runs)
    rows.append(f"| lower bound, any schedule | | {bound:.0f} | {zb_ms / bound:.3f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer instances and repetitions")
    parser.add_argument("--seed", type=int, default=3, help="instance seed of the gap table (default: %(default)s)")
    parser.add_argument("--gap-instances", type=int, default=None, help="instances in the gap table (default 60)")
    parser.add_argument("--skip-exact", action="store_true", help="skip the gap table (needs OR-Tools)")
    parser.add_argument("--exact-time-limit", type=float, default=40.0, help="seconds per exact solve (default 40)")
    parser.add_argument(
        "--optima-cache",
        type=Path,
        default=Path("outputs/bench_planner/optima_{seed}.json"),
        help="JSON cache of exact optima (default: %(default)s)",
    )
    parser.add_argument("--skip", default="", help="comma list of parts to skip: speed,robust,testbed")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    count = args.gap_instances or (20 if args.quick else 60)
    load = os.getloadavg()[0]
    print(f"## Planner benchmark (seed {args.seed}{', quick' if args.quick else ''}; load average {load:.2f})\n")
    if "speed" not in skip:
        print("### (a) planning time\n")
        print("\n".join(bench_speed(args.seed, args.quick)))
    if not args.skip_exact:
        try:
            import ortools  # noqa: F401
        except ImportError:
            print("\n(b, c) skipped: OR-Tools not installed (pip install ortools)")
        else:
            cache = Path(str(args.optima_cache).format(seed=args.seed))
            table, anytime = bench_gap(args.seed, count, cache, args.exact_time_limit)
            print("\n### (b) gap to the exact optimum (S 3-6, N S..3S, delays 0-3×t^F, tight/loose/one budget)\n")
            print("\n".join(table))
            print("\n### (c) anytime: mean gap against the iteration count\n")
            print("\n".join(anytime))
    if "robust" not in skip:
        print("\n### (d) robust planning vs planning for the mean\n")
        print("\n".join(bench_robust(32, 300 if args.quick else 1000)))
    if "testbed" not in skip:
        print("\n### (e) Fig. 18 trace B on the synthetic testbed, in the simulator\n")
        print("\n".join(bench_testbed(20 if args.quick else 40, 2 if args.quick else 4)))
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
