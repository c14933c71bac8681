"""A training job watched while it runs, for the soak and fault-matrix benchmarks.

The job itself is :func:`titan_morph.compare.runner.run_job` (a bounded ``torchrun -m
titan_morph.train`` in its own process group, output in ``<dump>/train.log``, whatever it leaves
behind found by its environment marker, stopped and reported). :class:`WatchedJob` runs it in a
thread and, meanwhile, reads the steps its log reports (with the moment each appeared) and names
its processes: the ranks, their delegate roots and their send / receive delegates.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from titan_morph.comm.machine.system import environ, proc_status, process_name
from titan_morph.compare.runner import LOG_FILE, Outcome, marked_processes, prepare_run_dir, run_command, run_job

__all__ = ["JobProcess", "WatchedJob", "rss_kb"]

_STEP_RE = re.compile(r"(?:\[rank(\d+)\]:)?.*\bstep:\s*(\d+)\s+loss:\s*([-+0-9.eEnaif]+)")
KINDS = ("rank", "delegate root", "send delegate", "receive delegate")


@dataclass(frozen=True)
class JobProcess:
    pid: int
    rank: int
    kind: str  # one of KINDS
    name: str  # /proc/<pid>/comm: tm-send-l0f0 ... for delegates


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def rss_kb(pid: int) -> int | None:
    """Resident set size of ``pid`` in KiB (None when it is gone)."""
    rss = proc_status(pid).get("VmRSS")  # "123456 kB"
    return int(rss.split()[0]) if rss else None


def _rank_of(pid: int) -> int:
    for item in environ(pid) or ():
        if item.startswith(b"RANK="):
            return int(item[5:])
    return -1


class WatchedJob:
    """``run_job`` of ``nproc`` ranks of ``config`` for ``steps`` steps, in a background thread."""

    def __init__(
        self,
        config: Path,
        dump: Path,
        nproc: int,
        steps: int,
        overrides: Sequence[str],
        timeout_s: float,
        env: dict[str, str] | None = None,
    ) -> None:
        args = ["--parallelism.pipeline_parallel_degree", str(nproc), *overrides]
        self.env = env
        self.command = run_command(config, dump, nproc, steps, args)
        self.dump, self.timeout_s = dump, timeout_s
        self.outcome: Outcome | None = None
        self.error: BaseException | None = None
        self.started = 0.0
        self.ended = 0.0
        self._seen: dict[int, float] = {}
        self._losses: dict[int, dict[int, float]] = {}  # rank -> step -> loss
        self._offset = 0
        self._thread = threading.Thread(target=self._run, name=f"job-{dump.name}", daemon=True)

    def _run(self) -> None:
        try:
            self.outcome = run_job(
                self.command, self.dump, variant=self.dump.name, case="", timeout_s=self.timeout_s, env=self.env
            )
        except BaseException as e:  # reported by join()
            self.error = e
        finally:
            self.ended = time.monotonic()

    def start(self) -> WatchedJob:
        prepare_run_dir(self.dump)  # now: a poll before the job's thread empties it would read an old log
        self.started = time.monotonic()
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def poll(self) -> dict[int, float]:
        """Steps logged so far -> the moment (``time.monotonic()``) they were first seen."""
        path = self.dump / LOG_FILE
        try:
            with open(path, errors="replace") as fh:
                fh.seek(self._offset)
                text = fh.read()
        except OSError:
            return dict(self._seen)
        cut = text.rfind("\n") + 1  # a half-written last line is read again next time
        self._offset += len(text[:cut].encode())
        now = time.monotonic()
        for line in text[:cut].splitlines():
            m = _STEP_RE.search(line)
            if m:
                step = int(m.group(2))
                self._seen.setdefault(step, now)
                self._losses.setdefault(int(m.group(1) or 0), {})[step] = float(m.group(3))
        return dict(self._seen)

    def losses(self) -> dict[int, float]:
        """The loss the last rank (the one that has it) logged at each step (as printed: 5 decimals)."""
        self.poll()
        return dict(self._losses[max(self._losses)]) if self._losses else {}

    def wait_step(self, step: int, timeout_s: float, every_s: float = 0.1) -> bool:
        """Wait until step ``step`` is logged (False: the job ended or the time ran out first)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if step in self.poll():
                return True
            if not self.running:
                return step in self.poll()
            time.sleep(every_s)
        return False

    def processes(self) -> list[JobProcess]:
        """The job's live processes that are ranks or delegates."""
        out = []
        for pid, cmd in marked_processes(str(self.dump)):
            name = process_name(pid)
            if name.startswith("tm-send"):
                kind = "send delegate"
            elif name.startswith("tm-recv"):
                kind = "receive delegate"
            elif "titan_morph.comm.delegate.worker" in cmd:
                kind = "delegate root"
            elif "titan_morph.train" in cmd and "torch.distributed.run" not in cmd and "launch supervise" not in cmd:
                kind = "rank"
            else:
                continue
            out.append(JobProcess(pid, _rank_of(pid), kind, name))
        return out

    def find(self, kind: str, rank: int = 0) -> JobProcess | None:
        """The first process of ``kind`` belonging to ``rank``."""
        matches = sorted((p for p in self.processes() if p.kind == kind and p.rank == rank), key=lambda p: p.name)
        return matches[0] if matches else None

    def join(self) -> Outcome:
        self._thread.join(self.timeout_s + 120.0)
        if self.error is not None:
            raise self.error
        if self.outcome is None:
            raise RuntimeError(f"{self.dump}: the job did not end")
        self.poll()
        return self.outcome

    def log(self) -> str:
        return _read(str(self.dump / LOG_FILE))

    def seconds_after(self, moment: float) -> float:
        """Seconds from ``moment`` (``time.monotonic()``) until torchrun exited."""
        assert self.outcome is not None
        return self.started + self.outcome.seconds - moment
