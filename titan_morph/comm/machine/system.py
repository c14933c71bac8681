"""What titan_morph asks of the operating system: ``prctl``, ``/proc`` and ``/dev/shm``.

One place for the Linux specifics that the delegate worker, the transports, the supervisor of
torchrun and the comparison runner all need. Standard library only: the delegate worker subprocess
imports this before anything else. Elsewhere than Linux the ``prctl`` calls do nothing and the
readers find no process and no segment.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

__all__ = [
    "HEAP_TRIM_STEPS",
    "SHM_DIR",
    "SHM_PREFIX",
    "become_subreaper",
    "cmdline",
    "descendants",
    "die_with_parent",
    "environ",
    "exit_without_teardown",
    "fd_targets",
    "mapped_paths",
    "pids",
    "proc_status",
    "process_name",
    "process_table",
    "release_free_heap",
    "segments_in_use",
    "set_process_name",
    "shm_free_bytes",
    "shm_segments",
    "signal_group",
    "signal_process",
    "state",
]

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
SHM_DIR = "/dev/shm"
SHM_PREFIX = "titan_morph_"
"""Every titan_morph shared-memory segment is ``SHM_DIR/SHM_PREFIX...``, so leftovers are easy to find."""
HEAP_TRIM_STEPS = 50
"""How often (training steps) a rank returns its free C heap to the system (:func:`release_free_heap`)."""


# --------------------------------------------------------------------------------------------
# prctl


def _prctl(option: int, value: int | bytes) -> None:
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent exits, so nothing outlives its starter."""
    _prctl(PR_SET_PDEATHSIG, int(sig))


def become_subreaper() -> None:
    """Make this process the parent of every orphan below it, so that it can stop them all."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def release_free_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim(0)``; elsewhere nothing).

    glibc keeps what a process frees in its arenas, one per thread that allocated; a training step's
    short-lived allocations (messages, copies, a re-plan's simulations) from several threads leave
    free pages between live blocks, and the resident set creeps by a few hundred KB over a thousand
    steps though nothing live grows. Called every :data:`HEAP_TRIM_STEPS` steps; takes milliseconds.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc: no malloc_trim
        ctypes.CDLL(None).malloc_trim(0)


def exit_without_teardown(code: int) -> NoReturn:
    """End this process with ``code`` as the interpreter would (non-daemon threads joined, exit
    handlers run, output flushed), without its teardown of every module.

    In a process that imported torch that teardown is about a second of CPU (each operator is
    deregistered), paid by all of a job's ranks at once after the last step: on a small host the
    job's exit waits seconds for it. Only for a process whose resources are released explicitly or
    by exit handlers (files closed, children waited for, segments unlinked).
    """
    threading._shutdown()  # type: ignore[attr-defined]  # Py_FinalizeEx's first step: join the threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def set_process_name(name: str) -> None:
    """Name this process (``/proc/<pid>/comm``, what ``ps -o comm`` shows; at most 15 bytes kept)."""
    _prctl(PR_SET_NAME, name.encode())


# --------------------------------------------------------------------------------------------
# /proc


def pids() -> list[int]:
    """Every process id listed in ``/proc`` now."""
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, parent pid, ...); None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def state(pid: int) -> str:
    """The state letter of ``pid`` (``R``, ``S``, ``T``, ``Z``...); empty when it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else ""


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every live process."""
    table = {}
    for pid in pids():
        fields = _stat_fields(pid)
        if fields:
            table[pid] = (int(fields[1]), fields[0])
    return table


def descendants(root: int | None = None) -> list[int]:
    """Live (non-zombie) processes below ``root`` (default: this process)."""
    root = os.getpid() if root is None else root
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if table.get(pid, (0, "Z"))[1] != "Z":
            found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def proc_status(pid: int) -> dict[str, str]:
    """The fields of ``/proc/<pid>/status`` (name -> value, stripped); empty when ``pid`` is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(errors="replace")
    except OSError:
        return {}
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


def process_name(pid: int) -> str:
    """``/proc/<pid>/comm`` (see :func:`set_process_name`); empty when ``pid`` is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text(errors="replace").strip()
    except OSError:
        return ""


def environ(pid: int) -> list[bytes] | None:
    """The ``NAME=value`` items of ``pid``'s environment; None when it is gone or not ours to read."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None


def cmdline(pid: int) -> str | None:
    """``pid``'s command line, arguments joined by spaces; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace")


def fd_targets(pid: int | str = "self") -> dict[int, str]:
    """Open descriptor -> what it refers to (a path, ``socket:[inode]``...) of ``pid``; empty when unreadable."""
    out = {}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    for fd in fds:
        try:
            out[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
    return out


def mapped_paths(pid: int | str = "self") -> set[str]:
    """The files ``pid`` maps (``/proc/<pid>/maps``, `` (deleted)`` kept); empty when unreadable."""
    try:
        lines = Path(f"/proc/{pid}/maps").read_text(errors="replace").splitlines()
    except OSError:
        return set()
    return {fields[5] for fields in (line.split(None, 5) for line in lines) if len(fields) == 6}


# --------------------------------------------------------------------------------------------
# Signals


def _delivered(send: Callable[[int, int], None], target: int, sig: int) -> bool:
    try:
        send(target, sig)
    except ProcessLookupError:
        return False
    return True


def signal_process(pid: int, sig: int) -> bool:
    """Send ``sig`` to ``pid``; False when it is already gone (not an error: it ended on its own)."""
    return _delivered(os.kill, pid, sig)


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when no process of it is left."""
    return _delivered(os.killpg, pgid, sig)


# --------------------------------------------------------------------------------------------
# /dev/shm


def shm_segments(prefix: str = SHM_PREFIX) -> set[str]:
    """Names of the shared-memory segments starting with ``prefix`` that exist now."""
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(prefix)}
    except OSError:
        return set()


def shm_free_bytes(path: str = SHM_DIR) -> int | None:
    """Bytes an unprivileged process can still allocate in ``path`` (a tmpfs: pages written to a
    segment beyond this end in SIGBUS, not in an error); None when it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return int(st.f_bavail) * int(st.f_frsize)


def segments_in_use() -> set[str]:
    """titan_morph segments that some live process maps or holds open."""
    used = set()
    marker = f"{SHM_DIR}/{SHM_PREFIX}"
    for pid in pids():
        for path in mapped_paths(pid):
            if path.startswith(marker):
                used.add(path[len(marker) :].split()[0].removesuffix("(deleted)"))
        for target in fd_targets(pid).values():
            if target.startswith(marker):
                used.add(target[len(marker) :].split()[0])
    return {SHM_PREFIX + name for name in used}
