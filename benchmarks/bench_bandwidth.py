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

Exact optima (CP-SAT warm-started from the shortest baseline within the memory, never from the
planner under test) take a while; they are cached in ``--optima-cache`` (JSON keyed by the
instance). Every gap names its reference (:mod:`benchmarks.gaps`): the proven optimum where CP-SAT
proved one, else the best schedule known, reported as "not proven" with the proven bound beside it.

    python benchmarks/bench_bandwidth.py                 # everything
    python benchmarks/bench_bandwidth.py --count 24      # more held-out instances
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gaps import gap_cell, gap_row, header, optima, reference_line, references, within  # noqa: E402
from titan_morph.pipelining.core.model import CostModel  # noqa: E402
from titan_morph.pipelining.reference.instances import bandwidth_set, describe, random_instance  # noqa: E402
from titan_morph.pipelining.search.builders import build  # noqa: E402
from titan_morph.pipelining.search.driver import search_detailed  # noqa: E402
from titan_morph.pipelining.timing.simulate import makespan  # noqa: E402

TAUS = (15.0, 20.0, 25.0, 30.0)


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
    opt = optima(models, cache, limit_s)
    rows = [
        "| tau on link 2 | CP-SAT (proven optimum, or best found and bound) | PipeMorph planned for delay tau"
        " | PipeMorph, Alg. 2 + 3/4 (no search) | PipeMorph (search) | search / CP-SAT | ZB-H2 | CP-SAT warm start |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for tau, model in zip(TAUS, models):
        entry = opt[describe(model)]
        best = entry["makespan"]
        ours = _search(model)
        ref = f"{best:g}" if entry["optimal"] else f"{best:g}, not proven (bound {entry['bound']:g})"
        ratio = f"{ours / best:.3f}" + ("" if entry["optimal"] else " (to the best found)")
        old, plain, zb = _delay_only_plan(model), _no_search(model), _zb_h2(model)
        rows.append(f"| {tau:g} ms | {ref} | {old:g} | {plain:g} | {ours:g} | {ratio} | {zb:g} | {entry['hint']} |")
    return rows


def bench_held_out(seed: int, count: int, cache: Path, limit_s: float) -> list[str]:
    models = bandwidth_set(seed, count)
    opt = optima(models, cache, limit_s)
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
    valid = [spans[n] for n in planners if not n.startswith("ZB-H2")]  # within the memory budget
    refs = references(models, opt, valid)
    rows = [
        f"{count} held-out instances (bandwidth_set seed {seed}); {reference_line(refs, limit_s)}",
        "",
        *header("planner", refs, ("within 1 %", "within 3 %", "CPU ms per instance (median)")),
    ]
    for name in planners:
        extra = (
            within(spans[name], refs, 0.01),
            within(spans[name], refs, 0.03),
            f"{statistics.median(cpu[name]):.0f}",
        )
        rows.append(gap_row(name, spans[name], refs, extra))
    rows += [
        "",
        "| instance | CP-SAT best | proven bound | proven | reference | PipeMorph (search) | gap |",
        "|---|---:|---:|---|---:|---:|---|",
    ]
    for model, ref, ours in zip(models, refs, spans["PipeMorph (search, default iterations)"]):
        entry = opt[describe(model)]
        what = "optimum" if ref.proven else "best known"
        proof = "a plan meets the bound" if ref.by_bound else "yes" if ref.proven else "no"
        rows.append(
            f"| {describe(model)} | {entry['makespan']:g} | {ref.bound:g} | {proof}"
            f" | {ref.best:g} ({what}) | {ours:g} | {gap_cell(ours, ref)} |"
        )
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
