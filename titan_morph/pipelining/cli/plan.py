"""The planning command line, ``python -m titan_morph.pipelining.plan`` (or ``.cli.plan``): build (or
load) a pipeline schedule and show how it runs.

Plans a schedule for the *planning* delays (``--delays``: what a profiler measured) or for a
delay distribution (``--plan-random MEAN,STD``: the lowest expected makespan over sampled delay
vectors, :mod:`robust`), then executes
the resulting fixed orders under the *run* delays (``--run-delays``, default = planning delays) in
the simulator, so one can ask e.g. "ZB-H2 planned for no delay, executed with a 20 ms straggler on
link 0" (paper Fig. 5: 390 ms → 440 ms) or "what does PipeMorph plan instead" (Eq. 1, Alg. 1–4).

Two stages per rank (``--schedule zb-v|dualpipe-v|pipemorph-v``, ``--stages-per-rank 2``): the V
placement of torch's ZB-V and DualPipeV, rank r running stages r and 2R−1−r. ``--stages`` then
counts ranks R; ``--fwd``/``--bwd``/``--wgt`` take one value or 2R (per stage), ``--delays`` R−1
(per link between ranks) and ``--memory`` R (per rank, both stages together; pipemorph-v defaults
to what ZB-V holds). Orders print in torch's action notation with the stage (``5F3``).

Outputs: a readable summary (warm-up x_i, slackness Δ_i and the Eq. 1 tolerance per link,
makespan, bubble rates, critical path), or ``--json``; optionally torch's compute-only CSV
(``--csv``, loadable by ``_PipelineScheduleRuntime._load_csv`` / TorchTitan's
``pipeline_parallel_schedule_csv``), a timeline PNG and a Chrome trace. ``--load-csv`` simulates
an existing torch CSV instead of building one. Bad arguments print one error line, exit code 2.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from titan_morph.pipelining.cli.args import Parser, UsageError, delays_arg, schedule_arg, transmit_arg, values_arg
from titan_morph.pipelining.cli.report import PlannedRun, fmt_list, print_report
from titan_morph.pipelining.core.links import LinkDownError, LinkModel, WithTransmit
from titan_morph.pipelining.core.model import STAGES_PER_RANK, CostModel, Plan, validate_orders, warmup_counts
from titan_morph.pipelining.core.stragglers import RandomDelays, TraceDelays
from titan_morph.pipelining.schedules.baselines import zbv_memory
from titan_morph.pipelining.search.builders import SCHEDULES, V_SCHEDULES
from titan_morph.pipelining.timing.bounds import lower_bound_ms, lower_bound_under

PROG = "python -m titan_morph.pipelining.plan"


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser (also used to render the usage text in docs)."""
    p = Parser(
        prog=PROG,
        description="Build a pipeline schedule (1F1B, ZeroBubble or PipeMorph's slackness-aware plan) for "
        "given per-stage compute times and link delays, then simulate it under the actual delays.",
        epilog="Example: %(prog)s --stages 4 --microbatches 12 --fwd 10 --bwd 10 --wgt 10 "
        "--schedule zb-h2 --run-delays 20,0,0 --png zb.png",
    )
    g = p.add_argument_group("pipeline and profile")
    g.add_argument(
        "--stages",
        type=int,
        help="pipeline ranks R (one stage each, or two with --stages-per-rank 2); inferred with --load-csv",
    )
    g.add_argument(
        "--stages-per-rank",
        type=int,
        default=None,
        metavar="{1,2}",
        help="stages per rank: 1, or 2 for the V of zb-v/dualpipe-v/pipemorph-v (default: what --schedule needs)",
    )
    g.add_argument("--microbatches", type=int, help="microbatches N per iteration; inferred with --load-csv")
    g.add_argument(
        "--fwd", default="10", help="t^F per stage, ms: scalar or comma list of one value per stage (default 10)"
    )
    g.add_argument("--bwd", default="10", help="t^B (backward input, op I) per stage, ms (default 10)")
    g.add_argument("--wgt", default="10", help="t^W (backward weight, op W) per stage, ms (default 10)")
    g.add_argument(
        "--delays", default=None, help="planning delay c_i per link between ranks, ms: scalar or R-1 values (default 0)"
    )
    g.add_argument(
        "--run-delays",
        default=None,
        help="actual per-link delays (ms) to execute the orders under; 'inf' = link down (default: --delays)",
    )
    g.add_argument(
        "--run-random",
        metavar="MEAN,STD,LOW,HIGH[,SEED]",
        help="execute under §7.2 random stragglers instead: every link's delay ~ N(MEAN, STD) ms, re-drawn"
        " every U(LOW, HIGH) ms (deterministic for SEED, default 0)",
    )
    g.add_argument(
        "--run-trace",
        metavar="PATH",
        help="execute under a delay trace CSV (columns step|time_ms, link, delay_ms[, direction]; core/stragglers.py)",
    )
    g.add_argument(
        "--transmit-ms",
        default=None,
        metavar="T",
        help="planning transmit time per message per link, ms (size / rate: the link sends one message at a time per"
        " direction, in issue order; --delays is then the latency): scalar or R-1 values (default 0 = delay-only)",
    )
    g.add_argument(
        "--run-transmit-ms",
        default=None,
        metavar="T",
        help="actual transmit time per message per link to execute under, ms (default: --transmit-ms)",
    )
    g.add_argument("--step", type=int, default=0, help="training step the run is at, for --run-trace by step")
    g.add_argument(
        "--memory",
        default=None,
        help="max microbatches in flight per rank M_r: scalar or R values (pipemorph-v default: ZB-V's)",
    )
    g.add_argument(
        "--depth",
        type=int,
        default=None,
        help="blocking link queue depth (NCCL-like head-of-line blocking); default: non-blocking transport",
    )
    s = p.add_argument_group("schedule")
    s.add_argument(
        "--schedule",
        default=None,
        type=schedule_arg,
        metavar="NAME",
        help=f"schedule to build: {', '.join(SCHEDULES)}; two stages per rank: {', '.join(V_SCHEDULES)}"
        " (any case; '-'/'_' optional, e.g. ZBH2; default pipemorph, or pipemorph-v with --stages-per-rank 2)",
    )
    s.add_argument("--no-search", action="store_true", help="pipemorph: plain Alg. 1/2 warm-up + Alg. 3/4, no search")
    s.add_argument(
        "--search-iterations",
        type=int,
        default=None,
        metavar="N",
        help="pipemorph: search iterations; fixes the plan (default: a fixed amount of work per schedule size)",
    )
    s.add_argument(
        "--search-ms", type=float, default=None, help="pipemorph: cap on the search's wall time in ms (default: none)"
    )
    s.add_argument(
        "--plan-random",
        metavar="MEAN,STD",
        help="pipemorph: plan for random delays, every link ~ N(MEAN, STD) ms: the lowest mean makespan over"
        " --samples delay vectors drawn with --seed (excludes --delays)",
    )
    s.add_argument(
        "--plan-samples",
        metavar="PATH",
        help="pipemorph: plan for the delay vectors in PATH (one line per vector, S-1 comma-separated ms)",
    )
    s.add_argument("--samples", type=int, default=32, metavar="K", help="vectors drawn for --plan-random (default 32)")
    s.add_argument("--seed", type=int, default=0, help="seed of the --plan-random draws (default 0)")
    s.add_argument("--load-csv", metavar="PATH", help="simulate an existing torch compute-only CSV instead of building")
    p.set_defaults(planning_samples=None)
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    o.add_argument("--show-orders", action="store_true", help="also print the step x rank order grid")
    o.add_argument("--csv", metavar="PATH", help="write torch's compute-only schedule CSV")
    o.add_argument("--png", metavar="PATH", help="write a timeline picture of the simulated run")
    o.add_argument("--chrome-trace", metavar="PATH", help="write a Chrome/Perfetto trace of the simulated run")
    o.add_argument("--title", default=None, help="title of the PNG")
    return p


