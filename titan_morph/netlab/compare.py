"""``netlab compare``: compare's variants side by side on one shaped lab.

One lab is made; every variant (``compare.variants``) then runs on it in turn as one ``netlab
run`` job under the same limits: before each job every limit and broken path is cleared and the
``--shape`` limits are applied again, and the ``--schedule`` rows (rates over time) restart with
it. Each job writes its TensorBoard events into ``LOGDIR/NAME/<variant>/`` (one log folder, so
``tensorboard --logdir LOGDIR`` overlays the variants), with an ``outcome.json`` as compare's
runner writes it; the tables are compare's own (``compare.report``), read back from the events.

The simulated column is the simulator (``compare.predict``) under the link model the kernel's
limits stand for: with one rank per node (pipeline link i joins nodes i and i+1), a link whose
``data`` path is limited to the same rate in both directions gets that rate (``[morph.inject]
bandwidth_mbit``: a message takes bytes x 8 / rate), and every link a per-message base latency
(``base_latency_ms``, measured by the caller on the unshaped lab); it needs known message sizes
(the synthetic testbed's ``message_kb``) and static limits, else the column says why not.

The lab is removed at the end, on an error and on Ctrl-C; a failing variant is recorded in its
row and the comparison goes on.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from titan_morph.compare.configs import ComparisonError, resolve_settings
from titan_morph.compare.harness import COMPARISON_FILE, TABLE_FILE, default_skip, default_timeout
from titan_morph.compare.runner import LOG_FILE, Outcome, Progress, error_line, last_logged_step
from titan_morph.compare.variants import Variant
from titan_morph.config import Settings
from titan_morph.netlab.lab import Lab, LabError, can_make_namespaces
from titan_morph.netlab.schedule import Event, check_events
from titan_morph.netlab.shape import breaks, heal, shapes, unshape

__all__ = ["CompareOptions", "LabRun", "compare", "link_rates", "plan_runs", "reset_lab"]

INTERRUPTED = 130


@dataclass
class CompareOptions:
    nodes: int
    ranks_per_node: int
    variants: tuple[Variant, ...]
    shapes: list[Event] = field(default_factory=list)
    schedule: list[Event] = field(default_factory=list)
    steps: int = 12
    skip: int | None = None
    """Steps left out of the medians (default: compare's, at most a third of ``steps``)."""
    train_args: list[str] = field(default_factory=list)
    """Overrides for every job, after the variant's (so they win)."""
    logdir: Path = Path("outputs/netlab_compare")
    name: str = "lab"
    """The comparison's folder under ``logdir`` and its title."""
    description: str = ""
    base_latency_ms: float = 0.0
    """Per-message latency every link adds in the simulated column (measured on the unshaped lab)."""
    link_latency_ms: tuple[float, ...] = ()
    """Per-link latencies of the simulated links instead (one per link), e.g. a limited link's
    measured per-message latency beyond its transmit time."""
    prefix: str = "tmlab"
    timeout_s: float | None = None
    """Seconds per job (default: compare's, start-up plus 15 s a step)."""
    store_nic: str = "host"
    host_nics: int = 1
    command: str = ""
    """How the comparison was started, recorded with its tables."""


@dataclass
class LabRun:
    """One variant's job: its arguments, folder and the simulator's prediction."""

    variant: Variant
    run_dir: Path
    train_args: list[str]
    simulated_ms: float | None
    simulated_note: str


def link_rates(events: Sequence[Event], nodes: int, ranks_per_node: int) -> tuple[tuple[float, ...] | None, str]:
    """(rate per pipeline link in Mbit/s, 0 = unlimited) that the ``data`` limits stand for, or
    (None, why not) when the per-link model cannot express them."""
    if ranks_per_node != 1:
        return None, "several ranks per node: the lab's paths are not the pipeline's links"
    limits = {(e.src, e.dst): e.rate_mbit or 0.0 for e in events if e.nic == "data" and not e.action}
    rates = []
    for link in range(nodes - 1):
        fwd, bwd = limits.pop((link, link + 1), 0.0), limits.pop((link + 1, link), 0.0)
        if fwd != bwd:
            return None, f"link {link}: {fwd:g} Mbit/s forward, {bwd:g} backward (the model has one rate per link)"
        rates.append(fwd)
    if any(r > 0 for r in limits.values()):
        return None, "a limited path between nodes that are not neighbours in the pipeline"
    return tuple(rates), ""


def _config() -> Path:
    from titan_morph.netlab.run import resolve_config

    return Path(resolve_config())


def _simulated(
    opts: CompareOptions, config: Path, variant: Variant, args: list[str], skip: int
) -> tuple[float | None, str]:
    """The simulator's makespan for ``variant`` under the link model of the lab's limits."""
    from titan_morph.compare.predict import simulated_ms

    if opts.schedule:
        return None, "limits that change during the run"
    rates, why = link_rates(opts.shapes, opts.nodes, opts.ranks_per_node)
    if rates is None:
        return None, why
    if opts.link_latency_ms and len(opts.link_latency_ms) != opts.nodes - 1:
        raise ComparisonError(
            f"link latencies: {opts.nodes - 1} values (one per link), got {len(opts.link_latency_ms)}"
        )
    latency = ",".join(f"{x:g}" for x in opts.link_latency_ms) or f"{opts.base_latency_ms:g}"
    model = ["--morph.inject.mode", "none"]
    if any(rates) or opts.base_latency_ms > 0 or any(opts.link_latency_ms):
        model = ["--morph.inject.mode", "static", "--morph.inject.delays_ms", latency]
        model += ["--morph.inject.bandwidth_mbit", ",".join(f"{r:g}" for r in rates)] if any(rates) else []
    if variant.schedule == "PipeMorph" and variant.adapt and any(rates):
        # The plan re-planning settles on once the monitor has measured the wire: Alg. 2 for the
        # links' latency and transmit time (config.links.plan_transmit), slow links delegated
        # unless the variant keeps the default path.
        path = "default" if variant.transport == "default" else "delegate"
        plan = ["--morph.plan_delays_ms", latency, "--morph.transport", path]
        settings = resolve_settings(config, [*args, *model, *plan])
        value, note = simulated_ms(settings, Variant(variant.name, "PipeMorph", path, False, ""), skip)
        return value, f"{note}; the plan for the measured links, on the {path} path"
    settings = resolve_settings(config, [*args, *model])
    if not variant.torch_builtin and not variant.adapt and any(rates):
        return _plan_as_run(settings, variant, skip)
    return simulated_ms(settings, variant, skip)


def _plan_as_run(settings: Settings, variant: Variant, skip: int) -> tuple[float | None, str]:
    """The makespan of the plan a lab job starts with, under the limits' link model: on the lab no
    link is emulated, so its plan assumes no transmit times (``plan_delays_ms`` are latencies),
    where ``compare.predict`` would plan for the model's rates."""
    from titan_morph.config.links import configured_message_bytes, link_model
    from titan_morph.integration.plans import FAMILIES, initial_plan
    from titan_morph.pipelining.timing.simulate import simulate

    morph, stages = settings.morph, settings.stages
    if variant.schedule not in FAMILIES or morph.stage_times(stages) is None:
        return None, "no plan to simulate (compute times unknown or not a titan_morph schedule)"
    links = link_model(morph.inject, stages - 1, message_bytes=configured_message_bytes(settings))
    plan = initial_plan(FAMILIES[variant.schedule], morph, stages, settings.microbatches)
    model = plan.model.with_delays((0.0,) * (stages - 1))
    span = simulate(model, plan.orders, links=links, depth=morph.depth, step=skip + 1).makespan
    return span, "static links; the plan the job starts with (planned without transmit times)"


def plan_runs(opts: CompareOptions) -> tuple[Path, list[LabRun], int]:
    """(the comparison's folder, one job per variant, skip), every job's settings checked."""
    if not 1 <= opts.steps:
        raise ComparisonError(f"--steps {opts.steps}: at least 1")
    skip = default_skip(opts.steps) if opts.skip is None else opts.skip
    if not 0 <= skip < opts.steps:
        raise ComparisonError(f"--skip-warmup {skip}: 0..{opts.steps - 1} (fewer than --steps)")
    if not opts.variants:
        raise ComparisonError("--variants: at least one")
    check_events(Lab(opts.nodes, opts.prefix, opts.host_nics), [*opts.shapes, *opts.schedule])
    config = _config()
    folder = (Path(opts.logdir) / opts.name).resolve()
    runs = []
    for variant in opts.variants:
        args = ["--training.steps", str(opts.steps), *variant.overrides, *opts.train_args]
        settings = resolve_settings(config, args)
        if settings.world_size != opts.nodes * opts.ranks_per_node:
            raise ComparisonError(
                f"{variant.name}: the job needs {settings.world_size} ranks, the lab has"
                f" {opts.nodes} nodes x {opts.ranks_per_node} (set --nodes/--ranks-per-node or the PP degree)"
            )
        sim, note = _simulated(opts, config, variant, args, skip)
        runs.append(LabRun(variant, folder / variant.name, args, sim, note))
    return folder, runs, skip


def reset_lab(lab: Lab) -> None:
    """No limits and no broken paths: the state every job starts from."""
    for s in shapes(lab):
        unshape(lab, s.src, s.dst, s.nic)
    if breaks(lab):
        heal(lab)


def _outcome(run: LabRun, code: int, seconds: float) -> Outcome:
    """compare's outcome record of a lab job, from the logs of its nodes."""
    logs = sorted((run.run_dir / "netlab").glob("node*.log"))
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    (run.run_dir / LOG_FILE).write_text(text)
    last = last_logged_step(text)
    ok = code == 0
    return Outcome(
        variant=run.variant.name,
        case="",
        command=run.train_args,
        returncode=code,
        seconds=round(seconds, 1),
        timed_out=code == 124,
        error="" if ok else (error_line(text) or f"exit code {code}"),
        failed_step=None if ok or last == 0 else last + 1,
        last_step=last,
    )


def _host() -> dict[str, object]:
    return {"cpus": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()]}


