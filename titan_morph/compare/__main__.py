"""``python -m titan_morph.compare --config X.toml --scenario S [options] [-- overrides ...]``.

Runs each variant (default: 1F1B, ZBH2, PipeMorph-CPU, PipeMorph) as its own torchrun job under
the scenario's injected delays, writes TensorBoard events into one log directory (one folder per
variant, so ``tensorboard --logdir LOGDIR`` overlays them), then prints markdown tables and saves
PNGs there. ``--list`` shows the scenarios; ``--dry-run`` prints the jobs without running them.
Arguments after ``--`` are TorchTitan/titan_morph overrides applied to every job.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from titan_morph.compare.configs import ComparisonError
from titan_morph.compare.harness import DEFAULT_SKIP, DEFAULT_STEPS, plan_comparison, run_comparison, shell_command
from titan_morph.compare.scenarios import ScenarioError, describe_all, get_scenario
from titan_morph.compare.variants import DEFAULT_VARIANTS, VARIANTS, UnknownVariantError, parse_variants


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m titan_morph.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="variants: " + ", ".join(f"{name} ({v.description})" for name, v in VARIANTS.items()),
    )
    parser.add_argument("--config", type=Path, help="TOML training config (e.g. train_configs/synthetic_cpu.toml)")
    parser.add_argument("--scenario", help="scenario name (see --list)")
    parser.add_argument("--variants", help=f"comma-separated variants (default: {','.join(DEFAULT_VARIANTS)})")
    parser.add_argument("--steps", type=int, help=f"training steps per job (default: {DEFAULT_STEPS}; table3: 30)")
    parser.add_argument(
        "--skip-warmup", type=int, help=f"first steps left out of the medians (default: {DEFAULT_SKIP}, <= steps/3)"
    )
    parser.add_argument("--logdir", type=Path, help="log directory (default: outputs/compare/<config name>)")
    parser.add_argument("--timeout", type=float, help="seconds per job before it is killed (default: 180 + 15/step)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--dry-run", action="store_true", help="print the planned jobs and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, extra = args[:cut], args[cut + 1 :]
    parser = _parser()
    opts = parser.parse_args(args)
    if opts.list:
        print(describe_all())
        return 0
    if opts.scenario is None:
        parser.error("--scenario is required (see --list)")
    try:
        scenario = get_scenario(opts.scenario)
        variants = parse_variants(opts.variants or scenario.variants)
        logdir = opts.logdir or Path("outputs") / "compare" / (opts.config.stem if opts.config else "simulator")
        plan = plan_comparison(
            opts.config,
            scenario.name,
            variants,
            steps=opts.steps,
            skip=opts.skip_warmup,
            logdir=logdir,
            extra=extra,
            timeout_s=opts.timeout,
        )
    except (ComparisonError, ScenarioError, UnknownVariantError) as err:
        print(f"python -m titan_morph.compare: error: {err}", file=sys.stderr)
        return 2
    command = shell_command(sys.argv[1:] if argv is None else argv)
    if opts.dry_run:
        if scenario.simulator_only:
            print(f"{scenario.name}: simulator only (no training), output in {plan.scenario_dir}")
        for run in plan.runs:
            sim = "—" if run.simulated_ms is None else f"{run.simulated_ms:.1f} ms"
            print(f"# {scenario.name} {run.case.name or '-'} {run.variant.name}: {run.case.label}; simulated {sim}")
            print(shlex.join(run.command))
        return 0
    try:
        markdown = run_comparison(plan, command)
    except KeyboardInterrupt:
        print("python -m titan_morph.compare: interrupted (the running job was stopped)", file=sys.stderr)
        return 130
    print()
    print(markdown)
    print()
    print(f"TensorBoard: tensorboard --logdir {plan.scenario_dir.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
