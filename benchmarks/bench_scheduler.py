"""Scheduler benchmark: speed, search gain over Alg. 2, optimality gap vs the exact CP-SAT optimum.

Prints measured figures as compact markdown tables (no assertions; the tests check correctness).
Mirrors the paper's §7.4 / Fig. 20 (gap to an MILP optimum and solving time) on random
heterogeneous instances from ``titan_morph.pipelining.reference.instances``.

    python benchmarks/bench_scheduler.py            # full run (exact part takes minutes)
    python benchmarks/bench_scheduler.py --quick    # fewer instances, shorter exact time limit
    python benchmarks/bench_scheduler.py --seed 7 --skip-exact
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import timed  # noqa: E402
from titan_morph.pipelining.core.model import CostModel  # noqa: E402
from titan_morph.pipelining.reference.instances import random_instance  # noqa: E402
from titan_morph.pipelining.schedules.generate import generate  # noqa: E402
from titan_morph.pipelining.schedules.slackness import adapted_warmup  # noqa: E402
from titan_morph.pipelining.search.driver import search_detailed  # noqa: E402
from titan_morph.pipelining.timing.simulate import makespan  # noqa: E402


def _fixed(stages: int, microbatches: int, seed: int) -> CostModel:
    return random_instance(
        random.Random(seed), s_range=(stages, stages), n_mult=(microbatches / stages,) * 2, memory="loose"
    )


def alg2_makespan(model: CostModel) -> float:
    """Plain PipeMorph: Alg. 2 warm-up (slackness.adapted_warmup) + Alg. 3/4 generator, simulated."""
    return makespan(model, generate(model, adapted_warmup(model)))


def paper_alg2_warmup(model: CostModel) -> tuple[int, ...]:
    """Alg. 2 exactly as printed (line 7: floor, t^F_i + t^B_{i+1}, clip by N − 2S), then made
    feasible: Δ_i >= 0 (Lemma 1) and x_i <= min(M_j, N) for j <= i."""
    s_count, n = model.stages, model.microbatches
    x = [1] * s_count
    for i in range(s_count - 2, -1, -1):
        ratio = (model.fwd[i] + model.bwd[i + 1] + 2 * model.delays[i]) / (model.fwd[i + 1] + model.bwd[i + 1])
        delta = max(0, min(n - 2 * s_count, max(int(ratio), 2)))
        x[i] = x[i + 1] + delta
    cap = n
    for s in range(s_count):
        cap = min(cap, model.budget(s))
        x[s] = min(x[s], cap)
    return tuple(x)


def paper_alg2_makespan(model: CostModel) -> float:
    return makespan(model, generate(model, paper_alg2_warmup(model)))


def bench_speed(seed: int, quick: bool) -> list[str]:
    rows = ["| measurement | wall ms (median) | CPU ms (median) |", "|---|---:|---:|"]
    small = _fixed(8, 32, seed)
    big = _fixed(32, 256, seed)
    x_small = adapted_warmup(small)
    reps = 5 if quick else 11
    w, c = timed(lambda: generate(small, x_small), reps)
    rows.append(f"| one generation pass (Alg. 3/4), S=8 N=32 | {w:.2f} | {c:.2f} |")
    w, c = timed(lambda: makespan(small, generate(small, x_small)), reps)
    rows.append(f"| generation + simulated makespan, S=8 N=32 | {w:.2f} | {c:.2f} |")
    w, c = timed(lambda: search_detailed(small), reps)
    rows.append(f"| pipemorph with search, S=8 N=32 | {w:.1f} | {c:.1f} |")
    w, c = timed(lambda: search_detailed(big), 1 if quick else 3)
    rows.append(f"| pipemorph with search, S=32 N=256 | {w:.0f} | {c:.0f} |")
    return rows


def bench_gain(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    ratios: dict[str, list[float]] = {"Alg. 2 (slackness.adapted_warmup)": [], "Alg. 2 as printed": []}
    for _ in range(count):
        model = random_instance(rng, s_range=(3, 8), n_mult=(1, 4), memory="mixed")
        found = search_detailed(model).makespan
        ratios["Alg. 2 (slackness.adapted_warmup)"].append(found / alg2_makespan(model))
        ratios["Alg. 2 as printed"].append(found / paper_alg2_makespan(model))
    rows = [
        f"{count} instances; ratio = search makespan / baseline makespan (lower is better)",
        "",
        "| baseline | mean ratio | min ratio (best gain) | max ratio | search strictly better |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, rs in ratios.items():
        better = sum(r < 1 - 1e-9 for r in rs)
        rows.append(f"| {name} | {statistics.mean(rs):.4f} | {min(rs):.4f} | {max(rs):.4f} | {better}/{count} |")
    return rows


def bench_gap(seed: int, count: int, time_limit_s: float) -> list[str]:
    from benchmarks.gaps import Reference, gap_row, header, within
    from titan_morph.pipelining.reference.exact import optimal_makespan

    rng = random.Random(seed)
    spans: dict[str, list[float]] = {"search": [], "Alg. 2 (adapted_warmup)": [], "Alg. 2 as printed": []}
    refs, walls = [], []
    for k in range(count):
        memory = "tight" if k % 2 == 0 else "loose"
        model = random_instance(rng, s_range=(3, 5), n_mult=(1, 3), memory=memory)
        ref = optimal_makespan(model, time_limit_s=time_limit_s)
        walls.append(ref.wall_s)
        found = (search_detailed(model).makespan, alg2_makespan(model), paper_alg2_makespan(model))
        for name, ms in zip(spans, found):
            spans[name].append(ms)
        best = ref.makespan if ref.optimal else min(ref.makespan, *found)  # the best known when not proven
        refs.append(Reference(best, ref.lower_bound, ref.optimal, ref.hint))
    rows = [*header("scheduler", refs, ("instances within 1 %",))]
    rows += [gap_row(name, ms, refs, (within(ms, refs, 0.01),)) for name, ms in spans.items()]
    return [
        *rows,
        "",
        f"exact (CP-SAT, {time_limit_s:g} s limit, 2 workers, warm start from a baseline, never the search):"
        f" proved optimal {sum(r.proven for r in refs)}/{count}, the rest against the best known;"
        f" median solve {statistics.median(walls):.1f} s, max {max(walls):.1f} s",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer instances and a shorter exact time limit")
    parser.add_argument("--seed", type=int, default=20261121, help="instance seed (default: %(default)s)")
    parser.add_argument("--skip-exact", action="store_true", help="skip the CP-SAT optimality-gap part")
    parser.add_argument("--gap-instances", type=int, default=None, help="instances for the gap part")
    parser.add_argument("--exact-time-limit", type=float, default=None, help="seconds per exact solve")
    args = parser.parse_args(argv)
    gain_count = 20 if args.quick else 60
    gap_count = args.gap_instances or (8 if args.quick else 30)
    limit = args.exact_time_limit or (10.0 if args.quick else 60.0)

    print(f"## Scheduler benchmark (seed {args.seed}{', quick' if args.quick else ''})\n")
    print("### (a) speed\n")
    print("\n".join(bench_speed(args.seed, args.quick)))
    print("\n### (b) search gain over plain Alg. 2 (S 3-8, N S..4S, delays 0-60 ms, mixed memory)\n")
    print("\n".join(bench_gain(args.seed + 1, gain_count)))
    if not args.skip_exact:
        try:
            import ortools  # noqa: F401
        except ImportError:
            print("\n(c) skipped: OR-Tools not installed (pip install ortools)")
            return 0
        print("\n### (c) gap to the exact optimum (S 3-5, N S..3S, tight+loose memory)\n")
        print("\n".join(bench_gap(args.seed + 2, gap_count, limit)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
