"""Two stages per rank (the V): PipeMorph-V against ZB-V, DualPipeV and one-stage PipeMorph.

Prints markdown tables of figures measured side by side in one run (no assertions; the tests
check correctness):

(a) simulation: R=4 ranks, N=16 microbatches, F=B=W=5 ms per stage, 0 / 30 / 60 ms on the last or
    the first link (non-blocking links, as the paper's §4 assumes): ZB-V and DualPipeV (torch's
    static orders, by the generator), PipeMorph-V planned for the delay (Alg. 2-V + the search,
    under ZB-V's activation memory) and one-stage PipeMorph (each rank one stage of both halves'
    layers, F=B=W=10 ms, planned for the delay under the same activation memory: R microbatches of
    two halves). Makespan, the speed-up over ZB-V, peak activations per rank (in half-stage units),
    planning time;
(b) the gap of PipeMorph-V (the default search) to the exact CP-SAT optimum on small V instances
    (R=2, 3; N=4..8; 20-60 ms on one link; ZB-V's memory), and CP-SAT's best schedule and bound for
    the instance of (a) within ``--exact-s`` seconds;
(c) with ``--testbed``: the synthetic testbed (``train_configs/synthetic_cpu.toml``, real 4-rank
    torchrun jobs, F=B=W=10 ms per stage padded on one device clock per rank, default blocking
    transport) for torch's ZBVZeroBubble and PipeMorphV, no delay and 60 ms on the last link:
    measured ``morph/pipeline_ms`` (median after ``--skip`` steps) against the simulator's
    prediction for the plan the job ran (same link model and queue depth).

    .venv/bin/python benchmarks/bench_vshape.py [--quick] [--exact-s 60] [--testbed] [--out table.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from titan_morph.pipelining.core.model import CostModel, Plan, in_flight_peak  # noqa: E402
from titan_morph.pipelining.schedules.baselines import zbv_memory  # noqa: E402
from titan_morph.pipelining.search.builders import build  # noqa: E402
from titan_morph.pipelining.timing.simulate import makespan  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
R, N, T = 4, 16, 5.0


def _cases() -> list[tuple[str, list[float]]]:
    out = [("no delay", [0.0, 0.0, 0.0])]
    for c in (30.0, 60.0):
        out.append((f"{c:g} ms last link", [0.0, 0.0, c]))
        out.append((f"{c:g} ms first link", [c, 0.0, 0.0]))
    return out


def _peak_units(plan: Plan) -> int:
    """Peak activations per rank in half-stage units (a one-stage microbatch holds two)."""
    scale = 1 if plan.model.stages_per_rank == 2 else 2
    return max(in_flight_peak(o) for o in plan.orders) * scale


def bench_simulation() -> list[str]:
    v = CostModel.uniform(2 * R, N, T, T, T, stages_per_rank=2)
    memory = zbv_memory(v)
    rows = [
        f"(a) Simulation, R={R} ranks, N={N}, F=B=W={T:g} ms per stage (V: 2 stages per rank), non-blocking"
        f" links; memory = ZB-V's peak {list(memory)} half-stage activations per rank.",
        "",
        "| case | ZB-V ms | DualPipeV ms | PipeMorph-V ms | one-stage PipeMorph ms | PipeMorph-V vs ZB-V |"
        " one-stage vs ZB-V | peak act./rank ZB-V / DualPipeV / PM-V / 1-stage | planning ms PM-V / 1-stage |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    zbv, dual = build("zb-v", v), build("dualpipe-v", v)
    for name, delays in _cases():
        model = v.with_delays(delays)
        t0 = time.perf_counter()
        pmv = build("pipemorph-v", model.with_memory(memory), search=True)
        t_v = (time.perf_counter() - t0) * 1e3
        one = CostModel.uniform(R, N, 2 * T, 2 * T, 2 * T, delays=delays, memory=R)
        t0 = time.perf_counter()
        pm1 = build("pipemorph", one, search=True)
        t_1 = (time.perf_counter() - t0) * 1e3
        a, b = makespan(model, zbv.orders), makespan(model, dual.orders)
        c, d = makespan(model, pmv.orders), makespan(one, pm1.orders)
        peaks = " / ".join(str(_peak_units(p)) for p in (zbv, dual, pmv, pm1))
        rows.append(
            f"| {name} | {a:.0f} | {b:.0f} | {c:.0f} | {d:.0f} | {a / c:.2f}x | {a / d:.2f}x | {peaks}"
            f" | {t_v:.0f} / {t_1:.0f} |"
        )
    return rows


def bench_gap(exact_s: float, quick: bool) -> list[str]:
    from benchmarks.gaps import Reference, gap_cell
    from titan_morph.pipelining.reference.exact import optimal_makespan
    from titan_morph.pipelining.search.driver import search_detailed

    small = [(2, 4, [20.0]), (2, 6, [30.0]), (2, 8, [60.0]), (3, 6, [30.0, 0.0]), (3, 6, [0.0, 30.0])]
    if not quick:
        small += [(3, 8, [0.0, 60.0]), (3, 8, [60.0, 0.0])]
    rows = [
        "(b) PipeMorph-V (default search) against CP-SAT, F=B=W=5 ms, ZB-V's memory; CP-SAT warm-started from"
        " the shortest V baseline (ZB-V / DualPipeV), never from PipeMorph-V. Gap: to the proven optimum, else"
        " 'not proven' against the best known (CP-SAT's or PipeMorph-V's) and the proven bound.",
        "",
        "| R | N | delays ms | ZB-V ms | PipeMorph-V ms | CP-SAT best ms | CP-SAT bound ms | proven | CP-SAT start"
        " | gap |",
        "|---:|---:|---|---:|---:|---:|---:|---|---|---|",
    ]
    proven_gaps, count, proven = [], 0, 0
    for ranks, n, delays in [*small, (R, N, [0.0, 0.0, 60.0]), (R, N, [60.0, 0.0, 0.0])]:
        model = CostModel.uniform(2 * ranks, n, T, T, T, delays=delays, stages_per_rank=2)
        model = model.with_memory(zbv_memory(model))
        found = search_detailed(model).makespan
        exact = optimal_makespan(model, time_limit_s=exact_s if ranks == R else min(exact_s, 60.0))
        best = exact.makespan if exact.optimal else min(exact.makespan, found)
        by_bound = not exact.optimal and best <= exact.lower_bound + 1e-9  # PipeMorph-V's plan meets the bound
        ref = Reference(best, exact.lower_bound, exact.optimal or by_bound, exact.hint, by_bound)
        if ranks < R:
            count += 1
            proven += ref.proven
            if ref.proven:
                proven_gaps.append(found / ref.best - 1)
        zb = makespan(model, build("zb-v", model).orders)
        proof = "PipeMorph-V meets the bound" if by_bound else "yes" if ref.proven else "no"
        rows.append(
            f"| {ranks} | {n} | {','.join(f'{d:g}' for d in delays)} | {zb:.0f} | {found:.0f} | {exact.makespan:.0f}"
            f" | {exact.lower_bound:.0f} | {proof}"
            f" | {exact.hint} | {gap_cell(found, ref)} |"
        )
    if proven_gaps:
        rows += [
            "",
            f"small instances: optimum proven on {proven} of {count}; PipeMorph-V's gap to it there: mean"
            f" {statistics.fmean(proven_gaps):+.2%}, max {max(proven_gaps):+.2%}",
        ]
    return rows


def bench_testbed(steps: int, skip: int, timeout: float) -> list[str]:
    from titan_morph.compare.results import read_scalars
    from titan_morph.compare.runner import run_checked
    from titan_morph.pipelining.core.links import StaticDelays
    from titan_morph.pipelining.timing.simulate import simulate
    from titan_morph.runtime.metrics import plan_scalar

    config = REPO / "train_configs" / "synthetic_cpu.toml"
    depth = 2  # synthetic_cpu.toml's link_queue_depth (default transport)
    rows = [
        f"(c) Synthetic testbed (train_configs/synthetic_cpu.toml, PP=4 x 2 stages, N=24, F=B=W=10 ms per stage,"
        f" default transport, link_queue_depth {depth}); median morph/pipeline_ms of steps {skip + 1}..{steps};"
        f" host load average at the start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.",
        "",
        "| case | schedule | measured pipeline_ms | predicted ms | error |",
        "|---|---|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench_vshape_") as tmp:
        for case, spec in (("no delay", "0,0,0"), ("60 ms last link", "0,0,60")):
            delays = tuple(float(d) for d in spec.split(","))
            for schedule, family in (("ZBVZeroBubble", "zb-v"), ("PipeMorphV", "pipemorph-v")):
                args = ["--training.steps", str(steps), "--parallelism.pipeline_parallel_schedule", schedule]
                args += ["--morph.memory_budget", "0", "--morph.adapt", "false"]
                if any(delays):
                    args += ["--morph.inject.mode", "static", "--morph.inject.delays_ms", spec]
                    if family == "pipemorph-v":
                        args += ["--morph.plan_delays_ms", spec, "--morph.search", "true"]
                plan = _testbed_plan(config, args, family)
                dump = Path(tmp) / f"{schedule}-{spec.replace(',', '_')}"
                run_checked(config, dump, args, timeout)
                tb = read_scalars(dump)
                kept = [v for s, v in sorted(tb["morph/pipeline_ms"].items()) if s > skip] if family != "zb-v" else []
                if family == "zb-v":  # torch's schedule keeps no records: TorchTitan's step time instead
                    kept = [1e3 * v for s, v in sorted(tb["time_metrics/end_to_end(s)"].items()) if s > skip]
                elif set(tb["morph/plan_id"].values()) != {plan_scalar(plan.plan_id)}:
                    raise RuntimeError(f"{schedule} {case}: the job ran another plan than {plan.plan_id}")
                measured = statistics.median(kept)
                links = StaticDelays(delays)
                predicted = simulate(plan.model.with_delays((0.0,) * 3), plan.orders, links=links, depth=depth).makespan
                rows.append(
                    f"| {case} | {schedule} | {measured:.0f} | {predicted:.0f} | {(measured / predicted - 1):+.1%} |"
                )
                print(rows[-1], flush=True)
    rows += ["", "(ZBVZeroBubble runs torch's schedule: its figure is TorchTitan's end-to-end step time.)"]
    return rows


def _testbed_plan(config: Path, args: list[str], family: str) -> Plan:
    """The plan the job runs: the same config through the same builder."""
    from torchtitan.config import ConfigManager

    from titan_morph.integration.plans import initial_plan

    cfg = ConfigManager().parse_args(["--job.config_file", str(config), *args])
    n = cfg.training.local_batch_size // cfg.parallelism.pipeline_parallel_microbatch_size
    return initial_plan(family, cfg.morph, 2 * cfg.parallelism.pipeline_parallel_degree, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer exact instances")
    parser.add_argument("--exact-s", type=float, default=60.0, help="CP-SAT time limit for the R=4 instance (s)")
    parser.add_argument("--skip-exact", action="store_true", help="no CP-SAT")
    parser.add_argument("--testbed", action="store_true", help="also run the synthetic testbed (minutes)")
    parser.add_argument("--steps", type=int, default=10, help="testbed: training steps per job")
    parser.add_argument("--skip", type=int, default=2, help="testbed: first steps left out of the median")
    parser.add_argument("--timeout", type=float, default=600, help="testbed: seconds per job")
    parser.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    opts = parser.parse_args()
    lines = bench_simulation()
    print("\n".join(lines), flush=True)
    if not opts.skip_exact:
        part = bench_gap(opts.exact_s, opts.quick)
        print("\n" + "\n".join(part), flush=True)
        lines += ["", *part]
    if opts.testbed:
        part = bench_testbed(opts.steps, opts.skip, opts.timeout)
        print("\n" + "\n".join(part), flush=True)
        lines += ["", *part]
    if opts.out:
        opts.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
