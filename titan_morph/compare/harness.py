"""Plan and run a comparison: every variant under every case of a scenario, one torchrun job each.

Layout of a log directory (``tensorboard --logdir LOGDIR`` overlays the variants)::

    LOGDIR/<scenario>/comparison.json        what was run (command, config, cases, variants, host)
    LOGDIR/<scenario>/table.md               the printed tables
    LOGDIR/<scenario>/[<case>/]<variant>/    one run folder: tb/<time>/ events, train.log, outcome.json
    LOGDIR/<scenario>/[<case>/]step_time.png step time per step, one line per variant
    LOGDIR/<scenario>/sweep.png              median step time per case (multi-case scenarios)

Jobs run one after the other with the same seed and the same injection; a failing job is
recorded and the comparison goes on. Everything is checked (scenario, variants, every run's
resolved config) before the first job starts.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from titan_morph.compare.configs import ComparisonError, resolve_settings
from titan_morph.compare.runner import Outcome, Progress, run_command, run_job
from titan_morph.compare.scenarios import Case, Scenario, expand, get_scenario
from titan_morph.compare.variants import Variant

__all__ = [
    "DEFAULT_STEPS",
    "DEFAULT_SKIP",
    "COMPARISON_FILE",
    "TABLE_FILE",
    "PlannedRun",
    "ComparisonPlan",
    "default_skip",
    "default_timeout",
    "plan_comparison",
    "run_comparison",
    "run_simulator_scenario",
    "case_dir",
]

DEFAULT_STEPS = 20
DEFAULT_SKIP = 6
"""Warm-up steps left out of medians: start-up, PipeMorph's profiling (2) and detection (k = 3)."""
COMPARISON_FILE = "comparison.json"
TABLE_FILE = "table.md"


