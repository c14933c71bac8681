"""The supervisor of a torchrun job: nothing outlives it, and it restarts the job when the ranks ask
for a new rank order.

What :func:`supervise` guarantees, after a run, a failed run or Ctrl-C:

* torchrun writes its per-rank logs into a private folder (``--log-dir``), removed afterwards, so
  no ``/tmp/torchelastic_*`` folder stays;
* the supervisor is the child subreaper of everything it starts (``PR_SET_CHILD_SUBREAPER``):
  processes orphaned by a dying torchrun or rank come back to it and are stopped (SIGTERM, then
  SIGKILL); torchrun itself gets SIGTERM if the supervisor dies (``PR_SET_PDEATHSIG``), and
  ``titan_morph.train`` asks for the same on every rank;
* shared-memory segments ``/dev/shm/titan_morph_*`` created during the run that no live process
  maps or holds open any more are removed.

Relaunch with a new rank order (the DP x PP orchestrator, :mod:`titan_morph.integration.hybrid`;
the protocol is :mod:`titan_morph.integration.relaunch`). The supervisor gives the ranks
``$TITAN_MORPH_RELAUNCH_FILE``. When the orchestrator moves hosts between ranks, the ranks
checkpoint, rank 0 writes the new host of every rank there and they exit cleanly; the supervisor
then starts torchrun again in the same run folder (``$TITAN_MORPH_RUN_ID`` is kept), with
``$TITAN_MORPH_HOSTS`` naming each rank's host, ``$TITAN_MORPH_TOPOLOGY_CHANGES`` the moves made
so far and ``$TITAN_MORPH_SLOW_PAIRS`` the pairs measured slow, and the ranks resume from the
checkpoint. A re-partition (``[morph] partition = "auto"``) relaunches the same way with the
hosts unchanged and the request's ``env`` (the new split, what the partition's monitor carries).
Each launch gets ``$TITAN_MORPH_LAUNCH_TIME``, when it started. At most :data:`MAX_RELAUNCHES`
times per run.

``python -m titan_morph.launch supervise -- COMMAND ...`` runs :func:`supervise_main`.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from titan_morph.comm.machine.system import (
    SHM_DIR,
    become_subreaper,
    descendants,
    die_with_parent,
    proc_status,
    segments_in_use,
    shm_segments,
    signal_group,
    signal_process,
)
from titan_morph.integration.relaunch import (
    CARRIED,
    HOSTS_ENV,
    LAUNCH_ENV,
    MOVES_ENV,
    RELAUNCH_ENV,
    SLOW_ENV,
    SPLIT_ENV,
    take_request,
)

TRAIN_MODULE = "titan_morph.train"
STOP_GRACE_S = 10.0
"""Seconds stray processes get between SIGTERM and SIGKILL once torchrun has exited."""
MAX_RELAUNCHES = 8


def torchrun_command(
    config_file: str | Path, dump_folder: str | Path, nproc: int, overrides: Sequence[str] = (), python: str = ""
) -> list[str]:
    """``torchrun --standalone`` (a free rendezvous port per job) of ``python -m titan_morph.train`` on
    ``nproc`` ranks, with TorchTitan's conventions (``--job.config_file``, ``--job.dump_folder``,
    overrides), run under :func:`supervise` so that nothing outlives the job."""
    python = python or sys.executable
    return [
        python,
        "-m",
        "titan_morph.launch",
        "supervise",
        "--",
        *torchrun_args(python, nproc),
        "-m",
        TRAIN_MODULE,
        "--job.config_file",
        str(config_file),
        "--job.dump_folder",
        str(dump_folder),
        *overrides,
    ]


def torchrun_args(
    python: str, nproc: int, show_ranks: str = "", rendezvous: Sequence[str] = ("--standalone",)
) -> list[str]:
    """``torchrun`` on ``nproc`` ranks of this node, showing the output of the local ranks
    ``show_ranks`` only (all when empty); ``rendezvous``: how the node joins the job (one node:
    ``--standalone``, a free rendezvous port; several: :meth:`.nodes.Nodes.rendezvous_args`)."""
    shown = ["--local-ranks-filter", show_ranks] if show_ranks else []
    return [python, "-m", "torch.distributed.run", *rendezvous, f"--nproc-per-node={nproc}", *shown]


def _with_log_dir(cmd: list[str], log_dir: str) -> list[str]:
    """Insert ``--role rank --tee 3 --log-dir LOG_DIR`` after torchrun in ``cmd`` unless it sets them."""
    for i, arg in enumerate(cmd):
        if arg == "torch.distributed.run" or Path(arg).name == "torchrun":
            extra = [] if any(a.split("=")[0] in ("--log-dir", "--log_dir") for a in cmd) else ["--log-dir", log_dir]
            if "--tee" not in cmd:
                extra = ["--role", "rank", "--tee", "3", *extra]
            return [*cmd[: i + 1], *extra, *cmd[i + 1 :]]
    return cmd


_TERMINATING = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1))


def stopped_with_termination_pending(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, job control) while a SIGTERM or SIGINT waits for it: a
    stopped rank that torchrun asked to stop would otherwise hold the job until torchrun's SIGKILL,
    30 s later."""
    fields = proc_status(pid)
    if not fields.get("State", "").startswith("T"):  # "t" (a debugger's trace stop) is left alone
        return False
    pending = int(fields.get("ShdPnd") or "0", 16) | int(fields.get("SigPnd") or "0", 16)
    return bool(pending & _TERMINATING)


