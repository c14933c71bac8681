"""Stragglers that come, change and go: PipeMorph adapting against the best fixed choice, per phase.

Replays one trace (``[morph.inject] trace_file``: rows for links and for ranks, keyed by step,
:mod:`titan_morph.pipelining.core.trace_rows`) on the synthetic testbed (PP = 4, N = 24, F = B = W =
10 ms, messages of ``--message-kb``) and runs, one job at a time:

* ``adapting``: PipeMorph with live re-planning under the whole trace, on ``--transport``
  (``auto``: slow links move to the delegates, the paper's PipeMorph);
* ``ZBH2``: the stock schedule under the whole trace, on the default path;
* ``fixed <i> <transport>``: PipeMorph without re-planning, its plan made for phase i's link
  condition (``plan_delays_ms`` / ``plan_transmit_ms``; with no delay and no rate: its initial
  plan), under the whole trace, on each of ``--fixed-transports`` -- one per distinct link
  condition (a plan for a compute condition has no setting of its own: the testbed's stage times
  are the ones it runs);
* ``steady <i>``: PipeMorph adapting with phase i's condition from its first step to its last
  (what adapting should reach in that phase).

A phase starts at every step where the trace changes something. Per phase it prints each run's
median ``morph/pipeline_ms`` from the phase's ``--settle``-th step to its last (the steady runs: the
same steps counted from their start), the best reference (every run but ``adapting``) and adapting /
best, and the re-plans of the adapting run (``morph/replans``). The default trace
(``train_configs/traces/changing_link.csv``) holds one link's phases of 12 steps: a delay, a
smaller delay, a rate limit with no delay, nothing; ``changing_rank.csv`` is a compute trace (run
it with ``--config train_configs/partition_cpu.toml --adapting "--morph.partition auto"``).

    flock /tmp/tm-heavy.lock .venv/bin/python benchmarks/bench_phases.py [--trace FILE] [--no-run]

About 20 minutes on a 2-core host for four link phases and two fixed transports. Ratios, not absolute times (the host is
shared); the references run in the same invocation, so "best" is measured, not assumed.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

from titan_morph.compare.results import PIPELINE_TAG, read_scalars
from titan_morph.compare.runner import load_outcome, run_command, run_job
from titan_morph.config import Inject, Morph, resolve_morph
from titan_morph.config.fields import Layout
from titan_morph.config.links import compute_model, link_model
from titan_morph.pipelining.core.links import DIRECTIONS
from titan_morph.pipelining.core.trace_rows import read_trace_rows

CONFIG = Path("train_configs/synthetic_cpu.toml")
RANKS = 4
LINKS = RANKS - 1
TRACE = Path("train_configs/traces/changing_link.csv")
"""The default trace: link 2 at 60 ms, 25 ms, then 40 Mbit/s (128 KiB messages: ~26 ms each), then
healthy, each for 12 steps from step 3 (the first two steps profile the stage times)."""


@dataclass(frozen=True)
class Phase:
    """Steps ``first``..``last`` of the trace and their condition: per link (latency ms, transmit ms,
    rate Mbit/s or 0 = unlimited) and per rank the compute factor."""

    index: int
    first: int
    last: int
    links: tuple[tuple[float, float, float], ...]
    factors: tuple[float, ...]

    @property
    def on_links(self) -> bool:
        return all(f == 1.0 for f in self.factors)

    def describe(self) -> str:
        parts = [
            f"link {i} {lat:g} ms" + (f" at {rate:g} Mbit/s ({tau:.1f} ms a message)" if rate else "")
            for i, (lat, tau, rate) in enumerate(self.links)
            if lat or rate
        ]
        parts += [f"rank {r} x{f:g}" for r, f in enumerate(self.factors) if f != 1.0]
        return ", ".join(parts) or "nothing"


def phases(trace: Path, steps: int, message_kb: float) -> list[Phase]:
    """The trace's phases up to ``steps`` (module docstring)."""
    rows = read_trace_rows(trace)
    if "step" not in rows.columns:
        raise SystemExit(f"{trace}: this benchmark replays traces keyed by step")
    starts = sorted({int(float(r["step"])) for _, r in (*rows.links, *rows.ranks)})
    starts = [s for s in starts if 1 <= s <= steps]  # steps before the first event: not a phase
    inject = resolve_morph(Morph(inject=Inject(mode="trace", trace_file=str(trace))), Layout(RANKS)).inject
    links = link_model(inject, LINKS, message_bytes=int(message_kb * 1024)) if rows.links else None
    ranks = compute_model(inject, RANKS) if rows.ranks else None
    out = []
    for i, first in enumerate(starts):
        last = starts[i + 1] - 1 if i + 1 < len(starts) else steps
        cond = []
        for link in range(LINKS):
            lat = max(links.delay_ms(link, d, step=first) for d in DIRECTIONS) if links is not None else 0.0
            tau = max(links.transmit_ms(link, d, step=first) for d in DIRECTIONS) if links is not None else 0.0
            cond.append((lat, tau, 8 * message_kb * 1024 / (tau * 1e3) if tau else 0.0))  # the rate: bits / time
        factors = ranks.factors(first) if ranks is not None else (1.0,) * RANKS
        out.append(Phase(i, first, last, tuple(cond), tuple(factors)))
    return out