# ---------------------------------------------------------------------------------------------
# Argument checking: each message names the setting and the allowed range.
# ---------------------------------------------------------------------------------------------


def _placement(args: argparse.Namespace, given: int | None = None) -> int:
    """Stages per rank: ``--stages-per-rank``, else what the schedule (or ``given``: a CSV) needs."""
    need = given if given is not None else 2 if args.schedule in V_SCHEDULES else 1
    spr: int | None = args.stages_per_rank
    if spr is None:
        return need
    if spr not in STAGES_PER_RANK:
        raise UsageError(f"--stages-per-rank must be 1 or 2 (2 = the V of zb-v/dualpipe-v/pipemorph-v), got {spr}")
    if spr != need:
        what = f"--load-csv {args.load_csv}" if given is not None else f"--schedule {args.schedule}"
        raise UsageError(f"--stages-per-rank {spr} disagrees with {what}, which has {need} stage(s) per rank")
    return spr


def _model(
    args: argparse.Namespace, ranks: int, microbatches: int, per_rank: int = 1
) -> tuple[CostModel, tuple[float, ...], tuple[float, ...]]:
    """The planning cost model, the run delays and the run transmit times, from the flags (with
    --plan-random/--plan-samples the planning delays are the samples' per-link mean)."""
    if ranks < 1:
        raise UsageError(f"--stages must be >= 1, got {ranks}")
    if microbatches < 1:
        raise UsageError(f"--microbatches must be >= 1, got {microbatches}")
    stages = ranks * per_rank
    links = ranks - 1
    delays = delays_arg("--delays", args.delays, links)
    for i, d in enumerate(delays):
        if math.isinf(d):
            raise UsageError(
                f"--delays: link {i} ({i}<->{i + 1}) is down (inf); no schedule can be planned across a down link"
                " (use --run-delays to see a plan fail at run time, or re-partition the stages)"
            )
    samples = _planning_samples(args, links)
    if samples is not None:
        delays = tuple(sum(v[i] for v in samples) / len(samples) for i in range(links))
    args.planning_samples = samples
    run = delays if args.run_delays is None else delays_arg("--run-delays", args.run_delays, links)
    transmit = transmit_arg("--transmit-ms", args.transmit_ms, links)
    run_transmit = transmit
    if args.run_transmit_ms is not None:
        run_transmit = transmit_arg("--run-transmit-ms", args.run_transmit_ms, links)
    if args.depth is not None and args.depth < 1:
        raise UsageError(
            f"--depth must be >= 1 message in flight per link (omit it for non-blocking), got {args.depth}"
        )
    memory = None if args.memory is None else values_arg("--memory", args.memory, int, ranks, per_rank)
    model = CostModel(
        stages,
        microbatches,
        values_arg("--fwd", args.fwd, float, stages, 0.0),
        values_arg("--bwd", args.bwd, float, stages, 0.0),
        values_arg("--wgt", args.wgt, float, stages, 0.0),
        delays,
        memory or None,
        per_rank,
        transmit,
    )
    if model.memory is None and args.schedule == "pipemorph-v":
        model = model.with_memory(zbv_memory(model))  # compared with ZB-V on the memory ZB-V holds
    return model, run, run_transmit


