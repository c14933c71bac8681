"""The delegate processes of the delegated data plane (paper §5.1–§5.2).

One *root* process is started per training rank (``python -m titan_morph.comm.delegate.worker
--run=<token>``) by :class:`~titan_morph.comm.delegate.transport.DelegateTransport`. It blocks SIGTERM,
imports torch.distributed once, then forks one *delegate* per role — (link, direction, index j < K,
send or receive) — before any thread exists, so K × roles delegates cost one torch import. Every
delegate keeps the root's command line (``titan_morph`` and ``delegate.worker`` in it, so operators
find them with ``ps``) and names itself ``tm-send-l<link><f|b><j>`` / ``tm-recv-...`` (``ps -o comm``).

Each delegate joins its own 2-process Gloo group with the peer delegate of the same (link,
direction, j) on the neighbouring rank (sender = group rank 0), rendezvousing through a TCPStore
that rank 0's trainer runs, under the prefix ``titan_morph/delegates/<run token>/...``: a pair group
needs no tags, per-pair FIFO is Gloo's own order, and one slow pair never blocks another.

* A send delegate reads message descriptors from its command pipe (in order), waits for the slot's
  FILLED flag (set by the trainer, on CUDA stream-ordered after the copy), sleeps until the
  message's delivery time (the link emulator's ``accepted + c``, computed by the trainer's
  ``LinkQueue``), sends a header ``[seq, nbytes]`` and the payload, then sets FREED.
* A receive delegate eagerly receives header and payload into a free slot of a segment it creates
  for that size, sets READY and reports ``(seq, segment, slot, nbytes)`` on its record pipe with
  the arrival time ``t`` (``time.monotonic()``: one host shares CLOCK_MONOTONIC with the trainer,
  which stamps ``MessageRecord.arrived`` from it — independent of when the trainer consumes).

Close handshake. A STOP command carries a bound (ms; 0 = stop at once). With one, a send delegate
sends an END header (``seq = -1``) behind its last message and waits (bounded) for the receive
delegate's acknowledgement: FIFO order means the peer then holds every message, so the trainer's
``close(drain=True)`` returns only once the peer has the data (a send delegate that exited right
after its local send completed could reset the connection under bytes still in flight); a receive
delegate first waits (bounded) for its peer's END. A receive delegate whose pair closes *without*
END reports an error: its peer died.

Lifecycle: a delegate exits on STOP (after the handshake), on EOF of its command pipe, on SIGTERM,
and when its parent dies (``PR_SET_PDEATHSIG`` plus polling ``getppid()``), unlinking every segment
of its role prefix first. A process stopped (SIGSTOP, a debugger, a cgroup freeze) and continued
carries on. The root reaps its delegates and reports each exit on its status pipe (role, pid, exit
code or signal), so the trainer learns of a death at once; when the trainer dies (even SIGKILL) the
root notices, terminates the delegates, unlinks this rank's segments and exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import sys
import threading
import time
from typing import Any, NoReturn

from titan_morph.comm.machine.system import die_with_parent, set_process_name

RECORD = struct.Struct("<qqqqqd")  # kind, a, b, c, d, t — 48 bytes (< PIPE_BUF: atomic writes)
# kinds: READY (delegate joined its pair), NEWSEG/MSG (data plane), STOP (command), ERROR (delegate
# failed; details on its stderr), EXITED (root status pipe: a = role index, b = pid, c = exit code,
# negative = killed by that signal)
READY, NEWSEG, MSG, STOP, ERROR, EXITED = 1, 2, 3, 4, 5, 6
END_SEQ = -1  # header sequence number of the close handshake
POLL_S = 0.2  # parent-death / stop polling interval
FLAG_SPIN_S = 50e-6


def role_name(role: dict[str, Any]) -> str:
    """The short process name of a delegate (``/proc/<pid>/comm``, at most 15 characters)."""
    side = "send" if role["send"] else "recv"
    return f"tm-{side}-l{role['link']}{role['direction'][0]}{role['index']}"[:15]


def sigterm_taken(timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for a (blocked) SIGTERM; True only if SIGTERM itself was taken.

    A stop and continue (SIGSTOP/SIGCONT) interrupts ``sigtimedwait``; when the timeout has passed
    by then, CPython returns a zero-filled ``struct_siginfo`` instead of None. Only ``si_signo``
    tells a real SIGTERM from that."""
    info = signal.sigtimedwait([signal.SIGTERM], timeout_s)
    return info is not None and info.si_signo == signal.SIGTERM


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


def _exit(code: int, prefix: str | None) -> NoReturn:
    if prefix:
        from titan_morph.comm.delegate.shm import unlink_prefix

        try:
            unlink_prefix(prefix)
        except Exception:
            pass
    os._exit(code)


_ENDED = threading.Event()  # a receive delegate got its peer's END: every message has arrived


class _Watchdog(threading.Thread):
    """Exits the process (after unlinking the role's segments) on SIGTERM, parent death, or — for a
    receive delegate, whose main thread sits in a Gloo receive — STOP/EOF on the command pipe. A
    STOP carrying a bound (ms; 0 = none) first waits that long for the peer's END."""

    def __init__(self, parent: int, prefix: str, cmd_fd: int | None) -> None:
        super().__init__(name="titan_morph-delegate-watchdog", daemon=True)
        self.parent, self.prefix, self.cmd_fd = parent, prefix, cmd_fd

    def run(self) -> None:
        while True:
            if sigterm_taken(0 if self.cmd_fd is not None else POLL_S):
                _exit(0, self.prefix)
            if os.getppid() != self.parent:
                _exit(0, self.prefix)
            if self.cmd_fd is not None:
                ready, _, _ = select.select([self.cmd_fd], [], [], POLL_S)
                if ready:
                    rec = read_exact(self.cmd_fd, RECORD.size)
                    if rec is None:
                        _exit(0, self.prefix)
                    kind, linger_ms, *_ = RECORD.unpack(rec)
                    if kind == STOP:  # with a bound: first let the peer's END (its last message) arrive
                        _ENDED.wait(linger_ms / 1e3)
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


