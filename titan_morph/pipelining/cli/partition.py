"""``python -m titan_morph.pipelining.partition``: the partition planner's command line.

Reads per-layer costs and per-rank speeds from ``--costs FILE`` (``{"layers": [{"name", "fwd",
"bwd", "wgt", "param_bytes", "act_bytes"}, ...], "rank_speed": [...]}``, :func:`partition.planner.problem_from_dict`),
finds the contiguous split with the shortest planned makespan (:func:`partition.planner.partition`) and
prints it beside the even split: a readable table, or ``--json`` with ``layers_per_stage``,
``makespan_ms``, ``even_layers_per_stage``, ``even_makespan_ms``, ``lower_bound_ms`` (the chosen
split's closed-form bound) and ``bound_ms`` (no split under any schedule is faster). The link and
schedule flags are the plan CLI's (:mod:`plan`), parsed by the same helpers; ``--stages`` counts
ranks R as there (the V schedules place 2R stages); ``--memory`` is bytes per rank. Bad input: one
``error:`` line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from titan_morph.pipelining.cli.args import Parser, UsageError, delays_arg, schedule_arg, transmit_arg, values_arg
from titan_morph.pipelining.cli.report import fmt_list
from titan_morph.pipelining.partition.planner import (
    REFINE,
    PartitionProblem,
    PartitionResult,
    SplitPlan,
    partition,
    problem_from_dict,
)
from titan_morph.pipelining.search.builders import SCHEDULES, V_SCHEDULES

PROG = "python -m titan_morph.pipelining.partition"


def build_parser() -> argparse.ArgumentParser:
    """The partition CLI's argument parser."""
    p = Parser(
        prog=PROG,
        description="Split the layers into contiguous pipeline stages so that the planned schedule is shortest on"
        " ranks of different speeds, within each rank's memory.",
        epilog="Example: %(prog)s --costs costs.json --stages 4 --microbatches 24 --json",
    )
    p.add_argument("--costs", required=True, metavar="FILE", help="JSON: per-layer costs (ms, bytes) and rank_speed")
    p.add_argument("--stages", type=int, help="pipeline ranks R (default: the number of rank_speed values)")
    p.add_argument("--microbatches", type=int, required=True, help="microbatches N per iteration")
    p.add_argument("--rank-speed", default=None, help="per-rank speed, overrides the file's: scalar or R values (> 0)")
    p.add_argument("--delays", default=None, help="latency c_i per link between ranks, ms: scalar or R-1 values")
    p.add_argument("--transmit-ms", default=None, metavar="T", help="transmit time per message per link, ms")
    p.add_argument(
        "--memory",
        default=None,
        help="bytes per rank for parameters + in-flight activations: scalar or R values (default: unbounded)",
    )
    p.add_argument(
        "--schedule",
        default="pipemorph",
        type=schedule_arg,
        metavar="NAME",
        help=f"the schedule to plan each split with: {', '.join(SCHEDULES)}; two stages per rank:"
        f" {', '.join(V_SCHEDULES)} (default pipemorph: the plan CLI's search)",
    )
    p.add_argument("--refine", type=int, default=REFINE, help=f"best candidates the full search plans ({REFINE})")
    p.add_argument("--max-splits", type=int, default=None, help="splits bounded at most (default: by size)")
    p.add_argument("--max-evaluations", type=int, default=None, help="candidate plans at most (default: by size)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        help="stop once no other split can be faster by more than this fraction (default 0: exact)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return p


def _problem(args: argparse.Namespace) -> PartitionProblem:
    try:
        with open(args.costs, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise UsageError(f"--costs: cannot read {args.costs}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--costs {args.costs}: not JSON: {exc}") from None
    if args.stages is not None and args.stages < 1:
        raise UsageError(f"--stages must be >= 1 rank, got {args.stages}")
    if args.microbatches < 1:
        raise UsageError(f"--microbatches must be >= 1, got {args.microbatches}")
    for flag, value in (
        ("--refine", args.refine),
        ("--max-splits", args.max_splits),
        ("--max-evaluations", args.max_evaluations),
    ):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if not 0 <= args.tolerance < 1:
        raise UsageError(f"--tolerance must be in [0, 1), got {args.tolerance:g}")
    speeds = None
    if args.rank_speed is not None:
        speeds = values_arg("--rank-speed", args.rank_speed, float, args.stages, 0.0)
    elif isinstance(data, dict) and isinstance(data.get("rank_speed"), list):
        speeds = tuple(data["rank_speed"])
    ranks = args.stages if args.stages is not None else (len(speeds) if speeds else 1)
    if speeds is not None and args.stages is not None and len(speeds) not in (1, ranks):
        raise UsageError(f"--costs {args.costs}: rank_speed has {len(speeds)} values, --stages {ranks} ranks")
    delays = delays_arg("--delays", args.delays, ranks - 1)
    for i, d in enumerate(delays):
        if math.isinf(d):
            raise UsageError(f"--delays: link {i} ({i}<->{i + 1}) is down (inf); no split can be planned across it")
    transmit = transmit_arg("--transmit-ms", args.transmit_ms, ranks - 1)
    memory = None if args.memory is None else values_arg("--memory", args.memory, float, ranks, 0.0)
    try:
        return problem_from_dict(
            data,
            microbatches=args.microbatches,
            ranks=ranks,
            rank_speed=speeds,
            schedule=args.schedule,
            delays=delays,
            transmit=transmit,
            memory=memory,
        )
    except ValueError as exc:
        raise UsageError(f"--costs {args.costs}: {exc}") from None


def report_json(problem: PartitionProblem, result: PartitionResult, planning_ms: float) -> dict[str, Any]:
    """The ``--json`` object."""
    best, even = result.best, result.even
    model = best.model
    return {
        "schedule": problem.schedule,
        "ranks": problem.ranks,
        "stages": problem.stages,
        "stages_per_rank": problem.stages_per_rank,
        "microbatches": problem.microbatches,
        "layers": len(problem.layers),
        "rank_speed": list(problem.rank_speed),
        "layers_per_stage": list(best.layers_per_stage),
        "stage_ranks": [problem.rank_of(s) for s in range(problem.stages)],
        "stage_layers": [[problem.layers[a].name, problem.layers[b - 1].name] for a, b in best.ranges],
        "fwd_ms": list(model.fwd),
        "bwd_ms": list(model.bwd),
        "wgt_ms": list(model.wgt),
        "memory_microbatches": None if model.memory is None else list(model.memory),
        "makespan_ms": best.makespan_ms,
        "lower_bound_ms": best.lower_bound_ms,
        "searched": best.searched,
        "plan_id": best.plan.plan_id,
        "warmup": list(best.plan.warmup),
        "even_layers_per_stage": None if even is None else list(even.layers_per_stage),
        "even_makespan_ms": None if even is None else even.makespan_ms,
        "even_lower_bound_ms": None if even is None else even.lower_bound_ms,
        "speedup": result.speedup,
        "bound_ms": result.bound_ms,
        "exact": result.exact,
        "splits_considered": result.splits_considered,
        "evaluations": result.evaluations,
        "planning_ms": planning_ms,
    }


def _describe(split: SplitPlan | None) -> str:
    if split is None:
        return "does not fit the memory"
    return f"{fmt_list(split.layers_per_stage)}: {split.makespan_ms:.1f} ms (bound {split.lower_bound_ms:.1f} ms)"


def summary(problem: PartitionProblem, result: PartitionResult, planning_ms: float) -> str:
    """The readable form."""
    best = result.best
    model = best.model
    shape = f"{problem.ranks} ranks" + (" x 2 stages (V)" if problem.stages_per_rank == 2 else "")
    lines = [
        f"partition for {problem.schedule}: {len(problem.layers)} layers on {shape},"
        f" rank speeds {fmt_list(problem.rank_speed)}, N={problem.microbatches}",
        "",
        "stage  rank  layers  first..last" + " " * 20 + "t^F ms   t^B ms   t^W ms  M_r",
    ]
    for s, (a, b) in enumerate(best.ranges):
        names = f"{problem.layers[a].name}..{problem.layers[b - 1].name}"
        mem = "-" if model.memory is None else str(model.memory[problem.rank_of(s)])
        lines.append(
            f"{s:>5}  {problem.rank_of(s):>4}  {b - a:>6}  {names:<31}{model.fwd[s]:>7.2f}  {model.bwd[s]:>7.2f}"
            f"  {model.wgt[s]:>7.2f}  {mem:>3}"
        )
    speedup = "" if result.speedup is None else f" ({result.speedup:.2f}x the even split)"
    if best.searched:
        how = "the search"
    elif best.makespan_ms <= best.lower_bound_ms * (1 + 1e-9):
        how = f"{best.plan.schedule}, at the bound"
    else:
        how = best.plan.schedule
    lines += [
        "",
        f"makespan {best.makespan_ms:.1f} ms{speedup}, plan {best.plan.plan_id} by {how};"
        f" closed-form bound of this split {best.lower_bound_ms:.1f} ms",
        f"even split {_describe(result.even)}",
        f"no split under any schedule below {result.bound_ms:.1f} ms;"
        f" {'exact' if result.exact else 'cut by --max-splits/--max-evaluations'}:"
        f" {result.splits_considered} split(s) bounded, {result.evaluations} planned, {planning_ms:.0f} ms",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 2 bad input)."""
    try:
        args = build_parser().parse_args(argv)
        problem = _problem(args)
        start = time.perf_counter()
        try:
            result = partition(
                problem,
                refine=args.refine,
                max_splits=args.max_splits,
                max_evaluations=args.max_evaluations,
                tolerance=args.tolerance,
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        planning_ms = (time.perf_counter() - start) * 1000.0
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.json:
            print(json.dumps(report_json(problem, result, planning_ms)))
        else:
            print(summary(problem, result, planning_ms))
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