def _given(args: argparse.Namespace, flags: Sequence[str]) -> list[str]:
    """The ``flags`` set on the command line (value not None)."""
    return [f for f in flags if getattr(args, f.lstrip("-").replace("-", "_")) is not None]


def _exclusive(args: argparse.Namespace, flags: Sequence[str], what: str) -> None:
    chosen = _given(args, flags)
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} exclude each other ({what})")


def _planning_samples(args: argparse.Namespace, links: int) -> tuple[tuple[float, ...], ...] | None:
    """The delay vectors to plan for (--plan-random draws or --plan-samples lines), or None."""
    from titan_morph.pipelining.search.robust import sample_delays

    _exclusive(args, ("--delays", "--plan-random", "--plan-samples"), "one planning delay model")
    if args.plan_random is not None:
        if args.samples < 1:
            raise UsageError(f"--samples must be >= 1 delay vector, got {args.samples}")
        values = values_arg("--plan-random", args.plan_random, float, None, 0.0) if args.plan_random else ()
        if len(values) != 2:
            raise UsageError(f"--plan-random: expected MEAN,STD (ms, >= 0), got {args.plan_random!r}")
        return sample_delays(values[0], values[1], links=links, samples=args.samples, seed=args.seed)
    if args.plan_samples is not None:
        try:
            lines = Path(args.plan_samples).read_text().splitlines()
        except OSError as exc:
            raise UsageError(f"--plan-samples: cannot read {args.plan_samples}: {exc.strerror}") from None
        rows = []
        for k, line in enumerate(lines, start=1):
            if line.strip() and not line.lstrip().startswith("#"):
                row = values_arg(f"--plan-samples {args.plan_samples} line {k}", line, float, links, 0.0)
                rows.append(row)
        if not rows:
            raise UsageError(f"--plan-samples {args.plan_samples}: no delay vectors (one line of {links} ms each)")
        return tuple(rows)
    return None


