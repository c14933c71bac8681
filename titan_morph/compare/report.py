"""Markdown of finished comparisons, regenerated from their log directories.

``python -m titan_morph.compare.report LOGDIR [LOGDIR ...] [--out docs/results.md] [--figures DIR]``
reads every ``<scenario>/comparison.json`` under the given log directories, re-reads each run's
TensorBoard events (nothing is taken from the printed tables) and writes one document: per
scenario the command that produced it, the configuration, a table per case (median step time,
tokens/s, measured pipeline time next to the simulator's, speedups, plan changes, status) and,
for multi-case scenarios, a summary with the ratios between variants. When a log directory also
holds a ``none`` comparison of the same configuration, every variant's slowdown relative to its
own no-delay time is added. The harness uses the same renderer for the tables it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from titan_morph.compare.results import RunSummary, summarise

__all__ = ["render_comparison", "find_comparisons", "render_report", "main"]

_PREDICTED_TAG = "morph/predicted_ms"


def _case_rows(meta: dict, scenario_dir: Path) -> list[tuple[dict, list[RunSummary]]]:
    """(case, one summary per variant in run order) for every case of a training comparison."""
    skip = int(meta["skip"])
    out = []
    for case in meta["cases"]:
        rows = []
        for run in (r for r in meta["runs"] if r["case"] == case["name"]):
            row = summarise(scenario_dir / run["run_dir"], run["variant"], case["name"], skip)
            offline, runtime = run.get("simulated_ms"), row.medians.get(_PREDICTED_TAG)
            # Static links: the offline prediction (the plan adaptation converges to, and the
            # transport's real queue model). Time-varying links: the runtime's own simulation of
            # the plan it ran at the time it ran (morph/predicted_ms), when it has one.
            if offline is not None and (case.get("delays_ms") is not None or runtime is None):
                row.simulated_ms, row.simulated_note = offline, run.get("simulated_note", "")
            elif runtime is not None:
                row.simulated_ms, row.simulated_note = runtime, "runtime morph/predicted_ms"
            else:
                row.simulated_note = run.get("simulated_note", "")
            rows.append(row)
        out.append((case, rows))
    return out


def _figure(path: Path, link_base: Path | None, figures: Path | None, name: str) -> str:
    """A markdown image line for ``path`` (copied into ``figures`` when given)."""
    if not path.is_file():
        return ""
    target = path
    if figures is not None:
        figures.mkdir(parents=True, exist_ok=True)
        target = figures / name
        shutil.copyfile(path, target)
    shown = os.path.relpath(target, link_base) if link_base is not None else str(target)
    return f"![{name}]({shown})"


def _reference(meta: dict, scenario_dir: Path) -> dict[str, float] | None:
    """variant -> no-delay median step ms from a ``none`` comparison of the same config and steps."""
    ref_dir = scenario_dir.parent / "none"
    path = ref_dir / "comparison.json"
    if meta.get("scenario") == "none" or not path.is_file():
        return None
    ref = json.loads(path.read_text())
    if ref.get("config") != meta.get("config") or ref.get("steps") != meta.get("steps"):
        return None
    rows = _case_rows(ref, ref_dir)[0][1]
    return {r.variant: r.step_ms for r in rows if r.ok and r.step_ms is not None}


def render_comparison(
    meta: dict,
    scenario_dir: Path,
    *,
    write_figures: bool = False,
    link_base: Path | None = None,
    figures: Path | None = None,
    heading: str = "###",
) -> str:
    """The markdown of one comparison (training or simulator-only); ``write_figures`` (re)draws
    its PNGs in the log directory, ``figures`` copies them elsewhere for a document."""
    from titan_morph.compare.plots import plot_steps, plot_sweep
    from titan_morph.compare.tables import case_table, sweep_table

    scenario = meta["scenario"]
    lines = [f"{heading} {scenario}: {meta['description']}", "", "```bash", meta["command"], "```", ""]
    if meta["kind"] == "simulator":
        from titan_morph.compare.paper_figures import fig5_8

        sims = fig5_8()
        png = scenario_dir / "fig5-8.png"
        if write_figures or not png.is_file():
            sims.plot(png)
        lines += [sims.markdown(), ""]
        fig = _figure(png, link_base, figures, "fig5-8.png")
        if fig:
            lines += [fig, ""]
        return "\n".join(lines).rstrip()

    skip, steps = int(meta["skip"]), int(meta["steps"])
    host = meta.get("host_start", {})
    config = meta["config"]
    if meta.get("cwd") and Path(config).is_relative_to(meta["cwd"]):
        config = str(Path(config).relative_to(meta["cwd"]))
    lines.append(
        f"Config `{config}`; variants {', '.join(meta['variants'])}; {steps} steps per run, medians over"
        f" steps {skip + 1}–{steps}; {host.get('cpus', '?')} CPUs, load average"
        f" {host.get('load_avg', ['?'])[0]} at start, {meta.get('host_end', {}).get('load_avg', ['?'])[0]} at end;"
        f" {meta.get('seconds', '?')} s in all."
    )
    if meta.get("extra"):
        lines.append(f"Extra overrides: `{' '.join(meta['extra'])}`.")
    lines += [
        "Step ms: TorchTitan's `time_metrics/end_to_end(s)`; pipeline ms: `morph/pipeline_ms` (titan_morph"
        " schedules); simulated ms: the simulator's makespan for the plan run under the same link model;"
        " bound ms: `morph/bound_ms`, a lower bound on any schedule's makespan for the same steps, links and"
        " compute times (no plan can beat it).",
        "",
    ]
    cases = _case_rows(meta, scenario_dir)
    for case, rows in cases:
        folder = scenario_dir / case["name"] if case["name"] else scenario_dir
        title = f"{scenario}{'/' + case['name'] if case['name'] else ''}: {case['label']}"
        lines += [f"**{case['label']}**" if case["name"] else f"**{case['label']}**", "", case_table(rows), ""]
        png = folder / "step_time.png"
        if write_figures:
            plot_steps(rows, title, png, skip)
        name = f"{scenario}{'-' + case['name'] if case['name'] else ''}-step_time.png"
        fig = _figure(png, link_base, figures, name)
        if fig:
            lines += [fig, ""]
    reference, ref_label = _reference(meta, scenario_dir), "no delay"
    zero = next((rows for c, rows in cases if c.get("x") == 0), None)
    if reference is None and zero is not None and len(cases) > 1:  # a sweep's own 0 ms case (Fig. 15)
        reference, ref_label = {r.variant: r.step_ms for r in zero if r.ok and r.step_ms is not None}, "0 ms"
    if len(cases) > 1 or reference:
        labels = [c["label"] for c, _ in cases]
        lines += [
            "**Summary** (median step ms; ratios of step times)",
            "",
            sweep_table(labels, [rows for _, rows in cases], reference, ref_label),
            "",
        ]
        if len(cases) > 1:
            png = scenario_dir / "sweep.png"
            if write_figures:
                plot_sweep(
                    [c["name"] for c, _ in cases],
                    [c.get("x") for c, _ in cases],
                    [rows for _, rows in cases],
                    f"{scenario}: {meta['description']}",
                    png,
                    meta.get("sweep_axis"),
                )
            fig = _figure(png, link_base, figures, f"{scenario}-sweep.png")
            if fig:
                lines += [fig, ""]
    return "\n".join(lines).rstrip()


def find_comparisons(logdirs: Sequence[Path]) -> list[tuple[dict, Path]]:
    """(metadata, scenario folder) of every comparison under ``logdirs``, in scenario order."""
    from titan_morph.compare.scenarios import SCENARIOS

    order = {name: i for i, name in enumerate(SCENARIOS)}
    found = []
    for logdir in logdirs:
        for path in sorted(Path(logdir).rglob("comparison.json")):
            meta = json.loads(path.read_text())
            found.append((meta, path.parent))
    found.sort(key=lambda item: (item[0].get("config", ""), order.get(item[0]["scenario"], len(order)), str(item[1])))
    return found


def render_report(logdirs: Sequence[Path], out: Path | None, figures: Path | None, title: str) -> str:
    comparisons = find_comparisons(logdirs)
    if not comparisons:
        raise FileNotFoundError(f"no comparison.json under {', '.join(map(str, logdirs))}")
    link_base = out.parent.resolve() if out is not None else None
    parts = [f"# {title}", ""]
    config = None
    for meta, folder in comparisons:
        cfg = meta.get("config", "(simulator only)")
        if cfg != config:
            parts += [f"## `{Path(cfg).name if meta.get('config') else cfg}`", ""]
            config = cfg
        parts += [render_comparison(meta, folder, link_base=link_base, figures=figures), ""]
    return "\n".join(parts).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m titan_morph.compare.report",
        description="Regenerate a markdown report (e.g. docs/results.md) from finished comparisons.",
    )
    parser.add_argument("logdirs", nargs="+", type=Path, help="log directories of python -m titan_morph.compare")
    parser.add_argument("--out", type=Path, help="write the markdown here (default: print it)")
    parser.add_argument("--figures", type=Path, help="copy the PNGs into this folder and link them")
    parser.add_argument("--title", default="titan_morph: schedule comparisons", help="document title")
    opts = parser.parse_args(argv)
    try:
        text = render_report(opts.logdirs, opts.out, opts.figures, opts.title)
    except FileNotFoundError as err:
        print(f"titan_morph.compare.report: {err}", file=sys.stderr)
        return 2
    if opts.out:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(text)
        print(f"wrote {opts.out}")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