def _held(phase: Phase, path: Path) -> Path:
    """A trace holding ``phase``'s condition from step 1."""
    lines = ["step,link,delay_ms,bandwidth_mbit,rank,compute_factor"]
    lines += [f"1,{link},{lat:g},{rate:g},," for link, (lat, _, rate) in enumerate(phase.links)]
    lines += [f"1,,,,{r},{f:g}" for r, f in enumerate(phase.factors) if f != 1.0]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass(frozen=True)
class Run:
    name: str
    steps: int
    overrides: tuple[str, ...]
    phase: Phase | None = None  # a steady run: the phase it holds


def runs(
    trace: Path,
    found: list[Phase],
    steps: int,
    logdir: Path,
    adapting: tuple[str, ...] = (),
    fixed_transports: tuple[str, ...] = ("default",),
) -> list[Run]:
    """Every run of the comparison (module docstring); ``adapting``: overrides of the adapting and
    steady runs (e.g. ``--morph.transport auto``)."""
    whole = ("--morph.inject.mode", "trace", "--morph.inject.trace_file", str(trace.resolve()))
    mine = ("--parallelism.pipeline_parallel_schedule", "PipeMorph", *adapting)
    stock = ("--parallelism.pipeline_parallel_schedule", "ZBH2", "--morph.transport", "default")
    out = [Run("adapting", steps, (*whole, *mine)), Run("ZBH2", steps, (*whole, *stock))]
    fixed_for: set[tuple[tuple[float, float, float], ...]] = set()
    for ph in found:
        if ph.on_links and ph.links not in fixed_for:
            fixed_for.add(ph.links)
            plan: tuple[str, ...] = ()
            if any(lat or tau for lat, tau, _ in ph.links):
                plan = ("--morph.plan_delays_ms", ",".join(f"{lat:g}" for lat, _, _ in ph.links))
                if any(tau for _, tau, _ in ph.links):
                    plan += ("--morph.plan_transmit_ms", ",".join(f"{tau:.2f}" for _, tau, _ in ph.links))
            fixed = ("--parallelism.pipeline_parallel_schedule", "PipeMorph", "--morph.no-adapt", *plan)
            for transport in fixed_transports:
                out.append(
                    Run(f"fixed {ph.index} {transport}", steps, (*whole, *fixed, "--morph.transport", transport))
                )
        held = _held(ph, logdir / f"held{ph.index}.csv")
        length = ph.last - ph.first + 1
        held_args = ("--morph.inject.mode", "trace", "--morph.inject.trace_file", str(held.resolve()))
        out.append(Run(f"steady {ph.index}", length + 2, (*held_args, *mine), ph))
    return out


def _median(values: dict[int, float], steps: range) -> float | None:
    found = [values[s] for s in steps if s in values]
    return statistics.median(found) if found else None


