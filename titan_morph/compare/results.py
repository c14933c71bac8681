"""Read a finished job's TensorBoard events back and summarise them (medians after warm-up).

Step time is TorchTitan's own ``time_metrics/end_to_end(s)``, which every schedule writes (torch's
``1F1B`` included), so speedups compare like with like. ``morph/pipeline_ms`` (first stage's start
to the last stage's end, titan_morph schedules only) is what the simulator's makespan measures and
sits next to the simulated column. Every other scalar present (``morph/*`` included, whatever the
runtime adds) is kept as a median in :attr:`RunSummary.medians`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titan_morph.compare.runner import Outcome, load_outcome

__all__ = [
    "STEP_TIME_TAG",
    "TPS_TAG",
    "LOSS_TAG",
    "PIPELINE_TAG",
    "ITERATION_TAG",
    "PLAN_CHANGES_TAG",
    "BOUND_TAG",
    "RunSummary",
    "read_scalars",
    "summarise",
    "median_after",
]

STEP_TIME_TAG = "time_metrics/end_to_end(s)"
TPS_TAG = "throughput(tps)"
LOSS_TAG = "loss_metrics/global_avg_loss"
PIPELINE_TAG = "morph/pipeline_ms"
ITERATION_TAG = "morph/iteration_ms"
PLAN_CHANGES_TAG = "morph/plan_changes"
BOUND_TAG = "morph/bound_ms"


def _accumulators(run_dir: Path, kind: str) -> list[Any]:
    """TensorBoard accumulators of a run folder's event files (``<run_dir>/tb/<time>/``), loaded."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = Path(run_dir) / "tb"
    folders = sorted(p for p in tb.glob("*") if p.is_dir()) if tb.is_dir() else []
    out = []
    for folder in folders:
        acc = EventAccumulator(str(folder), size_guidance={kind: 0})
        acc.Reload()
        out.append(acc)
    return out


def read_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar tag of a run folder: tag -> {step: value}."""
    out: dict[str, dict[int, float]] = {}
    for acc in _accumulators(run_dir, "scalars"):
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, {}).update({ev.step: float(ev.value) for ev in acc.Scalars(tag)})
    return out


def read_images(run_dir: Path) -> dict[str, list[int]]:
    """Every image tag of a run folder: tag -> the steps it was logged at."""
    out: dict[str, list[int]] = {}
    for acc in _accumulators(run_dir, "images"):
        for tag in acc.Tags().get("images", []):
            out.setdefault(tag, []).extend(ev.step for ev in acc.Images(tag))
    return out


def median_after(values: dict[int, float], skip: int) -> float | None:
    """Median of the finite values at steps > ``skip`` (None when there are none)."""
    kept = [v for step, v in values.items() if step > skip and math.isfinite(v)]
    return statistics.median(kept) if kept else None


@dataclass
class RunSummary:
    """One variant's numbers in one case (None = not measured / not applicable)."""

    variant: str
    case: str
    run_dir: str
    outcome: Outcome | None
    skip: int
    steps_measured: int = 0
    step_ms: float | None = None
    tokens_per_s: float | None = None
    pipeline_ms: float | None = None
    iteration_ms: float | None = None
    plan_changes: float | None = None
    bound_ms: float | None = None
    """Median of ``morph/bound_ms``: no schedule could run those steps faster (same links and compute)."""
    simulated_ms: float | None = None
    simulated_note: str = ""
    step_series: dict[int, float] = field(default_factory=dict)
    medians: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome is not None and self.outcome.ok

    def status(self) -> str:
        return "not run" if self.outcome is None else self.outcome.status()


def summarise(run_dir: Path, variant: str, case: str, skip: int) -> RunSummary:
    """Medians over steps > ``skip`` of the run in ``run_dir``, plus its outcome."""
    scalars = read_scalars(run_dir)
    outcome = load_outcome(run_dir)
    series = {step: v * 1000.0 for step, v in sorted(scalars.get(STEP_TIME_TAG, {}).items())}
    summary = RunSummary(variant, case, str(run_dir), outcome, skip, step_series=series)
    summary.steps_measured = sum(1 for step in series if step > skip)
    summary.step_ms = median_after(series, skip)
    summary.tokens_per_s = median_after(scalars.get(TPS_TAG, {}), skip)
    summary.pipeline_ms = median_after(scalars.get(PIPELINE_TAG, {}), skip)
    summary.iteration_ms = median_after(scalars.get(ITERATION_TAG, {}), skip)
    summary.bound_ms = median_after(scalars.get(BOUND_TAG, {}), skip)
    changes = scalars.get(PLAN_CHANGES_TAG)
    summary.plan_changes = max(changes.values()) if changes else None
    for tag, values in sorted(scalars.items()):
        med = median_after(values, skip)
        if med is not None:
            summary.medians[tag] = med
    return summary