def _shaping_label(opts: CompareOptions) -> str:
    parts = [f"{e.src}->{e.dst} {e.nic} {e.rate_mbit:g} Mbit/s" for e in opts.shapes]
    parts += [f"schedule of {len(opts.schedule)} rows" for _ in opts.schedule[:1]]
    lab = f"netlab {opts.nodes} nodes x {opts.ranks_per_node} ranks"
    return f"{lab}; " + (", ".join(parts) if parts else "no limits")


def compare(
    opts: CompareOptions,
    echo: Callable[[str], None] = print,
    on_lab: Callable[[Lab], None] | None = None,
) -> tuple[str, dict[str, object]]:
    """Run every variant on one lab (see the module docstring); returns (markdown, metadata).
    ``on_lab`` is called once on the fresh lab before the first job (e.g. to measure it)."""
    from titan_morph.compare.report import render_comparison
    from titan_morph.netlab.run import RunOptions, run

    why = can_make_namespaces()
    if why:
        raise LabError(why)
    folder, runs, skip = plan_runs(opts)
    timeout = default_timeout(opts.steps) if opts.timeout_s is None else opts.timeout_s
    label = _shaping_label(opts)
    static = not opts.schedule and link_rates(opts.shapes, opts.nodes, opts.ranks_per_node)[0] is not None
    delays = [opts.base_latency_ms] * (opts.nodes - 1) if static else None
    meta: dict[str, object] = {
        "kind": "training",
        "scenario": opts.name,
        "description": opts.description or label,
        "config": str(_config()),
        "command": opts.command or "python -m titan_morph.netlab compare",
        "cwd": os.getcwd(),
        "variants": [r.variant.name for r in runs],
        "steps": opts.steps,
        "skip": skip,
        "extra": list(opts.train_args),
        "timeout_s": timeout,
        "sweep_axis": None,
        "cases": [{"name": "", "label": label, "overrides": [], "delays_ms": delays, "x": None}],
        "runs": [
            {
                "case": "",
                "variant": r.variant.name,
                "run_dir": r.variant.name,
                "simulated_ms": r.simulated_ms,
                "simulated_note": r.simulated_note,
            }
            for r in runs
        ],
        "lab": {"nodes": opts.nodes, "ranks_per_node": opts.ranks_per_node, "shapes": [asdict(e) for e in opts.shapes],
                "schedule": [asdict(e) for e in opts.schedule], "base_latency_ms": opts.base_latency_ms},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host_start": _host(),
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    lab = Lab(opts.nodes, opts.prefix, opts.host_nics)
    started = time.monotonic()
    progress = Progress(len(runs), echo)
    try:
        lab.up()
        if on_lab is not None:
            on_lab(lab)
        for r in runs:
            reset_lab(lab)
            r.run_dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(r.run_dir / "tb", ignore_errors=True)  # a re-run must not stack events
            (r.run_dir / "outcome.json").unlink(missing_ok=True)
            progress.start(f"{opts.name} {r.variant.name}: {label}; {opts.steps} steps")
            job = RunOptions(
                nodes=opts.nodes,
                ranks_per_node=opts.ranks_per_node,
                train_args=[*r.train_args, "--job.dump_folder", str(r.run_dir)],
                shapes=list(opts.shapes),
                schedule=list(opts.schedule),
                prefix=opts.prefix,
                timeout_s=timeout,
                store_nic=opts.store_nic,
                host_nics=opts.host_nics,
                keep_lab=True,
                quiet=True,
            )
            t0 = time.monotonic()
            code = run(job)
            outcome = _outcome(r, code, time.monotonic() - t0)
            (r.run_dir / "outcome.json").write_text(json.dumps(asdict(outcome), indent=2) + "\n")
            progress.done(f"{opts.name} {r.variant.name}", outcome.status())
            if code == INTERRUPTED or code == 128 + 15:
                raise KeyboardInterrupt
    finally:
        lab.down()
        print(f"netlab: lab {opts.prefix} removed", file=sys.stderr, flush=True)
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    meta["seconds"] = round(time.monotonic() - started, 1)
    meta["host_end"] = _host()
    (folder / COMPARISON_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    markdown = render_comparison(meta, folder, write_figures=True)
    (folder / TABLE_FILE).write_text(markdown + "\n")
    return markdown, meta


def shell_command(argv: Sequence[str]) -> str:
    """How a comparison was started, as a shell line."""
    return "python -m titan_morph.netlab " + shlex.join(list(argv))