def report(logdir: Path, found: list[Phase], plan: list[Run], settle: int) -> list[str]:
    scalars = {run.name: read_scalars(logdir / run.name.replace(" ", "-")) for run in plan}
    lines = [f"per phase: median morph/pipeline_ms from each phase's step {settle} on (ms); best = the best reference"]
    for ph in found:
        window = range(ph.first + settle - 1, ph.last + 1)
        got: dict[str, float] = {}
        for run in plan:
            if run.phase is not None and run.phase is not ph:
                continue
            # a steady run holds the phase from step 1 (its first two steps profile): the same count of steps
            steps = range(2 + settle, 2 + settle + len(window)) if run.phase is not None else window
            value = _median(scalars[run.name].get(PIPELINE_TAG, {}), steps)
            if value is not None:
                got[run.name] = value
        refs = {k: v for k, v in got.items() if k != "adapting"}
        best = min(refs, key=lambda k: refs[k]) if refs else None
        mine = got.get("adapting")
        cells = "  ".join(f"{k} {v:.0f}" for k, v in got.items())
        ratio = f"adapting / best ({best}) = {mine / refs[best]:.3f}" if best and mine else "n/a"
        lines.append(f"  phase {ph.index} steps {ph.first}-{ph.last} ({ph.describe()}): {cells}; {ratio}")
    adapt = scalars["adapting"]
    replans = max(adapt.get("morph/replans", {0: 0.0}).values())
    decisions = max(adapt.get("morph/decisions", {0: 0.0}).values())
    lines.append(f"adapting: {replans:.0f} re-plans ({decisions:.0f} decisions) over {len(found)} phases")
    whole = {
        name: statistics.fmean(scalars[name][PIPELINE_TAG].values())
        for name in ("adapting", "ZBH2")
        if scalars[name].get(PIPELINE_TAG)
    }
    if len(whole) == 2:
        lines.append(f"whole run: ZBH2 / adapting = {whole['ZBH2'] / whole['adapting']:.3f} (mean step)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=TRACE, help=f"a trace CSV keyed by step (default {TRACE})")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--config", type=Path, default=CONFIG, help="a synthetic testbed config of 4 ranks")
    ap.add_argument("--transport", default="auto", help="[morph] transport of the adapting and steady runs")
    ap.add_argument(
        "--fixed-transports", default="default,delegate", help="the fixed plans' transports (comma-separated)"
    )
    ap.add_argument(
        "--adapting", default="", help="more overrides of the adapting and steady runs, e.g. '--morph.partition auto'"
    )
    ap.add_argument("--message-kb", type=float, default=128.0, help="[morph.synthetic] message_kb")
    ap.add_argument("--settle", type=int, default=7, help="compare from each phase's n-th step")
    ap.add_argument("--logdir", type=Path, default=Path("outputs/results/phases"))
    ap.add_argument("--only", default="", help="comma-separated run names to (re)run, e.g. adapting")
    ap.add_argument("--no-run", action="store_true", help="only read a finished log directory")
    args = ap.parse_args(argv)
    args.logdir.mkdir(parents=True, exist_ok=True)
    trace = args.trace
    found = phases(trace, args.steps, args.message_kb)
    adapting = ("--morph.transport", args.transport, *args.adapting.split())
    fixed = tuple(t.strip() for t in args.fixed_transports.split(",") if t.strip())
    plan = runs(trace, found, args.steps, args.logdir, adapting, fixed)
    common: tuple[str, ...] = ("--morph.synthetic.message_kb", f"{args.message_kb:g}")
    if any(not ph.on_links for ph in found):
        common += ("--morph.inject.compute_factor", "")  # the trace sets them (a config's own would clash)
    only = {n.strip() for n in args.only.split(",") if n.strip()}
    for run in plan:
        if args.no_run or (only and run.name not in only):
            continue
        dump = args.logdir / run.name.replace(" ", "-")
        command = run_command(args.config, dump, RANKS, run.steps, [*common, *run.overrides])
        print("+", run.name, " ".join(command[command.index("titan_morph.train") + 1 :]), flush=True)
        outcome = run_job(command, dump, variant=run.name, case="phases", timeout_s=120 + 6 * run.steps)
        if not outcome.ok:
            raise SystemExit(f"{run.name}: {outcome.status()}")
    for run in plan:
        outcome = load_outcome(args.logdir / run.name.replace(" ", "-"))
        if outcome is not None and not outcome.ok:
            print(f"{run.name}: {outcome.status()}")
    print("\n".join(report(args.logdir, found, plan, args.settle)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
