"""One variant under one case: a bounded ``torchrun -m titan_morph.train`` job and its outcome.

Each job runs in its own process group with its output in ``<run dir>/train.log``; on timeout or
Ctrl-C the whole group is killed. The outcome (exit code, wall time, the first error line, the
step it failed at) is written to ``<run dir>/outcome.json`` so reports can be regenerated later.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from titan_morph.comm.machine.system import (
    SHM_DIR,
    SHM_PREFIX,
    cmdline,
    environ,
    pids,
    shm_segments,
    signal_group,
    signal_process,
    state,
)

__all__ = [
    "Outcome",
    "Progress",
    "run_command",
    "run_job",
    "run_checked",
    "error_line",
    "load_outcome",
    "marked_processes",
    "OUTCOME_FILE",
    "LOG_FILE",
    "MARKER_ENV",
]

OUTCOME_FILE = "outcome.json"
LOG_FILE = "train.log"
MARKER_ENV = "TITAN_MORPH_COMPARE_RUN"
"""Set (to the run folder) in every job's environment: inherited by its ranks and their delegate
processes, so the harness can find whatever a job leaves behind and stop only its own processes."""
_TOKEN_RE = re.compile(r"--run=([0-9a-f]+)")
_TRAINING_STARTED = "Training starts at step"  # TorchTitan's log line once the trainer is built
_STEP_RE = re.compile(r"\bstep:\s*(\d+)\s")
_ERR_RE = re.compile(r"^(?:\s*\[rank\d+\]:)*\s*((?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception))):\s?(.*)$")
_CONFIG_ERR_RE = re.compile(r"titan_morph: configuration error: (.*)$")
# Secondary failures: a peer crashed, so this rank lost its connection / the launcher reports it.
_SECONDARY = ("ChildFailedError", "Connection closed by peer", "Connection reset by peer", "Broken pipe")


@dataclass
class Outcome:
    """How a job ended; ``failed_step`` is the first step that did not complete (None if it passed
    or failed before training started)."""

    variant: str
    case: str
    command: list[str]
    returncode: int | None
    seconds: float
    timed_out: bool = False
    error: str = ""
    failed_step: int | None = None
    last_step: int = 0
    leftover_pids: list[int] = field(default_factory=list)
    """Processes of the job still alive after it ended (then killed by the harness)."""
    leftover_segments: list[str] = field(default_factory=list)
    """Its /dev/shm segments still present after its processes were gone (then removed)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def status(self) -> str:
        """ "ok", or "failed at step k: <error line>" for the table."""
        if self.ok:
            return "ok"
        where = f"step {self.failed_step}" if self.failed_step else "start-up"
        if self.timed_out:
            return f"timed out at {where} after {self.seconds:.0f} s"
        return f"failed at {where}: {self.error or f'exit code {self.returncode}'}"


