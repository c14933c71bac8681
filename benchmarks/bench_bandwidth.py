"""Bandwidth benchmark: PipeMorph under links with a per-message transmit time (size / rate, one
message at a time per direction), side by side with the exact CP-SAT optimum of the same model.

Prints markdown tables (no assertions; tests/pipelining/test_bandwidth.py checks correctness):

(a) the reference table: S = 4, N = 24, F = B = W = 10 ms, transmit tau on the last link, memory
    unbounded: the optimum, PipeMorph planned for a delay tau (the delay-only model: the old plans),
    PipeMorph planned under the bandwidth model (Alg. 2 + Alg. 3/4 alone, and with the search), ZB-H2;
(b) held-out random instances (``instances.bandwidth_set``: S 3–5, N 8–24, one or two slow links with
    transmit 12–30 ms and latency 0–20 ms, memory tight / loose / unbounded): gap to the optimum,
    mean and worst, per planner, and by memory mode;
(c) planning_ms of the default search for S = 8, N = 32 (delay-only, and a slow link with a transmit
    time), against the 250 ms budget.

Exact optima (CP-SAT warm-started from 1F1B, independent of the planner under test) take a while;
they are cached in ``--optima-cache`` (JSON keyed by the instance). Where CP-SAT does not prove
its optimum within the limit, the reference is the best schedule known (CP-SAT's or a planner's),
and the proven bound is shown beside it.

    python benchmarks/bench_bandwidth.py                 # everything
    python benchmarks/bench_bandwidth.py --count 24      # more held-out instances
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from titan_morph.pipelining.builders import build  # noqa: E402
from titan_morph.pipelining.instances import bandwidth_set, describe, random_instance  # noqa: E402
from titan_morph.pipelining.model import CostModel  # noqa: E402
from titan_morph.pipelining.search import search_detailed  # noqa: E402
from titan_morph.pipelining.simulate import makespan  # noqa: E402

TAUS = (15.0, 20.0, 25.0, 30.0)


def _optima(models: list[CostModel], cache: Path, limit_s: float) -> dict[str, dict[str, float]]:
    from titan_morph.pipelining.exact import optimal_makespan

    known = json.loads(cache.read_text()) if cache.exists() else {}
    for model in models:
        key = describe(model)
        if key in known and (known[key]["optimal"] or known[key]["limit"] >= limit_s):
            continue
        # Warm-started from 1F1B, not from the planner under test, so that the reference is independent.
        hint = build("1f1b-iw", model).orders
        res = optimal_makespan(model, time_limit_s=limit_s, workers=2, hint=hint)
        known[key] = {"makespan": res.makespan, "bound": res.lower_bound, "optimal": res.optimal, "limit": limit_s}
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(known, indent=1))
    return known


def _delay_only_plan(model: CostModel) -> float:
    """PipeMorph planned with each link's transmit time taken as a delay (the old model), executed
    under the bandwidth model."""
    as_delay = model.with_delays([c + t for c, t in zip(model.delays, model.transmit)]).with_transmit(0.0)
    return makespan(model, search_detailed(as_delay).plan.orders)


def _zb_h2(model: CostModel) -> float:
    plain = model.with_transmit(0.0).with_delays([0.0] * model.num_links).with_memory(None)
    return makespan(model, build("zb-h2", plain).orders)


def _no_search(model: CostModel) -> float:
    return makespan(model, build("pipemorph", model).orders)


def _search(model: CostModel) -> float:
    return search_detailed(model).makespan


def bench_table(cache: Path, limit_s: float) -> list[str]:
    models = [CostModel.uniform(4, 24, 10, 10, 10, transmit=(0.0, 0.0, tau)) for tau in TAUS]
    opt = _optima(models, cache, limit_s)
    rows = [
        "| tau on link 2 | CP-SAT optimum | PipeMorph planned for delay tau | PipeMorph, Alg. 2 + 3/4 (no search)"
        " | PipeMorph (search) | ratio to optimum | ZB-H2 |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for tau, model in zip(TAUS, models):
        best = opt[describe(model)]["makespan"]
        ours = _search(model)
        proven = "" if opt[describe(model)]["optimal"] else " (not proven)"
        old, plain, zb = _delay_only_plan(model), _no_search(model), _zb_h2(model)
        rows.append(f"| {tau:g} ms | {best:g}{proven} | {old:g} | {plain:g} | {ours:g} | {ours / best:.3f} | {zb:g} |")
    return rows


def bench_held_out(seed: int, count: int, cache: Path, limit_s: float) -> list[str]:
    models = bandwidth_set(seed, count)
    opt = _optima(models, cache, limit_s)
    planners: dict[str, Callable[[CostModel], float]] = {
        "PipeMorph (search, default iterations)": _search,
        "PipeMorph, Alg. 2 + Alg. 3/4 (no search)": _no_search,
        "PipeMorph planned for latency + transmit as a delay": _delay_only_plan,
        "ZB-H2 (no memory cap applied)": _zb_h2,
    }
    spans: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for name, fn in planners.items():
        for model in models:
            c0 = time.process_time()
            spans.setdefault(name, []).append(fn(model))
            cpu.setdefault(name, []).append((time.process_time() - c0) * 1e3)
    valid = [name for name in planners if not name.startswith("ZB-H2")]  # within the memory budget
    best = [min(opt[describe(m)]["makespan"], *(spans[n][i] for n in valid)) for i, m in enumerate(models)]
    bound = [opt[describe(m)]["bound"] for m in models]
    proven = sum(bool(opt[describe(m)]["optimal"]) for m in models)
    rows = [
        f"{count} held-out instances (bandwidth_set seed {seed}); reference: the CP-SAT optimum ({proven}/{count}"
        f" proven within {limit_s:g} s, else the best schedule known)",
        "",
        "| planner | mean gap | worst gap | within 1 % | within 3 % | mean gap to the proven bound"
        " | CPU ms per instance (median) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in planners:
        g = [ms / b - 1 for ms, b in zip(spans[name], best)]
        to_bound = statistics.mean(ms / b - 1 for ms, b in zip(spans[name], bound))
        rows.append(
            f"| {name} | {100 * statistics.mean(g):.2f} % | {100 * max(g):.2f} % | {sum(x <= 0.01 for x in g)}/{count}"
            f" | {sum(x <= 0.03 for x in g)}/{count} | {100 * to_bound:.2f} % | {statistics.median(cpu[name]):.0f} |"
        )
    rows += [
        "",
        "| instance | best known (CP-SAT) | proven bound | PipeMorph (search) | gap |",
        "|---|---:|---:|---:|---:|",
    ]
    for model, b, lb, ours in zip(models, best, bound, spans["PipeMorph (search, default iterations)"]):
        rows.append(f"| {describe(model)} | {b:g} | {lb:g} | {ours:g} | {100 * (ours / b - 1):.2f} % |")
    return rows


def bench_speed(reps: int) -> list[str]:
    rows = [f"| S=8 N=32 | wall ms (median of {reps}) | budget |", "|---|---:|---:|"]
    for memory in ("loose", "tight"):
        base = random_instance(random.Random(3), s_range=(8, 8), n_mult=(4, 4), memory=memory)
        slow = base.with_transmit([0.0, 0.0, 0.0, 25.0, 0.0, 0.0, 12.0])
        for label, model in (("delay-only", base), ("transmit 25 / 12 ms on links 3 / 6", slow)):
            walls = []
            for _ in range(reps):
                t0 = time.perf_counter()
                build("pipemorph", model, search=True)
                walls.append((time.perf_counter() - t0) * 1e3)
            rows.append(f"| {memory} memory, {label}, default search | {statistics.median(walls):.0f} | 250 |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=11, help="held-out instance seed (default: %(default)s)")
    parser.add_argument("--count", type=int, default=16, help="held-out instances (default: %(default)s)")
    parser.add_argument("--exact-time-limit", type=float, default=60.0, help="seconds per exact solve")
    parser.add_argument("--optima-cache", type=Path, default=Path("benchmarks/results/bandwidth_optima.json"))
    parser.add_argument("--reps", type=int, default=5, help="repetitions of the planning_ms measurement")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: table,held-out,speed")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    if "table" not in skip:
        print("## (a) S=4, N=24, F=B=W=10 ms, transmit tau on the last link (ms)\n")
        print("\n".join(bench_table(args.optima_cache, args.exact_time_limit)) + "\n")
    if "held-out" not in skip:
        print("## (b) held-out instances of the bandwidth model\n")
        print("\n".join(bench_held_out(args.seed, args.count, args.optima_cache, args.exact_time_limit)) + "\n")
    if "speed" not in skip:
        print("## (c) planning_ms\n")
        print("\n".join(bench_speed(args.reps)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
