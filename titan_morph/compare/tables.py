"""Markdown tables of a comparison: one per case, and a summary over the cases of a sweep.

Speedup "× vs B" = B's median step time / this variant's (> 1: faster than B), over the steps
both runs measured: all steps after warm-up, or, when one of them failed, the steps before that.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from titan_morph.compare.results import RunSummary
from titan_morph.compare.variants import VARIANTS, Variant, is_baseline

__all__ = ["baselines", "target", "case_table", "sweep_table", "common_speedup", "fmt_ms", "ratio"]

_FAILED_MARK = "†"


def fmt_ms(value: float | None, digits: int = 1) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or not (math.isfinite(num) and math.isfinite(den)) or den <= 0:
        return None
    return num / den


def _fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _variant(name: str) -> Variant:
    return VARIANTS[name]


def baselines(names: Sequence[str]) -> list[str]:
    """The speedup columns: the non-PipeMorph variants (or the first one if all are PipeMorph)."""
    found = [n for n in names if is_baseline(_variant(n))]
    return found or list(names[:1])


def target(names: Sequence[str]) -> str | None:
    """The variant the sweep ratios are about: PipeMorph if run, else the last non-baseline."""
    if "PipeMorph" in names:
        return "PipeMorph"
    others = [n for n in names if not is_baseline(_variant(n))]
    return others[-1] if others else None


def common_speedup(baseline: RunSummary, row: RunSummary) -> tuple[float | None, bool]:
    """(baseline's median step time / row's, over the measured steps both completed; whether a
    failure cut that range short). Equal to the ratio of the medians when both runs passed."""
    skip = max(baseline.skip, row.skip)
    steps = sorted(s for s in baseline.step_series.keys() & row.step_series.keys() if s > skip)
    if not steps:
        return None, False
    b = statistics.median(baseline.step_series[s] for s in steps)
    r = statistics.median(row.step_series[s] for s in steps)
    return ratio(b, r), not (baseline.ok and row.ok)


def _simulated(row: RunSummary) -> str:
    return fmt_ms(row.simulated_ms)


def case_table(rows: Sequence[RunSummary]) -> str:
    """One case: a row per variant (in run order)."""
    names = [r.variant for r in rows]
    base = baselines(names)
    by_name = {r.variant: r for r in rows}
    header = ["variant", "step ms (median)", "tokens/s", "pipeline ms", "simulated ms", "bound ms"]
    header += [f"× vs {b}" for b in base]
    header += ["plan changes", "status"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 2) + ["---"]) + "|"]
    any_failed = False
    for r in rows:
        step = fmt_ms(r.step_ms)
        if not r.ok and r.step_ms is not None:
            step += _FAILED_MARK
            any_failed = True
        cells = [r.variant, step, fmt_ms(r.tokens_per_s), fmt_ms(r.pipeline_ms), _simulated(r), fmt_ms(r.bound_ms)]
        for b in base:
            value, partial = common_speedup(by_name[b], r)
            cells.append(_fmt_ratio(value) + (_FAILED_MARK if partial and value is not None else ""))
        cells.append("—" if r.plan_changes is None else f"{r.plan_changes:.0f}")
        cells.append(r.status())
        lines.append("| " + " | ".join(cells) + " |")
    if any_failed:
        lines.append("")
        lines.append(
            f"{_FAILED_MARK} over the steps completed before the failure (speedups: the steps both runs completed)."
        )
    return "\n".join(lines)


def sweep_table(
    case_labels: Sequence[str],
    rows_by_case: Sequence[Sequence[RunSummary]],
    reference: dict[str, float] | None = None,
    reference_label: str = "",
) -> str:
    """Cases × variants: median step ms, the baselines' ratio to the target variant and, with a
    ``reference`` (variant -> no-delay step ms), each variant's slowdown relative to it."""
    names = [r.variant for r in rows_by_case[0]] if rows_by_case else []
    tgt = target(names)
    base = [b for b in baselines(names) if b != tgt]
    header = ["case"] + [f"{n} ms" for n in names]
    if tgt is not None:
        header += [f"{b} / {tgt}" for b in base]
        header += [f"{n} / {tgt}" for n in names if n != tgt and n not in base]
    if reference:
        header += [f"{n} / {reference_label}" for n in names]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for label, rows in zip(case_labels, rows_by_case):
        by = {r.variant: r for r in rows}
        cells = [label]
        for n in names:
            r = by[n]
            cells.append(fmt_ms(r.step_ms) if r.ok else "failed")
        if tgt is not None:
            t = by[tgt]
            others = base + [n for n in names if n != tgt and n not in base]
            for n in others:
                cells.append(_fmt_ratio(ratio(by[n].step_ms, t.step_ms) if by[n].ok and t.ok else None))
        if reference:
            for n in names:
                cells.append(_fmt_ratio(ratio(by[n].step_ms, reference.get(n)) if by[n].ok else None))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