def _duration(seconds: float) -> str:
    """``42 s``, ``3m05s``, ``1h02m``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Progress lines for a sequence of ``total`` jobs: job i of n, time elapsed, and an estimate of
    the time left (the mean duration of the jobs finished so far x the jobs still to run)."""

    def __init__(
        self, total: int, echo: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.total, self.echo, self.clock = total, echo, clock
        self.started = clock()
        self.finished = 0
        self._job_started = self.started

    def _elapsed(self) -> str:
        return f"elapsed {_duration(self.clock() - self.started)}"

    def _left(self) -> str:
        if self.finished == 0:
            return "estimate after the first job"
        per_job = (self.clock() - self.started) / self.finished
        return f"about {_duration(per_job * (self.total - self.finished))} left"

    def start(self, what: str) -> None:
        """Announce job ``finished + 1`` of ``total``."""
        self._job_started = self.clock()
        self.echo(f"[job {self.finished + 1}/{self.total}] {what} ... ({self._elapsed()}, {self._left()})")

    def done(self, what: str, status: str = "ok") -> None:
        """Report the job announced last as finished with ``status``."""
        self.finished += 1
        took = _duration(self.clock() - self._job_started)
        left = "all done" if self.finished >= self.total else self._left()
        self.echo(f"[job {self.finished}/{self.total}] {what}: {status} ({took}; {self._elapsed()}, {left})")


def run_command(
    config: Path, dump: Path, nproc: int, steps: int, overrides: Sequence[str], python: str = sys.executable
) -> list[str]:
    """The torchrun command of one job (standalone rendezvous: a free port per job)."""
    from titan_morph.integration.release import current

    return current().train_command(config, dump, nproc, ["--training.steps", str(steps), *overrides], python)


def error_line(log: str) -> str:
    """The most telling error of a failed job's output: the first exception that is not a peer's
    lost connection or the launcher's summary; module paths are dropped (``LinkDownError: ...``)."""
    config = _CONFIG_ERR_RE.search(log)
    if config:
        return f"configuration error: {config.group(1).strip()}"
    primary: list[str] = []
    secondary: list[str] = []
    for line in log.splitlines():
        match = _ERR_RE.match(line)
        if not match:
            continue
        text = f"{match.group(2)}: {match.group(3).strip()}".rstrip(": ")
        (secondary if any(s in line for s in _SECONDARY) else primary).append(text)
    found = primary or secondary
    return found[0][:300] if found else ""


def last_logged_step(log: str) -> int:
    """The last ``step: k`` TorchTitan logged (0 if none)."""
    steps = [int(m.group(1)) for m in _STEP_RE.finditer(log)]
    return max(steps, default=0)


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not signal_group(proc.pid, sig):
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def marked_processes(value: str) -> list[tuple[int, str]]:
    """(pid, command line) of live processes whose environment has ``MARKER_ENV=value``."""
    needle = f"{MARKER_ENV}={value}".encode()
    found = []
    for pid in pids():
        if pid == os.getpid() or needle not in (environ(pid) or ()):
            continue
        cmd = cmdline(pid)
        if cmd is None or state(pid) in ("", "Z"):
            continue  # gone, or exited and not yet reaped
        found.append((pid, cmd))
    return found


def _segments(tokens: set[str]) -> list[str]:
    return sorted(n for n in shm_segments() if any(n.startswith(f"{SHM_PREFIX}{t}") for t in tokens))


def _clean_up(marker: str, tokens: set[str], grace_s: float) -> tuple[list[int], list[str]]:
    """Wait up to ``grace_s`` for the job's processes and segments to go; stop/remove what stays."""
    deadline = time.monotonic() + grace_s
    while True:
        procs, segs = marked_processes(marker), _segments(tokens)
        if (not procs and not segs) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    killed = [pid for pid, _ in procs]
    for pid in killed:  # ours: they carry this job's marker
        signal_process(pid, signal.SIGKILL)
    if killed:
        time.sleep(0.5)
    segs = _segments(tokens)
    for name in segs:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except OSError:
            pass
    return killed, segs


def prepare_run_dir(dump: Path) -> None:
    """Start from an empty run folder (a re-run must not stack TensorBoard events on old ones)."""
    if dump.exists():
        shutil.rmtree(dump)
    dump.mkdir(parents=True)


def run_job(
    command: list[str],
    dump: Path,
    *,
    variant: str,
    case: str,
    timeout_s: float,
    env: dict[str, str] | None = None,
    cleanup_grace_s: float = 10.0,
) -> Outcome:
    """Run ``command`` (from :func:`run_command`) with its output in ``dump/train.log``; never raises
    for a failing job (the outcome says how it ended), only for Ctrl-C after killing it."""
    from titan_morph.integration.supervisor import release_stopped

    prepare_run_dir(dump)
    marker = str(dump)
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}), MARKER_ENV: marker}
    child_env.setdefault("OMP_NUM_THREADS", "1")
    child_env.pop("TITAN_MORPH_RUN_ID", None)
    log_path = dump / LOG_FILE
    start = time.monotonic()
    timed_out = False
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(command) + "\n")
        log.flush()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=child_env)
        tokens: set[str] = set()  # delegate run tokens (their shared-memory segments carry them)
        try:
            while True:
                try:
                    proc.wait(timeout=min(1.0, max(0.0, start + timeout_s - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() - start >= timeout_s:
                        raise
                marked = marked_processes(marker)
                for _, cmd in marked:
                    tokens.update(_TOKEN_RE.findall(cmd))
                release_stopped(pid for pid, _ in marked)  # a stopped rank torchrun asked to end
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except BaseException:
            _kill_group(proc)
            _clean_up(marker, tokens, grace_s=5.0)
            raise
        finally:
            if proc.poll() is None:
                _kill_group(proc)
    seconds = time.monotonic() - start
    leftover_pids, leftover_segments = _clean_up(marker, tokens, grace_s=cleanup_grace_s)
    text = log_path.read_text(errors="replace")
    last = last_logged_step(text)
    ok = proc.returncode == 0 and not timed_out
    outcome = Outcome(
        variant=variant,
        case=case,
        command=command,
        returncode=proc.returncode,
        seconds=round(seconds, 1),
        timed_out=timed_out,
        error="" if ok else (error_line(text) or ("" if timed_out else f"exit code {proc.returncode}")),
        failed_step=None if ok or (last == 0 and _TRAINING_STARTED not in text) else last + 1,
        last_step=last,
        leftover_pids=leftover_pids,
        leftover_segments=leftover_segments,
    )
    (dump / OUTCOME_FILE).write_text(json.dumps(asdict(outcome), indent=2) + "\n")
    return outcome


def run_checked(config: Path, dump: Path, overrides: Sequence[str], timeout_s: float, nproc: int = 4) -> Path:
    """One ``nproc``-rank job of ``config`` with :func:`run_job`'s clean-up; raise ``RuntimeError``
    (with the end of its log) unless it finished. For scripts that need every run (benchmarks)."""
    from titan_morph.integration.release import current

    args = ["--parallelism.pipeline_parallel_degree", str(nproc), *overrides]
    command = current().train_command(config, dump, nproc, args)
    outcome = run_job(command, dump, variant=dump.name, case="", timeout_s=timeout_s)
    if not outcome.ok:
        log = (dump / LOG_FILE).read_text(errors="replace")
        raise RuntimeError(f"{shlex.join(outcome.command)}: {outcome.status()}\n{log[-4000:]}")
    return dump


def load_outcome(dump: Path) -> Outcome | None:
    """The saved outcome of a run folder, or None when the job never finished writing it."""
    path = dump / OUTCOME_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return Outcome(**data)