def default_skip(steps: int) -> int:
    """DEFAULT_SKIP, but at most a third of a short run."""
    return min(DEFAULT_SKIP, steps // 3)


def default_timeout(steps: int) -> float:
    """Seconds per job: start-up plus a generous per-step allowance (slow schedules, loaded host)."""
    return 180.0 + 15.0 * steps


def case_dir(scenario_dir: Path, case: Case) -> Path:
    return scenario_dir / case.name if case.name else scenario_dir


@dataclass
class PlannedRun:
    """One job: a variant under a case, with its command and the simulator's prediction."""

    case: Case
    variant: Variant
    run_dir: Path
    command: list[str]
    simulated_ms: float | None = None
    simulated_note: str = ""


@dataclass
class ComparisonPlan:
    """Everything a comparison will run, checked before any job starts."""

    scenario: Scenario
    config: Path | None
    variants: tuple[Variant, ...]
    cases: tuple[Case, ...]
    steps: int
    skip: int
    scenario_dir: Path
    extra: tuple[str, ...]
    timeout_s: float
    runs: list[PlannedRun] = field(default_factory=list)

    def metadata(self, command: str) -> dict:
        return {
            "kind": "training",
            "scenario": self.scenario.name,
            "description": self.scenario.description,
            "config": str(self.config),
            "command": command,
            "cwd": os.getcwd(),
            "variants": [v.name for v in self.variants],
            "steps": self.steps,
            "skip": self.skip,
            "extra": list(self.extra),
            "timeout_s": self.timeout_s,
            "sweep_axis": self.scenario.sweep_axis,
            "cases": [asdict(c) for c in self.cases],
            "runs": [
                {
                    "case": r.case.name,
                    "variant": r.variant.name,
                    "run_dir": str(r.run_dir.relative_to(self.scenario_dir)),
                    "simulated_ms": r.simulated_ms,
                    "simulated_note": r.simulated_note,
                }
                for r in self.runs
            ],
        }


def plan_comparison(
    config: Path | None,
    scenario_name: str,
    variants: Sequence[Variant],
    *,
    steps: int | None,
    skip: int | None,
    logdir: Path,
    extra: Sequence[str] = (),
    timeout_s: float | None = None,
) -> ComparisonPlan:
    """Expand the scenario for the config's pipeline and resolve every run's configuration."""
    from titan_morph.compare.predict import simulated_ms

    scenario = get_scenario(scenario_name)
    scenario_dir = Path(logdir).resolve() / scenario.name
    if scenario.simulator_only:
        return ComparisonPlan(scenario, None, tuple(variants), (), 0, 0, scenario_dir, tuple(extra), 0.0)
    if config is None:
        raise ComparisonError("--config is required for training scenarios (e.g. train_configs/synthetic_cpu.toml)")
    config = Path(config).resolve()
    if not config.is_file():
        raise ComparisonError(f"--config {config}: file not found")
    steps = steps if steps is not None else (scenario.default_steps or DEFAULT_STEPS)
    if steps < 1:
        raise ComparisonError(f"--steps must be >= 1, got {steps}")
    skip = default_skip(steps) if skip is None else skip
    if not 0 <= skip < steps:
        raise ComparisonError(f"--skip-warmup must be in 0..{steps - 1} (fewer than --steps {steps}), got {skip}")
    timeout = default_timeout(steps) if timeout_s is None else timeout_s
    if timeout <= 0:
        raise ComparisonError(f"--timeout must be > 0 seconds, got {timeout_s}")
    plan = ComparisonPlan(scenario, config, tuple(variants), (), steps, skip, scenario_dir, tuple(extra), timeout)
    base = resolve_settings(config, ["--training.steps", str(steps), *extra])
    plan.cases = expand(scenario.name, base.num_links)
    for case in plan.cases:
        for variant in plan.variants:
            args = [*variant.overrides, *case.overrides, *extra]
            settings = resolve_settings(config, ["--training.steps", str(steps), *args])
            run_dir = case_dir(scenario_dir, case) / variant.name
            command = run_command(config, run_dir, settings.world_size, steps, args)
            sim, note = simulated_ms(settings, variant, skip)
            plan.runs.append(PlannedRun(case, variant, run_dir, command, sim, note))
    return plan


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def _host() -> dict:
    return {
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
    }


def run_comparison(plan: ComparisonPlan, command: str, echo: Callable[[str], None] = print) -> str:
    """Run every planned job in order, then write and return the markdown tables (+ PNGs)."""
    from titan_morph.compare.report import render_comparison

    if plan.scenario.simulator_only:
        return run_simulator_scenario(plan.scenario_dir, command, echo)
    meta = plan.metadata(command)
    meta["started"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    meta["host_start"] = _host()
    path = plan.scenario_dir / COMPARISON_FILE
    _write_json(path, meta)
    started = time.monotonic()
    progress = Progress(len(plan.runs), echo)
    for run in plan.runs:
        where = f"{plan.scenario.name}/{run.case.name}" if run.case.name else plan.scenario.name
        progress.start(f"{where} {run.variant.name}: {run.case.label}; {plan.steps} steps")
        outcome: Outcome = run_job(
            run.command, run.run_dir, variant=run.variant.name, case=run.case.name, timeout_s=plan.timeout_s
        )
        progress.done(f"{where} {run.variant.name}", outcome.status())
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    meta["seconds"] = round(time.monotonic() - started, 1)
    meta["host_end"] = _host()
    _write_json(path, meta)
    markdown = render_comparison(meta, plan.scenario_dir, write_figures=True)
    (plan.scenario_dir / TABLE_FILE).write_text(markdown + "\n")
    return markdown


def run_simulator_scenario(scenario_dir: Path, command: str, echo: Callable[[str], None] = print) -> str:
    """Scenario ``fig5-8``: the scheduler's own curves (no training), as tables and a PNG."""
    from titan_morph.compare.report import render_comparison
    from titan_morph.compare.scenarios import SCENARIOS

    scenario = SCENARIOS["fig5-8"]
    meta = {
        "kind": "simulator",
        "scenario": scenario.name,
        "description": scenario.description,
        "command": command,
        "cwd": os.getcwd(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    _write_json(scenario_dir / COMPARISON_FILE, meta)
    markdown = render_comparison(meta, scenario_dir, write_figures=True)
    (scenario_dir / TABLE_FILE).write_text(markdown + "\n")
    echo(f"fig5-8: simulator tables and {scenario_dir / 'fig5-8.png'}")
    return markdown


def shell_command(argv: Sequence[str]) -> str:
    """How this comparison was started, as a shell line (recorded next to its tables)."""
    return "python -m titan_morph.compare " + shlex.join(list(argv))
