"""PNG figures of a comparison (matplotlib, headless Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from titan_morph.compare.results import RunSummary

__all__ = ["plot_steps", "plot_sweep"]


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path, *axes) -> Path:
    """Grid and legend on ``axes``, then write ``fig`` to ``path`` (folders created) and close it."""
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def plot_steps(rows: Sequence[RunSummary], title: str, path: Path, skip: int) -> Path:
    """Step time per training step, one line per variant; an × marks where a variant failed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in rows:
        if r.step_series:
            steps = sorted(r.step_series)
            (line,) = ax.plot(steps, [r.step_series[s] for s in steps], marker="o", markersize=3, label=r.variant)
            if not r.ok:
                ax.plot([steps[-1]], [r.step_series[steps[-1]]], "x", color=line.get_color(), markersize=10)
        elif not r.ok:
            ax.plot([], [], "x", label=f"{r.variant} ({r.status()[:40]})")
    # Step 1 (start-up, first plan, first delegates) can be several times longer: keep the
    # scale of the steady steps and say what is off it.
    later = [v for r in rows for s, v in r.step_series.items() if s > 1]
    first = [r.step_series[1] for r in rows if 1 in r.step_series]
    if later and first and max(first) > 1.5 * max(later):
        ax.set_ylim(0, 1.25 * max(later))
        ax.text(1, 1.22 * max(later), f"step 1 off scale (up to {max(first):.0f} ms)", fontsize=8, va="top")
    ax.xaxis.get_major_locator().set_params(integer=True)
    if skip > 0:
        ax.axvspan(0.5, skip + 0.5, color="grey", alpha=0.15, label=f"warm-up ({skip} steps, not in medians)")
    ax.set_xlabel("training step")
    ax.set_ylabel("step time (ms, TorchTitan end_to_end)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    return save(fig, path, ax)


def plot_sweep(
    case_labels: Sequence[str],
    xs: Sequence[float | None],
    rows_by_case: Sequence[Sequence[RunSummary]],
    title: str,
    path: Path,
    x_label: str | None,
) -> Path:
    """Median step time per case and variant: a line over x when the cases are a numeric sweep,
    else grouped bars by case."""
    plt = pyplot()
    names = [r.variant for r in rows_by_case[0]] if rows_by_case else []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    numeric = x_label is not None and all(x is not None for x in xs)
    for k, name in enumerate(names):
        values = []
        for rows in rows_by_case:
            r = next(r for r in rows if r.variant == name)
            values.append(r.step_ms if r.ok and r.step_ms is not None else float("nan"))
        if numeric:
            ax.plot(list(xs), values, marker="o", label=name)
        else:
            width = 0.8 / max(len(names), 1)
            ax.bar([i + k * width for i in range(len(case_labels))], values, width=width, label=name)
    if numeric:
        ax.set_xlabel(x_label)
    else:
        width = 0.8 / max(len(names), 1)
        ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(case_labels))])
        ax.set_xticklabels(case_labels, fontsize=8)
    ax.set_ylabel("median step time (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    return save(fig, path, ax)
