"""Replay a run's exchanged profiles through a fresh monitor, offline: its decisions step by step and
its link model against each step (``morph/modelled_ms`` against ``morph/pipeline_ms``).

A job writes the profiles with ``[morph] profiles_file`` (JSON lines, one step each, pipeline rank
0). The replay builds the monitor the runtime would (the same config and overrides), feeds it the
steps in order and follows its plan changes, so a change to the estimator or the detector can be
judged on recorded real-link timings without running the lab again. Printed per step: the measured
pipeline time, the monitor's model of it, their ratio, the link's per-direction (latency, transmit)
readings and any plan change; at the end the median ratio after ``--skip`` steps.

    CONFIG_FILE=train_configs/synthetic_cpu.toml python -m titan_morph.netlab run ... -- \\
        --morph.profiles_file /tmp/run.jsonl
    .venv/bin/python benchmarks/replay_profiles.py /tmp/run.jsonl --variant PipeMorph \\
        -- --morph.synthetic.message_kb 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from titan_morph.compare.configs import resolve_settings
from titan_morph.compare.variants import VARIANTS
from titan_morph.integration.plans import FAMILIES, initial_plan, make_monitor
from titan_morph.monitor.profile import MessageStamp, StepProfile
from titan_morph.runtime.metrics import pipeline_ms


def _step(line: str) -> list[StepProfile]:
    out = []
    for row in json.loads(line):
        messages = [MessageStamp(**m) for m in row.pop("messages")]
        row["compute"] = {k: tuple(v) for k, v in row["compute"].items()}
        row["stage_compute"] = {
            int(s): {k: tuple(v) for k, v in kinds.items()} for s, kinds in row["stage_compute"].items()
        }
        prof = StepProfile(**row)
        prof.messages = messages
        out.append(prof)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profiles", type=Path, help="a [morph] profiles_file")
    parser.add_argument("--config", type=Path, default=Path("train_configs/synthetic_cpu.toml"))
    parser.add_argument("--variant", default="PipeMorph", help="the compare variant the job ran (its overrides)")
    parser.add_argument("--first", type=int, default=0, help="first line (a file several jobs appended to)")
    parser.add_argument("--steps", type=int, help="lines to replay (default: to the end)")
    parser.add_argument("--skip", type=int, default=6, help="steps left out of the median ratio")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)  # after it: the job's other overrides
    opts = parser.parse_args(argv[:cut])
    opts.overrides = argv[cut + 1 :]
    variant = VARIANTS[opts.variant]
    settings = resolve_settings(opts.config, [*opts.overrides, *variant.overrides])
    morph, family = settings.morph, FAMILIES[variant.schedule]
    active = initial_plan(family, morph, settings.stages, settings.microbatches)
    monitor = make_monitor(family, morph, active, settings.stages, settings.microbatches)
    lines = opts.profiles.read_text().splitlines()[opts.first :]
    delegated: set[int] = set()
    ratios = []
    for line in lines[: opts.steps]:
        profiles = _step(line)
        step = profiles[0].step + 1
        change = monitor.observe(step, profiles, active)
        modelled = monitor.modelled_ms(active, None if delegated else morph.depth)
        measured = pipeline_ms(profiles, len(profiles))
        ratio = measured / modelled if measured and modelled else None
        if ratio is not None and step > opts.skip:
            ratios.append(ratio)
        wires = {
            est.link: {d: f"{lat:.1f}+{tau:.1f}" for d, (lat, tau) in est.direction_wire_ms().items()}
            for est in monitor.estimates
            if any(tau > 0 for _, tau in est.direction_wire_ms().values())
        }
        print(
            f"step {step}: measured {measured or 0:.1f} ms, modelled {modelled or 0:.1f} ms,"
            f" ratio {'—' if ratio is None else f'{ratio:.3f}'}; links (latency+transmit ms) {wires}"
        )
        if change is not None:
            active = change.plan
            delegated = (delegated | set(change.switch)) - set(change.restore)
            print(f"  change: {'; '.join(change.reasons)} -> x={list(active.warmup)}")
    if ratios:
        print(f"measured / modelled, median of steps {opts.skip + 1}+: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
