"""Fault matrix: what a real fault of one process does to a training job, cell by cell.

For each process kind (a rank, a delegate root, a send delegate, a receive delegate) x fault
(SIGKILL; SIGSTOP 1.5 s then SIGCONT; SIGSTOP held past the ``[comm]`` training timeout; SIGTERM)
x transport (``delegate``, ``auto``), one real training job: llama3 debug, PP=2, PipeMorph,
``STEPS`` steps, ``[comm] train_timeout_seconds = TIMEOUT_S``. The fault hits rank 0's process of
that kind once the job has logged step ``FAULT_AFTER`` (so during the next step). Each cell has an
expected outcome:

* ``continues``: the job completes every step with the losses of the same job without the fault;
* ``stops``: every rank exits non-zero within the training timeout + 30 s (torchrun's grace
  between SIGTERM and SIGKILL) of the fault, and the output names the failed process and link;

and, in every cell, no process and no ``/dev/shm`` segment of the job is left behind (the
harness, :func:`titan_morph.compare.runner.run_job`, reports what it had to clean up).

Why these outcomes: with ``delegate`` there is no other path, so a delegate that dies (or stops
past the timeout) stops the job with one error; a stopped delegate *root* only supervises, so the
delegates carry on. With ``auto`` and healthy links the delegates are on standby: a dead one is
reported and its link stays on the default path. A rank is the job itself: only a short stop is
survivable (every wait is bounded by the timeout, not shorter).

    .venv/bin/python benchmarks/fault_matrix.py [--transports delegate,auto] [--kinds ...] [--faults ...]
        [--results outputs/fault_matrix/cells.json] [--doc docs/reliability.md] [--rerun]

Cells already in ``--results`` are not run again (unless ``--rerun``), so the matrix can be run
in parts; ``--doc`` is rewritten from every result in the file. The tests in
``tests/comm/test_fault_matrix.py`` run the same cells.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.jobs import WatchedJob  # noqa: E402
from titan_morph.compare.runner import error_line  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "train_configs" / "debug_cpu.toml"
KINDS = ("rank", "delegate root", "send delegate", "receive delegate")
FAULTS = ("SIGKILL", "SIGSTOP 1.5 s", "SIGSTOP past the timeout", "SIGTERM")
TRANSPORTS = ("delegate", "auto")
STEPS = 8
FAULT_AFTER = 3  # the fault hits once this step is logged
TIMEOUT_S = 15.0  # [comm] train_timeout_seconds of every cell
GRACE_S = 30.0  # torchrun's SIGTERM -> SIGKILL grace
SHORT_STOP_S = 1.5
RANKS = 2
COMMON = (
    "--training.seq_len",
    "32",
    "--metrics.log_freq",
    "1",
    "--parallelism.pipeline_parallel_schedule",
    "PipeMorph",
    "--comm.init_timeout_seconds",
    "120",
    "--comm.train_timeout_seconds",
    str(int(TIMEOUT_S)),
)


@dataclass(frozen=True)
class Cell:
    kind: str
    fault: str
    transport: str

    @property
    def name(self) -> str:
        return f"{self.transport}/{self.kind}/{self.fault}".replace(" ", "-")

    def expected(self) -> str:
        """``continues`` or ``stops`` (see the module docstring)."""
        if self.fault == "SIGSTOP 1.5 s":
            return "continues"
        if self.kind == "rank":
            return "stops"
        if self.transport == "auto":
            return "continues"  # standby delegates: reported, the link stays on the default path
        if self.kind == "delegate root" and self.fault == "SIGSTOP past the timeout":
            return "continues"  # the root only reaps and reports; its delegates carry on
        return "stops"


def cells() -> list[Cell]:
    return [Cell(k, f, t) for t in TRANSPORTS for k in KINDS for f in FAULTS]


@dataclass
class CellResult:
    cell: str
    kind: str
    fault: str
    transport: str
    expected: str
    observed: str = ""
    returncode: int | None = None
    steps: int = 0
    same_losses: bool | None = None
    exit_after_fault_s: float | None = None
    error: str = ""
    names_it: bool | None = None
    leftover_pids: list[int] = field(default_factory=list)
    leftover_segments: list[str] = field(default_factory=list)
    seconds: float = 0.0
    passed: bool = False
    why: str = ""


def overrides(transport: str) -> list[str]:
    return [*COMMON, "--morph.transport", transport]


def reference(transport: str, workdir: Path) -> dict[int, float]:
    """The losses of the job without a fault."""
    job = WatchedJob(CONFIG, workdir / f"reference-{transport}", RANKS, STEPS, overrides(transport), 300.0).start()
    outcome = job.join()
    if not outcome.ok:
        raise RuntimeError(f"reference run ({transport}) failed: {outcome.status()}\n{job.log()[-3000:]}")
    return job.losses()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _names(cell: Cell, text: str, pid: int) -> bool:
    """Whether the job's output names the failed process (and, for the transports' errors, the link)."""
    if cell.kind == "rank":
        # torchrun names a killed rank; a surviving peer names the link it waited on
        by_torchrun = re.search(
            rf"(Signal \d+ \(SIG\w+\) received by PID {pid})|(exitcode\s*:\s*-\d+ \(pid: {pid}\))", text
        )
        by_peer = re.search(r"link 0 \((fwd|bwd)\)", text)
        return bool(by_torchrun or by_peer)
    return bool(re.search(r"delegate #0 of link 0 \((fwd|bwd), peer stage \d\)", text))


def run_cell(cell: Cell, ref: dict[int, float], workdir: Path) -> CellResult:
    """Run one cell against ``ref`` (the same transport's losses without a fault)."""
    result = CellResult(cell.name, cell.kind, cell.fault, cell.transport, cell.expected())
    dump = workdir / cell.name.replace("/", "_")
    job = WatchedJob(CONFIG, dump, RANKS, STEPS, overrides(cell.transport), 300.0).start()
    fault_at = None
    target = None
    if job.wait_step(FAULT_AFTER, 240.0):
        target = job.find(cell.kind, rank=0)
    if target is None:
        result.why = f"no {cell.kind} of rank 0 found after step {FAULT_AFTER}"
    else:
        fault_at = time.monotonic()
        if cell.fault in ("SIGKILL", "SIGTERM"):
            _signal(target.pid, getattr(signal, cell.fault))
        else:
            _signal(target.pid, signal.SIGSTOP)
            if cell.fault == "SIGSTOP 1.5 s":
                time.sleep(SHORT_STOP_S)
                _signal(target.pid, signal.SIGCONT)
            # past the timeout: it stays stopped; the job (or the harness) ends it
    outcome = job.join()
    text = job.log()
    losses = job.losses()
    result.returncode = outcome.returncode
    result.steps = max(losses, default=0)
    result.seconds = outcome.seconds
    result.leftover_pids, result.leftover_segments = outcome.leftover_pids, outcome.leftover_segments
    result.observed = "continues" if outcome.ok and result.steps == STEPS else "stops"
    if fault_at is not None:
        result.exit_after_fault_s = round(job.seconds_after(fault_at), 1)
    problems = [] if target is not None else [result.why]
    if result.observed != result.expected:
        problems.append(f"expected it {result.expected}, it {result.observed}")
    if result.observed == "continues":
        result.same_losses = losses == ref
        if not result.same_losses:
            problems.append(f"losses {losses} differ from {ref}")
    else:
        result.error = outcome.error or error_line(text)
        result.names_it = target is not None and _names(cell, text, target.pid)
        if not result.names_it:
            problems.append("the output does not name the failed process and link")
        bound = TIMEOUT_S + GRACE_S
        if result.exit_after_fault_s is not None and result.exit_after_fault_s > bound:
            problems.append(f"ranks exited {result.exit_after_fault_s} s after the fault (bound {bound:.0f} s)")
    if result.leftover_pids or result.leftover_segments:
        problems.append(f"left behind: processes {result.leftover_pids}, segments {result.leftover_segments}")
    result.passed = not problems
    result.why = "; ".join(problems)
    return result


def _cell_text(r: dict) -> str:
    mark = "✅" if r["passed"] else "❌"
    if r["observed"] == "continues":
        what = f"continues, {r['steps']} steps, losses {'identical' if r['same_losses'] else 'DIFFER'}"
    else:
        what = f"stops after {r['exit_after_fault_s']} s: {r['error'][:90]}"
    left = "" if not (r["leftover_pids"] or r["leftover_segments"]) else " (left behind!)"
    return f"{mark} {what}{left}"


def write_doc(results: dict[str, dict], path: Path) -> None:
    lines = [
        "# Reliability: the fault matrix",
        "",
        "Generated by `benchmarks/fault_matrix.py` (the tests in `tests/comm/test_fault_matrix.py` run the same",
        f"cells). Each cell is one real training job: llama3 debug model, PP=2 (2 ranks), PipeMorph, {STEPS} steps,",
        f"`[comm] train_timeout_seconds = {TIMEOUT_S:.0f}`, on CPU (gloo). Rank 0's process of the given kind gets the",
        f"fault once step {FAULT_AFTER} is logged. Expected: **continues** (every step, the losses of the same job",
        f"without the fault) or **stops** (every rank exits non-zero within the timeout + {GRACE_S:.0f} s, torchrun's",
        "grace between SIGTERM and SIGKILL, and the output names the process and the link). In every cell no",
        "process and no `/dev/shm` segment of the job may be left behind.",
        "",
    ]
    for transport in TRANSPORTS:
        lines += [f'## transport = "{transport}"', "", "| process \\ fault | " + " | ".join(FAULTS) + " |"]
        lines.append("|---" * (len(FAULTS) + 1) + "|")
        for kind in KINDS:
            row = []
            for fault in FAULTS:
                cell = Cell(kind, fault, transport)
                r = results.get(cell.name)
                row.append(f"expected {cell.expected()}: " + (_cell_text(r) if r else "not run"))
            lines.append(f"| {kind} | " + " | ".join(row) + " |")
        lines.append("")
    ran = [r for r in results.values()]
    passed = sum(r["passed"] for r in ran)
    lines += [
        f"{passed} of {len(ran)} cells as expected ({len(cells())} in the matrix).",
        "",
        "What the outcomes rest on:",
        "",
        "- a stopped and continued process carries on: every titan_morph wait is bounded by the `[comm]`",
        "  timeouts, not by a short poll, and the delegates tell SIGTERM from the wake-up of a stop;",
        "- a dead delegate is reported at once with its link, direction and exit status or signal (its root",
        "  reports every exit; the peer's delegate sees its pair close). With `delegate` the rank stops with",
        "  that error; with `auto` the link stays on, or falls back to, its default path;",
        "- a rank stopped past the timeout: its peer's wait ends after the timeout with an error naming the",
        "  rank, link and operation; torchrun then stops the job (the stopped rank only dies of its SIGKILL);",
        "- nothing is left behind: delegates exit with their trainer (parent-death signal, polling), the",
        "  launcher's supervisor stops any survivor and removes unused segments.",
        "",
    ]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transports", default=",".join(TRANSPORTS))
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--results", type=Path, default=REPO / "outputs" / "fault_matrix" / "cells.json")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "reliability.md")
    parser.add_argument("--rerun", action="store_true")
    opts = parser.parse_args(argv)
    chosen = [
        c
        for c in cells()
        if c.transport in opts.transports.split(",")
        and c.kind in opts.kinds.split(",")
        and c.fault in opts.faults.split(",")
    ]
    results: dict[str, dict] = json.loads(opts.results.read_text()) if opts.results.is_file() else {}
    todo = [c for c in chosen if opts.rerun or c.name not in results]
    opts.results.parent.mkdir(parents=True, exist_ok=True)
    refs: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="titan_morph_faults_") as tmp:
        workdir = Path(tmp)
        for i, cell in enumerate(todo, 1):
            if cell.transport not in refs:
                refs[cell.transport] = reference(cell.transport, workdir)
            t0 = time.monotonic()
            r = run_cell(cell, refs[cell.transport], workdir)
            results[cell.name] = asdict(r)
            opts.results.write_text(json.dumps(results, indent=1) + "\n")
            status = "as expected" if r.passed else f"NOT as expected: {r.why}"
            print(f"[{i}/{len(todo)}] {cell.name}: {r.observed} ({time.monotonic() - t0:.0f} s) {status}", flush=True)
    write_doc(results, opts.doc)
    print(f"wrote {opts.doc} ({sum(r['passed'] for r in results.values())}/{len(results)} cells as expected)")
    return 0 if all(r["passed"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