def _handshake(dist: Any, header: Any, timeout_s: float, what: str) -> None:
    """Send END behind the last message and wait for the receive delegate's acknowledgement."""
    from datetime import timedelta

    header[0], header[1] = END_SEQ, 0
    dist.isend(header, 1).wait(timedelta(seconds=timeout_s))
    ack = header.new_zeros(1)
    try:
        dist.irecv(ack, 1).wait(timedelta(seconds=timeout_s))
    except RuntimeError as e:
        raise TimeoutError(f"{what}: the peer did not acknowledge the close within {timeout_s:.3g} s") from e


def _send_loop(role: dict[str, Any], dist: Any, torch: Any) -> None:
    from titan_morph.comm.delegate.shm import FILLED, FREED, Segment

    cmd, timeout_s = role["cmd_fd"], role["timeout_s"]
    segments: dict[int, Segment] = {}
    header = torch.zeros(2, dtype=torch.int64)
    what = f"send delegate link {role['link']} {role['direction']} #{role['index']}"
    while True:
        raw = read_exact(cmd, RECORD.size)
        if raw is None:  # the trainer is gone: nobody to hand the data to
            return
        kind, a, b, c, d, t = RECORD.unpack(raw)
        if kind == STOP:  # a: the handshake's bound in ms (0: stop at once)
            if a > 0:
                _handshake(dist, header, a / 1e3, what)
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
    from titan_morph.comm.delegate.shm import CONSUMED, NBYTES, Segment
    from titan_morph.comm.delegate.shm import READY as READY_FLAG

    out, timeout_s, nslots = role["out_fd"], role["timeout_s"], role["slots"]
    by_size: dict[int, tuple[int, Segment]] = {}
    cursor: dict[int, int] = {}
    header = torch.zeros(2, dtype=torch.int64)
    what = f"receive delegate link {role['link']} {role['direction']} #{role['index']}"
    expected = 0
    while True:
        dist.recv(header, 0)  # a pair closed without END raises here: the peer delegate died
        seq, nbytes = int(header[0]), int(header[1])
        if seq == END_SEQ:
            dist.send(header.new_zeros(1), 0)
            _ENDED.set()
            # Messages already here may not be consumed yet: keep the segments until STOP, EOF or
            # parent death (the watchdog exits the process then).
            threading.Event().wait()
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
    die_with_parent(signal.SIGTERM)
    set_process_name(role_name(role))
    prefix = role["prefix"]
    if os.getppid() != root_pid:
        _exit(0, prefix)
    _Watchdog(root_pid, prefix, None if role["send"] else role["cmd_fd"]).start()
    code = 0
    try:
        from datetime import timedelta

        import torch
        import torch.distributed as dist
        from torch._C._distributed_c10d import PrefixStore, TCPStore

        torch.set_num_threads(1)
        host, port = spec["store"].rsplit(":", 1)
        store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=spec["startup_timeout_s"]))
        dist.init_process_group(
            "gloo",
            store=PrefixStore(role["pg_prefix"], store),
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


def _report(status_fd: int | None, role: int, pid: int, status: int) -> None:
    """Tell the trainer that delegate ``role`` (pid) exited (best effort: the trainer may be gone)."""
    if status_fd is None:
        return
    try:
        write_record(status_fd, EXITED, role, pid, os.waitstatus_to_exitcode(status))
    except OSError:
        pass


def _stop_children(children: dict[int, int], stage_prefix: str) -> None:
    for pid in children:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5.0
    while children and time.monotonic() < deadline:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            children.pop(pid, None)
        else:
            time.sleep(0.02)
    for pid in children:  # stopped (SIGSTOP) or stuck in C++: SIGKILL works on both
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _exit(0, stage_prefix)


def main(argv: list[str]) -> None:
    # Block SIGTERM before any thread exists: every thread inherits the mask, so the signal waits
    # for the watchdog's sigtimedwait instead of killing the process without cleanup.
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    spec = json.loads(argv[-1])
    parent = int(spec["parent"])
    die_with_parent(signal.SIGTERM)
    stage_prefix = spec["stage_prefix"]
    status_fd = spec.get("status_fd")
    if os.getppid() != parent:
        _exit(0, stage_prefix)
    import torch.distributed  # noqa: F401  (once, before forking: delegates inherit it)

    roles = spec["roles"]
    children: dict[int, int] = {}  # pid -> role index
    for i, role in enumerate(roles):
        pid = os.fork()
        if pid == 0:
            mine = {role["cmd_fd"], role["out_fd"]}
            for other in roles:
                for fd in (other["cmd_fd"], other["out_fd"]):
                    if fd not in mine:
                        os.close(fd)
            if status_fd is not None:
                os.close(status_fd)
            _run_role(role, spec, os.getppid())
            os._exit(0)
        children[pid] = i
    for role in roles:
        os.close(role["cmd_fd"])
        os.close(role["out_fd"])
    worst = 0
    while children:
        if sigterm_taken(POLL_S) or os.getppid() != parent:
            _stop_children(children, stage_prefix)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            _report(status_fd, children.pop(pid), pid, status)
            worst = max(worst, os.waitstatus_to_exitcode(status) != 0)
    _exit(worst, stage_prefix)


if __name__ == "__main__":
    main(sys.argv)