def _run_links(args: argparse.Namespace, links: int) -> tuple[LinkModel | None, str]:
    """The time-varying link model to execute under (``None`` = static ``--run-delays``) and its description."""
    _exclusive(args, ("--run-delays", "--run-random", "--run-trace"), "one run link model")
    if args.step < 0:
        raise UsageError(f"--step must be >= 0, got {args.step}")
    if args.run_random is not None:
        values = values_arg("--run-random", args.run_random, float, None, None) if args.run_random else ()
        if len(values) not in (4, 5):
            raise UsageError(f"--run-random: expected MEAN,STD,LOW,HIGH[,SEED], got {len(values)} values")
        if len(values) == 5 and not (values[4] >= 0 and values[4].is_integer()):
            raise UsageError(f"--run-random: SEED must be an integer >= 0, got {values[4]:g}")
        seed = int(values[4]) if len(values) == 5 else 0
        values = values[:4]
        mean, std, low, high = values
        model: LinkModel
        try:
            model = RandomDelays(links, mean, std, (low, high), seed=seed)
        except ValueError as exc:
            raise UsageError(f"--run-random: {exc}") from None
        return model, f"random N({mean:g}, {std:g}) ms every U({low:g}, {high:g}) ms, seed {seed}"
    if args.run_trace is not None:
        try:
            model = TraceDelays.from_csv(args.run_trace, links)
        except OSError as exc:
            raise UsageError(f"--run-trace: cannot read {args.run_trace}: {exc.strerror}") from None
        except (ValueError, KeyError) as exc:
            raise UsageError(f"--run-trace {args.run_trace}: {exc}") from None
        return model, f"trace {args.run_trace} at step {args.step}"
    return None, ""


def _build(args: argparse.Namespace, model: CostModel) -> tuple[Plan, float]:
    """Call the builders (Alg. 1–4 + search for pipemorph; fixed warm-ups for the baselines);
    returns the plan and the milliseconds spent planning."""
    from titan_morph.pipelining.search import builders

    kw: dict[str, Any] = {}
    samples = args.planning_samples
    morph = args.schedule in ("pipemorph", "pipemorph-v")
    searching = morph and not args.no_search
    search_flags = _given(args, ("--search-ms", "--search-iterations", "--plan-random", "--plan-samples"))
    if not morph and (args.no_search or search_flags):
        flags = "/".join(["--no-search"] * args.no_search + search_flags)
        raise UsageError(f"{flags} apply to --schedule pipemorph and pipemorph-v only, not {args.schedule}")
    if search_flags and not searching:
        raise UsageError(f"{'/'.join(search_flags)} need the search (drop --no-search)")
    if args.search_ms is not None and not args.search_ms > 0:
        raise UsageError(f"--search-ms must be > 0 ms, got {args.search_ms:g}")
    if args.search_iterations is not None and args.search_iterations < 0:
        raise UsageError(f"--search-iterations must be >= 0, got {args.search_iterations}")
    if samples is not None and args.depth is not None:
        raise UsageError("--plan-random/--plan-samples plan for the non-blocking transport: drop --depth")
    if searching:
        # search.search (or robust.robust_plan): best makespan under the planning delays and transport.
        kw.update(search=True)
        if samples is not None:
            kw["samples"] = samples
        else:
            kw["depth"] = args.depth
        if args.search_ms is not None:
            kw["time_budget_ms"] = args.search_ms
        if args.search_iterations is not None:
            kw["iterations"] = args.search_iterations
    try:
        start = time.perf_counter()
        plan = builders.build(args.schedule, model, **kw)
        return plan, (time.perf_counter() - start) * 1000.0
    except ValueError as exc:
        flag = f"--memory {args.memory}" if args.memory is not None and "memory" in str(exc) else "--schedule"
        raise UsageError(f"{flag}: {exc}") from None


