"""What the planning command line (:mod:`.cli`) prints: a readable summary or ``--json``, from one
:class:`PlannedRun` (the plan, its simulated run and the settings used)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from titan_morph.pipelining.core.links import LinkModel
from titan_morph.pipelining.core.model import Plan, in_flight_peak
from titan_morph.pipelining.schedules.slackness import tolerance_ms


def fmt_list(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def summary(out: PlannedRun) -> str:
    plan, result, planned, run, args = out.plan, out.result, out.planned, out.run_delays, out.args
    model = plan.model
    v = model.stages_per_rank > 1
    shape = (
        f"R={model.ranks} ranks x 2 stages (V: rank r runs stages r and {2 * model.ranks - 1}-r)"
        if v
        else f"S={model.stages} stages"
    )
    lines = [
        f"schedule {plan.schedule}: {shape}, N={model.microbatches} microbatches, plan {plan.plan_id}",
        f"  t^F {fmt_list(model.fwd)} ms, t^B {fmt_list(model.bwd)} ms, t^W {fmt_list(model.wgt)} ms;"
        f" transport {'non-blocking' if args.depth is None else f'blocking, depth {args.depth}'}",
        *(
            [
                f"  links: one message at a time per direction, transmit {fmt_list(model.transmit)} ms per message"
                f" planned, {fmt_list(out.run_transmit)} ms run (then the latency c_i)"
            ]
            if model.has_transmit or any(t > 0 for t in out.run_transmit)
            else []
        ),
        "",
        ("rank  stages   x_s  " if v else "stage  x_i  ") + "M_i  peak  busy ms  bubble  blocked ms",
    ]
    for r, order in enumerate(plan.orders):
        busy = sum(t.end - t.start for t in result.timings[r])
        mem = "-" if model.memory is None else str(model.memory[r])
        own = model.rank_stages(r)
        head = (
            f"{r:>4}  {','.join(map(str, own)):>6}  {','.join(str(plan.warmup[q]) for q in own):>4}"
            if v
            else f"{r:>5}  {plan.warmup[r]:>3}"
        )
        lines.append(
            f"{head}  {mem:>3}  {in_flight_peak(order):>4}  {busy:>7.1f}"
            f"  {result.bubble_rate[r]:>6.1%}  {result.blocked_ms[r]:>10.1f}"
        )
    if model.num_links > 0:
        lines += [
            "",
            "link  " + ("Δ (hops)" if v else "Δ_i") + "  Eq.1 tolerance ms  planned c_i  run c_i  absorbed (Eq. 1)",
        ]
        for i in range(model.num_links):
            tol = tolerance_ms(model, plan.warmup, i)
            cost = run[i] + (out.run_transmit[i] if out.run_transmit else 0.0)  # a message's least cost
            ok = "yes" if cost <= tol + 1e-9 else "NO"
            hops = model.link_hops(i)
            delta = ",".join(str(plan.slackness[h]) for h in hops)
            width = 8 if v else 3
            lines.append(f"{i:>4}  {delta:>{width}}  {tol:>17.1f}  {model.delays[i]:>11g}  {run[i]:>7g}  {ok}")
    lines += [
        "",
        f"makespan {result.makespan:.1f} ms under "
        + (f"run delays {fmt_list(run)} ms" if out.links is None else out.links_text + f" (at t=0: {fmt_list(run)} ms)")
        + f" (planned {planned:.1f} ms under {fmt_list(model.delays)} ms);"
        f" mean bubble rate {result.mean_bubble_rate:.1%}",
        *(
            [f"expected makespan {out.expected_makespan:.1f} ms over {len(args.planning_samples)} planning samples"]
            if out.expected_makespan is not None
            else []
        ),
        f"lower bound on any schedule under these delays {out.lower_bound:.1f} ms"
        f" (this plan: {result.makespan - out.lower_bound:+.1f} ms)",
        f"planning took {out.planning_ms:.1f} ms",
        "critical path:",
        *("  " + line.strip() for line in result.explain().splitlines()),
    ]
    return "\n".join(lines)


def report_json(out: PlannedRun, files: dict[str, str]) -> dict[str, Any]:
    plan, result, planned, run, args = out.plan, out.result, out.planned, out.run_delays, out.args
    model = plan.model
    return {
        "schedule": plan.schedule,
        "stages": model.stages,
        "ranks": model.ranks,
        "stages_per_rank": model.stages_per_rank,
        "stage_ranks": [model.rank_of(s) for s in range(model.stages)],
        "microbatches": model.microbatches,
        "fwd_ms": list(model.fwd),
        "bwd_ms": list(model.bwd),
        "wgt_ms": list(model.wgt),
        "delays_ms": list(model.delays),
        "run_delays_ms": list(run),
        "transmit_ms": list(model.transmit),
        "run_transmit_ms": list(out.run_transmit),
        "run_links": out.links_text or "static",
        "step": args.step,
        "memory": None if model.memory is None else list(model.memory),
        "depth": args.depth,
        "warmup": list(plan.warmup),
        "slackness": list(plan.slackness),
        "tolerance_ms": [tolerance_ms(model, plan.warmup, i) for i in range(model.num_links)],
        "plan_id": plan.plan_id,
        "planned_makespan_ms": planned,
        "makespan_ms": result.makespan,
        "bubble_rate": result.mean_bubble_rate,
        "stage_bubble_rate": list(result.bubble_rate),
        "blocked_ms": list(result.blocked_ms),
        "peak_in_flight": [in_flight_peak(o) for o in plan.orders],
        "orders": plan.orders_json(),
        "planning_ms": out.planning_ms,
        "search_iterations": args.search_iterations,
        "planning_samples": None if args.planning_samples is None else len(args.planning_samples),
        "expected_makespan_ms": out.expected_makespan,
        "lower_bound_ms": out.lower_bound,
        "files": files,
    }


@dataclass
class PlannedRun:
    """What one CLI invocation computed: the plan, its simulated run and the settings used."""

    plan: Plan
    result: Any  # simulate.SimResult under the run delays / run link model
    planned: float  # makespan of the same orders under the planning delays
    run_delays: tuple[float, ...]  # static run delays, or the run link model's delays at t = 0
    links: LinkModel | None  # the time-varying run link model, None for static delays
    links_text: str
    args: argparse.Namespace
    planning_ms: float = 0.0  # wall time spent building the plan (0 for --load-csv)
    expected_makespan: float | None = None  # mean makespan over the planning samples (random planning)
    lower_bound: float = 0.0  # no schedule (within the memory budget) beats this under the run's delays
    run_transmit: tuple[float, ...] = ()  # per-message transmit times per link the run executes under


def print_report(out: PlannedRun, files: dict[str, str]) -> None:
    from titan_morph.pipelining.output import export

    if out.args.json:
        print(json.dumps(report_json(out, files)))
    else:
        print(summary(out))
        if out.args.show_orders:
            print("\norders:\n" + export.format_orders(out.plan.orders), end="")
        for kind, path in files.items():
            print(f"wrote {kind}: {path}")
