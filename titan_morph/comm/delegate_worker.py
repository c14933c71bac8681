"""The delegate processes of the delegated data plane (paper §5.1–§5.2).

One *root* process is started per training rank (``python -m titan_morph.comm.delegate_worker``)
by :class:`~titan_morph.comm.delegate.DelegateTransport`. It blocks SIGTERM, imports
torch.distributed once, then forks one *delegate* per role — (link, direction, index j < K,
send or receive) — before any thread exists, so K × roles delegates cost one torch import.

Each delegate joins its own 2-process Gloo group with the peer delegate of the same (link,
direction, j) on the neighbouring rank (sender = group rank 0), rendezvousing through a TCPStore
that rank 0's trainer runs, under the prefix ``titan_morph/delegates/<run token>/...``: the
simplest robust design — a pair group needs no tags, per-pair FIFO is Gloo's own order, and one
slow pair never blocks another.

* A send delegate reads message descriptors from its command pipe (in order), waits for the slot's
  FILLED flag (set by the trainer, on CUDA stream-ordered after the copy), sleeps until the
  message's delivery time (the link emulator's ``accepted + c``, computed by the trainer's
  ``LinkQueue``), sends a header ``[seq, nbytes]`` and the payload, then sets FREED.
* A receive delegate eagerly receives header and payload into a free slot of a segment it creates
  for that size, sets READY and reports ``(seq, segment, slot, nbytes)`` on its record pipe with
  the arrival time ``t`` (``time.monotonic()``: one host shares CLOCK_MONOTONIC with the trainer,
  which stamps ``MessageRecord.arrived`` from it — independent of when the trainer consumes).

Lifecycle: a delegate exits on STOP, on EOF of its command pipe, on SIGTERM, and when its parent
dies (``PR_SET_PDEATHSIG`` plus polling ``getppid()``), unlinking every segment of its role prefix
first. The root does the same for its children; when the trainer dies (even SIGKILL) the root
notices, terminates the delegates, unlinks this rank's segments and exits.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import struct
import sys
import threading
import time
from typing import Any

RECORD = struct.Struct("<qqqqqd")  # kind, a, b, c, d, t — 48 bytes (< PIPE_BUF: atomic writes)
READY, NEWSEG, MSG, STOP, ERROR = 1, 2, 3, 4, 5
PR_SET_PDEATHSIG = 1
POLL_S = 0.2  # parent-death / stop polling interval
FLAG_SPIN_S = 50e-6


def set_pdeathsig(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):
            pass


def write_record(fd: int, kind: int, a: int = 0, b: int = 0, c: int = 0, d: int = 0, t: float = 0.0) -> None:
    os.write(fd, RECORD.pack(kind, a, b, c, d, t))


def read_exact(fd: int, n: int) -> bytes | None:
    """Read ``n`` bytes (blocking); None on EOF."""
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _exit(code: int, prefix: str | None) -> None:
    if prefix:
        from titan_morph.comm.shm import unlink_prefix

        try:
            unlink_prefix(prefix)
        except Exception:
            pass
    os._exit(code)


class _Watchdog(threading.Thread):
    """Exits the process (after unlinking the role's segments) on SIGTERM, parent death, or — for a
    receive delegate, whose main thread sits in a Gloo receive — STOP/EOF on the command pipe."""

    def __init__(self, parent: int, prefix: str, cmd_fd: int | None) -> None:
        super().__init__(name="titan_morph-delegate-watchdog", daemon=True)
        self.parent, self.prefix, self.cmd_fd = parent, prefix, cmd_fd

    def run(self) -> None:
        while True:
            if signal.sigtimedwait([signal.SIGTERM], 0 if self.cmd_fd is not None else POLL_S) is not None:
                _exit(0, self.prefix)
            if os.getppid() != self.parent:
                _exit(0, self.prefix)
            if self.cmd_fd is not None:
                ready, _, _ = select.select([self.cmd_fd], [], [], POLL_S)
                if ready:
                    rec = read_exact(self.cmd_fd, RECORD.size)
                    if rec is None or RECORD.unpack(rec)[0] == STOP:
                        _exit(0, self.prefix)


def _wait_flag(seg: Any, slot: int, word: int, value: int, timeout_s: float, what: str) -> None:
    if seg.flag(slot, word) == value:
        return
    deadline = time.monotonic() + timeout_s
    delay = FLAG_SPIN_S
    while seg.flag(slot, word) != value:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: flag of slot {slot} in {seg.name} not {value} within {timeout_s:.3g} s")
        time.sleep(delay)
        delay = min(delay * 2, 2e-3)


def _send_loop(role: dict[str, Any], dist: Any, torch: Any) -> None:
    from titan_morph.comm.shm import FILLED, FREED, Segment

    cmd, timeout_s = role["cmd_fd"], role["timeout_s"]
    segments: dict[int, Segment] = {}
    header = torch.zeros(2, dtype=torch.int64)
    what = f"send delegate link {role['link']} {role['direction']} #{role['index']}"
    while True:
        raw = read_exact(cmd, RECORD.size)
        if raw is None:
            return
        kind, a, b, c, d, t = RECORD.unpack(raw)
        if kind == STOP:
            return
        if kind == NEWSEG:
            segments[a] = Segment(f"{role['prefix']}t{a}", b, c, create=False)
            continue
        if kind != MSG:
            raise RuntimeError(f"{what}: unknown command {kind}")
        seq, seg, slot, nbytes = a, segments[b], c, d
        _wait_flag(seg, slot, FILLED, seq + 1, timeout_s, what)
        wait = t - time.monotonic()
        if wait > 0:  # the link emulator's delivery time (paper §7 injected delay)
            time.sleep(wait)
        header[0], header[1] = seq, nbytes
        works = [dist.isend(header, 1)]
        if nbytes:
            works.append(dist.isend(seg.slot(slot)[:nbytes], 1))
        for w in works:
            w.wait()
        seg.set_flag(slot, FREED, seq + 1)


def _recv_loop(role: dict[str, Any], dist: Any, torch: Any) -> None:
    from titan_morph.comm.shm import CONSUMED, NBYTES, Segment
    from titan_morph.comm.shm import READY as READY_FLAG

    out, timeout_s, nslots = role["out_fd"], role["timeout_s"], role["slots"]
    by_size: dict[int, tuple[int, Segment]] = {}
    cursor: dict[int, int] = {}
    header = torch.zeros(2, dtype=torch.int64)
    what = f"receive delegate link {role['link']} {role['direction']} #{role['index']}"
    expected = 0
    while True:
        try:
            dist.recv(header, 0)
        except RuntimeError:  # the peer delegate closed between messages: its trainer shut down
            if "closed" in str(sys.exc_info()[1]).lower():
                # Messages already here may not be consumed yet: keep the segments until STOP,
                # EOF or parent death (the watchdog exits the process then).
                threading.Event().wait()
            raise
        seq, nbytes = int(header[0]), int(header[1])
        if seq != expected:
            raise RuntimeError(f"{what}: message {seq} arrived, expected {expected} (per-pair FIFO broken)")
        expected += 1
        entry = by_size.get(nbytes)
        if entry is None:
            seg_id = len(by_size)
            entry = by_size[nbytes] = (seg_id, Segment(f"{role['prefix']}d{seg_id}", nbytes, nslots, create=True))
            cursor[seg_id] = 0
            write_record(out, NEWSEG, seg_id, nbytes, nslots)
        seg_id, seg = entry
        slot = cursor[seg_id] % nslots
        cursor[seg_id] += 1
        _wait_flag(seg, slot, CONSUMED, seg.flag(slot, READY_FLAG), timeout_s, what + " (trainer not consuming)")
        if nbytes:
            dist.recv(seg.slot(slot)[:nbytes], 0)
        seg.set_flag(slot, NBYTES, nbytes)
        seg.set_flag(slot, READY_FLAG, seq + 1)
        write_record(out, MSG, seq, seg_id, slot, nbytes, time.monotonic())


def _run_role(role: dict[str, Any], spec: dict[str, Any], root_pid: int) -> None:
    set_pdeathsig(signal.SIGTERM)
    prefix = role["prefix"]
    if os.getppid() != root_pid:
        _exit(0, prefix)
    _Watchdog(root_pid, prefix, None if role["send"] else role["cmd_fd"]).start()
    code = 0
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        host, port = spec["store"].rsplit(":", 1)
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=spec["startup_timeout_s"]))
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(role["pg_prefix"], store),
            rank=0 if role["send"] else 1,
            world_size=2,
            timeout=timedelta(seconds=spec["wire_timeout_s"]),
        )
        write_record(role["out_fd"], READY)
        (_send_loop if role["send"] else _recv_loop)(role, dist, torch)
    except BaseException as e:  # reported to the trainer; details on stderr (the trainer's log)
        code = 1
        print(f"titan_morph delegate {prefix}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        try:
            write_record(role["out_fd"], ERROR)
        except OSError:
            pass
    _exit(code, prefix)


def main(argv: list[str]) -> None:
    # Block SIGTERM before any thread exists: every thread inherits the mask, so the signal waits
    # for the watchdog's sigtimedwait instead of killing the process without cleanup.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    spec = json.loads(argv[-1])
    parent = int(spec["parent"])
    set_pdeathsig(signal.SIGTERM)
    stage_prefix = spec["stage_prefix"]
    if os.getppid() != parent:
        _exit(0, stage_prefix)
    import torch.distributed  # noqa: F401  (once, before forking: delegates inherit it)

    children: dict[int, dict[str, Any]] = {}
    for role in spec["roles"]:
        pid = os.fork()
        if pid == 0:
            mine = {role["cmd_fd"], role["out_fd"]}
            for other in spec["roles"]:
                for fd in (other["cmd_fd"], other["out_fd"]):
                    if fd not in mine:
                        os.close(fd)
            _run_role(role, spec, os.getppid())
            os._exit(0)
        children[pid] = role
    for role in spec["roles"]:
        os.close(role["cmd_fd"])
        os.close(role["out_fd"])
    worst = 0
    while children:
        if signal.sigtimedwait([signal.SIGTERM], POLL_S) is not None or os.getppid() != parent:
            for pid in children:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5.0
            while children and time.monotonic() < deadline:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid:
                    children.pop(pid, None)
                else:
                    time.sleep(0.02)
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _exit(0, stage_prefix)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            children.pop(pid, None)
            worst = max(worst, os.waitstatus_to_exitcode(status) != 0)
    _exit(worst, stage_prefix)


if __name__ == "__main__":
    main(sys.argv)