def release_stopped(pids: Iterable[int]) -> list[int]:
    """Continue every process of ``pids`` that is stopped with a termination pending, so that it ends
    now (its pending signal is delivered on SIGCONT); returns those pids."""
    released = [pid for pid in pids if stopped_with_termination_pending(pid)]
    for pid in released:
        signal_process(pid, signal.SIGCONT)
    return released


def _reap() -> None:
    """Collect exited children (orphans re-parented to this subreaper become its zombies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_descendants(grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM every process still below this one, SIGKILL what remains after ``grace_s``; returns
    the pids that were still there."""
    _reap()
    left = descendants()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in descendants():
            signal_process(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while descendants() and time.monotonic() < deadline:
            _reap()
            time.sleep(0.1)
        _reap()
    return left


def remove_stale_segments(existing_before: set[str]) -> list[str]:
    """Remove segments that appeared since ``existing_before`` and nobody uses any more."""
    new = shm_segments() - existing_before
    if not new:
        return []
    stale = sorted(new - segments_in_use())
    for name in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))
    return stale


def forward_signal(pgid: int, sig: int, *, first: bool) -> None:
    """Pass a terminal signal on to torchrun's process group ``pgid``, which stops its ranks in order;
    from the second one on, SIGKILL the group and everything below this process at once (the user
    asked twice)."""
    if first:
        signal_group(pgid, sig)
    elif signal_group(pgid, signal.SIGKILL):
        for pid in descendants():
            signal_process(pid, signal.SIGKILL)


def supervise(cmd: list[str], env: Mapping[str, str] | None = None) -> int:
    """Run a torchrun command and clean up after it (see the module docstring); returns its exit code,
    or 128 + the signal number when it was interrupted (130 for Ctrl-C).

    The first SIGINT/SIGTERM/SIGHUP is passed on to torchrun, which stops its ranks; a second one
    kills everything at once. A clean exit with a relaunch request starts the command again.
    """
    become_subreaper()
    log_dir = tempfile.mkdtemp(prefix="titan_morph_torchrun_")
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("TITAN_MORPH_RUN_ID", time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    request = Path(log_dir) / "relaunch.json"
    child_env[RELAUNCH_ENV] = str(request)
    received: list[int] = []
    proc: subprocess.Popen[bytes] | None = None

    def on_signal(sig: int, _frame: Any) -> None:
        received.append(sig)
        if proc is not None and proc.poll() is None:
            forward_signal(proc.pid, sig, first=len(received) == 1)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, on_signal) for sig in handled}
    launches = 0
    try:
        while True:
            segments_before = shm_segments()
            child_env[LAUNCH_ENV] = repr(time.time())
            try:
                proc = subprocess.Popen(
                    _with_log_dir(cmd, log_dir),
                    env=child_env,
                    start_new_session=True,  # terminal signals reach this process only; it forwards them once
                    preexec_fn=die_with_parent,
                )
                while proc.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=0.5)
                    release_stopped(descendants())
                code = proc.returncode
            finally:
                if proc is not None and proc.poll() is None:
                    signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
                stop_descendants()
                remove_stale_segments(segments_before)
            wanted = take_request(request) if code == 0 and not received else None
            if wanted is None:
                break
            if launches >= MAX_RELAUNCHES:
                print(f"titan_morph.launch: not relaunching: {MAX_RELAUNCHES} relaunches already", file=sys.stderr)
                break
            launches += 1
            child_env[HOSTS_ENV] = ",".join(str(h) for h in wanted["hosts"])
            child_env[MOVES_ENV] = str(wanted["moves"])
            child_env[SLOW_ENV] = wanted.get("slow", "")
            carried = {k: str(v) for k, v in wanted.get("env", {}).items() if k in CARRIED}
            child_env.update(carried)
            what = (
                f"with layers per stage [{carried[SPLIT_ENV].replace(',', ', ')}]"
                if SPLIT_ENV in carried
                else f"with the host of each rank {wanted['hosts']} (topology move {wanted['moves']})"
            )
            print(
                f"titan_morph.launch: relaunching after step {wanted['step']} {what}: {wanted['reason']}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 + received[0] if received else code


def supervise_main(args: list[str]) -> int:
    """The ``supervise`` sub-command: :func:`supervise` of the command after ``--``."""
    return supervise(args[1:] if args[:1] == ["--"] else args)