def _load(args: argparse.Namespace) -> tuple[Plan, tuple[float, ...], tuple[float, ...]]:
    from titan_morph.pipelining.output.export import read_csv

    try:
        orders = read_csv(args.load_csv)
    except OSError as exc:
        raise UsageError(f"--load-csv: cannot read {args.load_csv}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"--load-csv: {exc}") from None
    ranks = len(orders)
    per_rank = _placement(args, 2 if any(op.stage is not None for order in orders for op in order) else 1)
    microbatches = 1 + max(op.mb for order in orders for op in order)
    if args.stages is not None and args.stages != ranks:
        raise UsageError(f"--stages {args.stages} disagrees with --load-csv {args.load_csv}: it has {ranks} ranks")
    if args.microbatches is not None and args.microbatches != microbatches:
        raise UsageError(
            f"--microbatches {args.microbatches} disagrees with --load-csv {args.load_csv}: it has {microbatches}"
        )
    if args.schedule is not None:
        raise UsageError("--schedule and --load-csv exclude each other (the CSV is the schedule)")
    model, run, run_transmit = _model(args, ranks, microbatches, per_rank)
    try:
        validate_orders(model, orders)
    except ValueError as exc:
        raise UsageError(f"--load-csv {args.load_csv}: {exc}") from None
    return Plan(f"csv:{Path(args.load_csv).name}", warmup_counts(model, orders), orders, model), run, run_transmit


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------


def run(argv: Sequence[str] | None = None) -> PlannedRun:
    """Parse ``argv``, build or load the plan and simulate it; raises :class:`UsageError` on bad input."""
    from titan_morph.pipelining.timing.simulate import DeadlockError, simulate

    args = build_parser().parse_args(argv)
    planning_ms = 0.0
    if args.load_csv:
        plan, run_delays, run_transmit = _load(args)
    else:
        if args.stages is None or args.microbatches is None:
            raise UsageError("--stages and --microbatches are required (unless --load-csv gives them)")
        args.schedule = args.schedule or ("pipemorph-v" if args.stages_per_rank == 2 else "pipemorph")
        model, run_delays, run_transmit = _model(args, args.stages, args.microbatches, _placement(args))
        plan, planning_ms = _build(args, model)
    links, links_text = _run_links(args, plan.model.num_links)
    if links is not None:
        run_delays = links.snapshot(0.0, args.step)
        if any(t > 0 for t in run_transmit):  # latency from the time-varying model, bandwidth on top
            links = WithTransmit(links, run_transmit)
            links_text += f", transmit {fmt_list(run_transmit)} ms per message"
    try:
        planned = simulate(plan.model, plan.orders, depth=args.depth).makespan
    except DeadlockError as exc:
        raise UsageError(f"the orders deadlock: {exc}") from None
    flag = "--run-delays" if links is None else "--run-random" if args.run_random else "--run-trace"
    try:
        # With a link model the simulator asks it for every message; model.delays are only the t=0 view.
        run_model = plan.model.with_delays(run_delays).with_transmit(run_transmit)
        result = simulate(run_model, plan.orders, links=links, depth=args.depth, step=args.step)
    except LinkDownError as exc:
        raise UsageError(f"{flag}: {exc}: the iteration cannot complete") from None
    expected = None
    if args.planning_samples is not None:
        from titan_morph.pipelining.search.robust import expected_makespan

        expected = expected_makespan(plan.model, plan.orders, args.planning_samples)
    if links is None:  # static: the closed form, which also counts the memory budget
        bound = lower_bound_ms(run_model)
    else:
        bound = lower_bound_under(plan.model, links, step=args.step)
    return PlannedRun(
        plan, result, planned, tuple(run_delays), links, links_text, args, planning_ms, expected, bound, run_transmit
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (0 ok, 2 bad arguments)."""
    try:
        out = run(argv)
        args, plan, result = out.args, out.plan, out.result
        files: dict[str, str] = {}
        from titan_morph.pipelining.output import export

        if args.csv:
            files["csv"] = str(export.write_csv(plan, args.csv))
        if args.png:
            title = args.title or f"{plan.schedule} (plan {plan.plan_id})"
            if out.links is not None:
                title += f" — {out.links_text}"
            files["png"] = str(export.timeline_png(result, args.png, title=title))
        if args.chrome_trace:
            files["chrome_trace"] = str(export.chrome_trace(result, args.chrome_trace, links=out.links, step=args.step))
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG}: error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        print_report(out, files)
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
