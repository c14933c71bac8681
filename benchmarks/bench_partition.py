"""partition = "auto" against "even" under compute stragglers, on the synthetic testbed, as ratios.

train_configs/partition_cpu.toml: PP = 4, N = 24, 16 layers of F = B = W = 2.5 ms (4 per stage
evenly), the default ski-rental rule (``repartition_after = 1``). Each case runs ``auto`` and then
``even`` under the same straggler, one job at a time (supervised torchrun jobs, a relaunch included):

* ``2.0``: rank 3 twice as slow from step 4 (the issue's acceptance run), 80 steps;
* ``1.5``: rank 3 1.5x as slow from step 4, 150 steps (the gain per step is smaller, so the ski
  rental waits longer, and the steps left must pay the relaunch back);
* ``head``: no straggler, the last layer's forward 5.4x the others' (the last stage's forward 2.1x
  the other stages', as the ByteDance traces show for the stage holding the output and the loss), 200
  steps (a gain of ~110 ms per step pays a ~10 s relaunch back only over ~90 steps).

It prints, per case: the steps the detector took, the step of the re-partition and its split, the
relaunch cost (estimated on the first launch, measured on the second), the steady pipeline time
after the move against the simulator's figure for the chosen split (the partition planner's plan
for that split at the injected speeds), and even / auto over the same steps. The acceptance lines
come first. Ratios, not absolute times (the host is shared); run it under the heavy-work lock:

    flock /tmp/tm-heavy.lock .venv/bin/python benchmarks/bench_partition.py [--cases 2.0,1.5,head] [--no-run]

About 20 minutes on a 2-core host (the three cases).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from titan_morph.compare.results import PIPELINE_TAG, read_scalars
from titan_morph.compare.runner import load_outcome, run_command, run_job
from titan_morph.monitor.repartition import entries_of
from titan_morph.pipelining.partition import LayerCost, PartitionProblem, evaluate_split, even_split

CONFIG = Path("train_configs/partition_cpu.toml")
RANKS, N, LAYERS, LAYER_MS, MEMORY = 4, 24, 16, 2.5, 7
START = 4
HEAD_FWD = 2.5 + 4 * 2.5 * 1.1  # the last stage's forward 2.1x the others' (10 ms -> 21 ms)


@dataclass(frozen=True)
class Case:
    name: str
    steps: int
    factor: float
    head: bool = False

    def overrides(self) -> list[str]:
        factors = ",".join(["1"] * (RANKS - 1) + [f"{self.factor:g}"])
        out = ["--morph.inject.compute_factor", factors, "--morph.inject.start_step", str(START)]
        if self.head:
            fwd = ",".join([f"{LAYER_MS:g}"] * (LAYERS - 1) + [f"{HEAD_FWD:g}"])
            out = ["--morph.inject.mode", "none", "--morph.inject.compute_factor", "", "--morph.synthetic.fwd_ms", fwd]
        return out

    def layers(self) -> tuple[LayerCost, ...]:
        """The testbed's real per-entry costs (the embedding and output cost nothing)."""
        fwd = [LAYER_MS] * LAYERS
        if self.head:
            fwd[-1] = HEAD_FWD
        inner = [LayerCost(f"layers.{i}", f, LAYER_MS, LAYER_MS) for i, f in enumerate(fwd)]
        return (LayerCost("tok_embeddings", 0, 0, 0), *inner, LayerCost("output", 0, 0, 0))

    def simulated(self, split: tuple[int, ...]) -> float:
        """The simulator's step for a split (transformer layers per stage) under the injected speeds."""
        speeds = (1.0,) * (RANKS - 1) + (1.0 / self.factor,)
        problem = PartitionProblem(self.layers(), speeds, N, max_in_flight=MEMORY)
        return evaluate_split(problem, entries_of(split)).makespan_ms


CASES = {c.name: c for c in (Case("2.0", 80, 2.0), Case("1.5", 150, 1.5), Case("head", 200, 1.0, head=True))}


def _run(logdir: Path, case: Case, partition: str) -> Path:
    dump = logdir / case.name / partition
    overrides = [*case.overrides(), "--morph.partition", partition]
    command = run_command(CONFIG, dump, RANKS, case.steps, overrides)
    print("+", " ".join(command[command.index("titan_morph.train") :]), flush=True)
    outcome = run_job(command, dump, variant=partition, case=case.name, timeout_s=60 + 4 * case.steps)
    if not outcome.ok:
        raise SystemExit(f"{case.name} / {partition}: {outcome.status()}")
    return dump


def _median(values: dict[int, float], steps: range) -> float:
    return statistics.median(values[s] for s in steps if s in values)


def _split_at(scalars: dict[str, dict[int, float]], step: int) -> tuple[int, ...]:
    return tuple(int(scalars[f"morph/partition/stage{s}"][step]) for s in range(RANKS))


def report(logdir: Path, case: Case) -> list[str]:
    auto, even = (read_scalars(logdir / case.name / p) for p in ("auto", "even"))
    last = case.steps
    moves = auto["morph/repartitions"]
    moved = min((s for s, v in moves.items() if v >= 1), default=None)
    lines = [f"case {case.name} ({case.steps} steps):"]
    if not case.head:
        slow = [s for s, v in sorted(auto["morph/slow_rank/rank3"].items()) if v > 0]
        detected = slow[0] if slow else None
        lines.append(f"  rank 3 slow after step {detected} ({(detected or 0) - START + 1} steps of the straggler)")
    if moved is None:
        lines.append("  no re-partition")
        return lines
    split = _split_at(auto, last)
    relaunches = int(max(moves.values()))
    costs = auto["morph/relaunch_cost_ms"]
    estimated, measured = costs.get(moved - 1, float("nan")), costs.get(last, float("nan"))
    steady = range(moved + 2, last + 1)
    got, ref = _median(auto[PIPELINE_TAG], steady), _median(even[PIPELINE_TAG], steady)
    sim, sim_even = case.simulated(split), case.simulated(even_split(LAYERS, RANKS))
    before = list(_split_at(auto, moved - 1))
    lines += [
        f"  re-partitioned after step {moved - 1}: layers per stage {before} -> {list(split)}, {relaunches}"
        f" relaunch(es); relaunch cost estimated {estimated / 1e3:.1f} s, measured {measured / 1e3:.1f} s"
        f" ({measured / estimated:.2f}x)",
        f"  steady steps {steady.start}-{steady.stop - 1}: auto {got:.0f} ms / simulator {sim:.1f} ms ="
        f" {got / sim:.3f}; even {ref:.0f} ms / simulator {sim_even:.1f} ms = {ref / sim_even:.3f}",
        f"  even / auto = {ref / got:.2f} (simulator {sim_even / sim:.2f})",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logdir", type=Path, default=Path("outputs/results/partition"))
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--no-run", action="store_true", help="only read a finished log directory")
    args = ap.parse_args(argv)
    cases = [CASES[name] for name in args.cases.split(",")]
    if not args.no_run:
        for case in cases:
            for partition in ("auto", "even"):
                _run(args.logdir, case, partition)
    for case in cases:
        for partition in ("auto", "even"):
            outcome = load_outcome(args.logdir / case.name / partition)
            if outcome is not None and not outcome.ok:
                print(f"{case.name} / {partition}: {outcome.status()}")
        print("\n".join(report(args.logdir, case)), flush=True)
    if "2.0" in args.cases.split(","):
        auto = read_scalars(args.logdir / "2.0" / "auto")
        print(f"acceptance: one relaunch: {max(auto['morph/repartitions'].values()) == 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
