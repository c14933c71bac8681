"""The delegate processes of one :class:`~titan_morph.comm.delegate.transport.DelegateTransport`: start, watch, stop.

One delegate root process (:mod:`titan_morph.comm.delegate.worker`) per rank forks a delegate per
role (link, direction, index). The pool gives each role its pipes, meets the peer ranks' pools
through a TCPStore that rank 0's trainer serves, and runs the reader thread that reads what the
delegates write (arrivals, new segments, errors) and the root's status pipe (which delegate exited
and how). A first sign of failure becomes a declared :class:`DelegateError` once the exit status is
known (or after ``REPORT_GRACE_S``); it is logged and passed to the listeners.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore

from titan_morph.comm.delegate import worker as wire
from titan_morph.comm.delegate.shm import PREFIX, CudaCallError, Segment, unlink_prefix
from titan_morph.comm.groups import check_interface, interface_address
from titan_morph.comm.machine.devices import bind_device
from titan_morph.comm.timeouts import CommTimeouts

__all__ = ["DelegateEnd", "DelegateError", "DelegatePool", "Listener", "exit_status"]

logger = logging.getLogger(__name__)

STORE_PREFIX = "titan_morph/delegates"
READ_POLL_S = 0.25  # the reader thread's select() bound when nothing is pending
REPORT_GRACE_S = 1.0  # how long a first sign of failure waits for the root's exit status
QUICK_CLOSE_S = 0.5  # a close without drain: how long a send delegate may wait for its END to be acknowledged
# Module-level: the store key of the n-th pool built in this process must be the same on every rank.
_instances = itertools.count()


class DelegateError(RuntimeError):
    """A delegate process failed or exited while the transport needed it (names the delegate)."""


Listener = Callable[[int, str, DelegateError], None]


def exit_status(code: int | None) -> str:
    """An exit code as ``os.waitstatus_to_exitcode`` gives it, in words."""
    if code is None:
        return "stopped reporting (its record pipe closed)"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return "exited" if code == 0 else f"exited with code {code} (its error is on stderr above)"


def _split_records(buf: bytes) -> tuple[list[tuple[Any, ...]], bytes]:
    """The whole fixed-size records at the start of ``buf`` (a pipe delivers them in any chunks) and
    the incomplete rest."""
    n = len(buf) // wire.RECORD.size * wire.RECORD.size
    return [wire.RECORD.unpack_from(buf, i) for i in range(0, n, wire.RECORD.size)], buf[n:]


class DelegateEnd:
    """Trainer-side end of one delegate: its pipes, its segments, its reports and (receive side) arrivals."""

    def __init__(self, link: int, direction: str, index: int, send: bool, prefix: str, peer: int, role: int) -> None:
        self.link, self.direction, self.index, self.send = link, direction, index, send
        self.prefix, self.peer, self.role = prefix, peer, role
        self.cmd_r, self.cmd_w = os.pipe()
        self.out_r, self.out_w = os.pipe()
        self.segments: dict[int, Segment] = {}
        self.by_size: dict[int, int] = {}  # send side: message size -> segment id
        self.cursor: dict[int, int] = {}  # send side: next slot (mod nslots) per segment
        # receive side: local seq -> (segment, slot, nbytes, time.monotonic() when the delegate had it)
        self.arrived: dict[int, tuple[int, int, int, float]] = {}
        self.ready = False
        self.eof = False
        self.buf = b""
        self.sign: tuple[str, float] | None = None  # first sign of failure and when (awaiting the exit status)
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.exited = False
        self.error: DelegateError | None = None  # the declared failure

    def describe(self) -> str:
        side = "send" if self.send else "receive"
        return f"{side} delegate #{self.index} of link {self.link} ({self.direction}, peer stage {self.peer})"

    def role_spec(self, token: str, timeout_s: float, slots: int) -> dict[str, Any]:
        return {
            "link": self.link,
            "direction": self.direction,
            "index": self.index,
            "send": self.send,
            "cmd_fd": self.cmd_r,
            "out_fd": self.out_w,
            "prefix": self.prefix,
            "pg_prefix": f"{STORE_PREFIX}/{token}/{self.link}/{self.direction}/{self.index}",
            "timeout_s": timeout_s,
            "slots": slots,
        }

    def command(self, kind: int, a: int = 0, b: int = 0, c: int = 0, d: int = 0, t: float = 0.0) -> None:
        try:
            wire.write_record(self.cmd_w, kind, a, b, c, d, t)
        except (BrokenPipeError, OSError) as e:
            raise DelegateError(f"{self.describe()} is gone (command pipe: {e})") from e


class DelegatePool:
    """The delegates of one rank: K per (link, direction) this stage serves, under one root process.

    ``cond`` guards every end's reports and is notified when the reader thread read something;
    ``prepare_segment`` readies a segment a receive delegate made; ``releases_pending`` and
    ``poll_releases`` let the reader thread release receive slots whose device copy completed.
    ``interfaces``: ``[morph] host_ifnames``; the delegates' gloo pairs and their store use the
    first (() = torch's choice, the store on ``MASTER_ADDR``); the others are not used yet.
    """

    def __init__(
        self,
        *,
        stage: int,
        num_stages: int,
        where: str,
        group_name: str,
        k: int,
        slots: int,
        timeouts: CommTimeouts,
        strict: bool,
        prepare_segment: Callable[[Segment], None],
        releases_pending: Callable[[], int],
        poll_releases: Callable[[], int],
        drain_copies: Callable[[float], bool] = lambda bound_s: True,
        device: torch.device | None = None,
        interfaces: tuple[str, ...] = (),
    ) -> None:
        for name in interfaces:
            check_interface(name, "[morph] host_ifnames")
        self.interfaces = interfaces
        self.stage, self.num_stages, self.where = stage, num_stages, where
        self.k, self.slots, self.timeouts, self.strict = k, slots, timeouts, strict
        self._prepare_segment = prepare_segment
        self._releases_pending, self._poll_releases = releases_pending, poll_releases
        self._drain_copies, self.device = drain_copies, device
        self.cond = threading.Condition()
        self.closed = False
        self.closing = False  # failures found while closing are not reported
        self.first_error: DelegateError | None = None
        self._listeners: list[Listener] = []
        self._root_exit: int | None = None
        self._status_r: int | None = None
        self._status_eof = False
        self._status_buf = b""
        self._reader: threading.Thread | None = None
        self._master: TCPStore | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = self._rendezvous(group_name)
        self.prefix = f"{PREFIX}{self.token}_s{stage}_"
        self.delegates: dict[tuple[int, str], list[DelegateEnd]] = {}
        self.roles: list[DelegateEnd] = []

    # -- start ----------------------------------------------------------------------------------
    def _rendezvous(self, group_name: str) -> str:
        """Rank 0's trainer serves a TCPStore for the delegates; its address (on the first host
        interface when ``interfaces`` names one, else ``MASTER_ADDR``) and a run token travel
        through the training group's store (key namespace per group and construction order)."""
        base = dist.distributed_c10d._get_default_store()
        key = f"{STORE_PREFIX}/{group_name}/{next(_instances)}/addr"
        startup = timedelta(seconds=self.timeouts.init_s)
        if self.stage == 0:
            if self.interfaces:
                host = interface_address(self.interfaces[0], "[morph] host_ifnames")
            else:
                host = os.environ.get("MASTER_ADDR", "127.0.0.1")
            self._master = TCPStore(
                "0.0.0.0" if host not in ("127.0.0.1", "localhost") else host,
                0,
                is_master=True,
                wait_for_workers=False,
                timeout=startup,
            )
            token = uuid.uuid4().hex[:12]
            base.set(key, f"{token}@{host}:{self._master.port}")
        client = base.clone()  # type: ignore[attr-defined, unused-ignore]  # in torch's stub from 2.15 only
        client.set_timeout(startup)
        value: str = client.get(key).decode()
        token, self._store_addr = value.split("@", 1)
        return token

    def start(self, wire_timeout_s: float) -> None:
        """Spawn the delegates, start the reader thread and wait until each delegate joined its pair."""
        for link in (self.stage - 1, self.stage):
            if not 0 <= link < self.num_stages - 1:
                continue
            for direction in ("fwd", "bwd"):
                send = (direction == "fwd") == (link == self.stage)
                peer = link + 1 if link == self.stage else link
                pool = []
                for j in range(self.k):
                    prefix = f"{self.prefix}l{link}{direction}{j}_"
                    pool.append(DelegateEnd(link, direction, j, send, prefix, peer, len(self.roles)))
                    self.roles.append(pool[-1])
                self.delegates[(link, direction)] = pool
        status_r, status_w = os.pipe()
        self._status_r = status_r
        spec = {
            "parent": os.getpid(),
            "stage_prefix": self.prefix,
            "store": self._store_addr,
            "startup_timeout_s": self.timeouts.init_s,
            "wire_timeout_s": wire_timeout_s,
            "status_fd": status_w,
            # a delegate's own waits (a FILLED flag, a consumed slot) get the longer of the two bounds
            "roles": [dg.role_spec(self.token, self.timeouts.init_s, self.slots) for dg in self.roles],
        }
        child_fds = [fd for dg in self.roles for fd in (dg.cmd_r, dg.out_w)] + [status_w]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if self.interfaces:  # the delegates' gloo pairs connect over the host interface
            env["GLOO_SOCKET_IFNAME"] = self.interfaces[0]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "titan_morph.comm.delegate.worker", f"--run={self.token}", json.dumps(spec)],
            pass_fds=child_fds,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        for fd in child_fds:
            os.close(fd)
        name = f"titan_morph-delegates-s{self.stage}"
        self._reader = threading.Thread(target=self._read_loop, name=name, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.timeouts.init_s
        with self.cond:
            for dg in self.roles:
                while not dg.ready:
                    if dg.error is not None or dg.sign is not None:
                        why = dg.error if dg.error is not None else dg.sign[0] if dg.sign is not None else ""
                        raise DelegateError(f"{self.where}: {dg.describe()} failed to start: {why}")
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DelegateError(
                            f"{self.where}: {dg.describe()} did not join its Gloo pair within "
                            f"{self.timeouts.init_s:.3g} s ([comm] init_timeout_seconds; is the peer rank "
                            "constructing its DelegateTransport?)"
                        )
                    self.cond.wait(min(remaining, 0.5))

    # -- the reader thread -------------------------------------------------------------------
    def _read_loop(self) -> None:
        """Reads every delegate's record pipe and the root's status pipe until the pool stops.

        It runs on the rank's device (it pins segments and polls copy events). An error of its own
        work (a failed pin, a device error while polling) fails the delegate it concerns, by name,
        and the loop goes on: the waits on that delegate raise it instead of timing out."""
        try:
            bind_device(self.device)
        except Exception as e:
            with self.cond:
                for dg in self.roles:
                    self._fail(dg, f"the delegates' reader thread could not select {self.device}: {e}")
                self.cond.notify_all()
        by_fd = {dg.out_r: dg for dg in self.roles}
        while True:
            with self.cond:
                if self.closed and (self._status_eof or self._root_exit is not None):
                    return
                watch = [dg.out_r for dg in self.roles if not dg.eof]
                if self._status_r is not None and not self._status_eof:
                    watch.append(self._status_r)
            timeout = 0.002 if self._releases_pending() else READ_POLL_S
            try:
                ready = select.select(watch, [], [], timeout)[0] if watch else []
            except (OSError, ValueError):  # descriptors closed by stop(): done
                return
            if not watch:
                time.sleep(timeout)
            for fd in ready:
                try:
                    chunk = os.read(fd, 64 * wire.RECORD.size)
                except OSError:
                    chunk = b""
                with self.cond:
                    if fd == self._status_r:
                        self._on_status(chunk)
                    else:
                        try:
                            self._on_records(by_fd[fd], chunk)
                        except Exception as e:
                            self._fail(by_fd[fd], f"its report could not be handled: {type(e).__name__}: {e}")
            try:
                self._poll_releases()
            except Exception as e:  # a device error: no receive slot of this rank can be released
                with self.cond:
                    for dg in self.roles:
                        if not dg.send:
                            self._fail(dg, f"polling its device copies failed: {type(e).__name__}: {e}")
            with self.cond:
                self._declare_due()
                if ready:
                    self.cond.notify_all()

    def _on_records(self, dg: DelegateEnd, chunk: bytes) -> None:
        if not chunk:
            dg.eof = True
            if dg.sign is None:
                dg.sign = ("stopped reporting (its record pipe closed)", time.monotonic())
            return
        records, dg.buf = _split_records(dg.buf + chunk)
        for kind, a, b, c, d, t in records:
            if kind == wire.MSG:
                dg.arrived[a] = (b, c, d, t)
            elif kind == wire.NEWSEG:
                seg = Segment(f"{dg.prefix}d{a}", b, c, create=False, where=f"{self.where}: {dg.describe()}")
                dg.segments[a] = seg  # closed with the others, readied or not
                try:
                    self._prepare_segment(seg)
                except CudaCallError as e:  # names rank, link and call already
                    if dg.error is None:
                        self._declare(dg, DelegateError(str(e)))
            elif kind == wire.READY:
                dg.ready = True
            elif kind == wire.ERROR and dg.sign is None:
                dg.sign = ("reported an error (its message is on stderr above)", time.monotonic())

    def _on_status(self, chunk: bytes) -> None:
        if not chunk:  # the root exited (normally: after every delegate did)
            self._status_eof = True
            proc = self.proc
            if proc is not None:
                try:
                    self._root_exit = proc.wait(1.0)
                except subprocess.TimeoutExpired:
                    self._root_exit = None
            for dg in self.roles:
                if not dg.exited and dg.sign is None:
                    dg.sign = (f"lost its delegate root ({exit_status(self._root_exit)})", time.monotonic())
            return
        records, self._status_buf = _split_records(self._status_buf + chunk)
        for kind, role, pid, code, _, _ in records:
            if kind == wire.EXITED and 0 <= role < len(self.roles):
                dg = self.roles[role]
                dg.pid, dg.exit_code, dg.exited = pid, code, True
                if dg.sign is None:
                    dg.sign = (exit_status(code), time.monotonic())

    def _declare_due(self) -> None:
        """Turn signs of failure into declared failures once the exit status is known (or after a grace)."""
        now = time.monotonic()
        for dg in self.roles:
            if dg.error is not None or dg.sign is None:
                continue
            if not dg.exited and now - dg.sign[1] < REPORT_GRACE_S and not self._status_eof:
                continue
            what = exit_status(dg.exit_code) if dg.exited else dg.sign[0]
            if dg.exited and dg.sign[0] != what and "record pipe" not in dg.sign[0]:
                what = f"{dg.sign[0]} and {what}"
            pid = f" (pid {dg.pid})" if dg.pid else ""
            self._declare(dg, DelegateError(f"{self.where}: {dg.describe()}{pid} {what}"))

    def _fail(self, dg: DelegateEnd, why: str) -> None:
        """Declare ``dg`` failed by this process's own doing (under ``cond``); its delegate lives on."""
        if dg.error is None:
            self._declare(dg, DelegateError(f"{self.where}: {dg.describe()}: {why}"))

    def _declare(self, dg: DelegateEnd, error: DelegateError) -> None:
        """Record ``dg``'s failure and report it (log, listeners) unless the pool is closing."""
        dg.error = error
        if self.closing:
            return
        if self.first_error is None:
            self.first_error = error
        logger.warning("titan_morph: %s", error)
        for listener in list(self._listeners):
            try:
                listener(dg.link, dg.direction, error)
            except Exception:  # a listener's bug must not stop the reports
                logger.exception("titan_morph: delegate failure listener failed")

    # -- failures -----------------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def check(self, dg: DelegateEnd) -> None:
        """Raise if ``dg`` failed (or, when ``strict``, any delegate of this pool did)."""
        err = dg.error if dg.error is not None else (self.first_error if self.strict else None)
        if err is not None:
            raise DelegateError(str(err))

    def failed(self) -> dict[tuple[int, str], DelegateError]:
        with self.cond:
            out: dict[tuple[int, str], DelegateError] = {}
            for dg in self.roles:
                if dg.error is not None:
                    out.setdefault((dg.link, dg.direction), dg.error)
            return out

    def abandon(self, link: int, why: str) -> None:
        with self.cond:
            for d in ("fwd", "bwd"):
                for dg in self.delegates.get((link, d), []):
                    if dg.error is None:
                        dg.error = DelegateError(f"{self.where}: {dg.describe()} given up: {why}")
            self.cond.notify_all()

    # -- stop -----------------------------------------------------------------------------------
    def stop(self, bound: float, drain: bool) -> list[str]:
        """Stop the delegates (see ``DelegateTransport.close``), close every pipe and segment, unlink
        the segments; returns the send delegates that could not confirm delivery."""
        self.closed = True
        deadline = time.monotonic() + bound
        with self.cond:
            self.closing = True
        # send delegates always hand END over (briefly without drain: the peer then sees an orderly close,
        # not a failure); receive delegates wait for their peer's END only when draining
        handshake_ms = max(1, int(bound * 1e3)) if drain else int(1e3 * min(bound, QUICK_CLOSE_S))
        for dg in self.roles:
            try:
                dg.command(wire.STOP, handshake_ms if (drain or dg.send) else 0)
            except DelegateError:
                pass
        proc = self.proc
        if proc is not None:
            try:
                proc.wait(max(0.5, deadline - time.monotonic() + (1.0 if drain else 0.0)))
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(5.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5.0)
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(2 * READ_POLL_S + 2.0)
        # a delegate that failed earlier was reported then (its traffic moved, or the job stops)
        undelivered = [dg.describe() for dg in self.roles if dg.send and dg.exit_code != 0 and dg.error is None]
        # a device copy still queued would read or write an unmapped page: drain them first, or leave
        # the mappings to the process's exit (the files are unlinked below either way)
        drained = self._drain_copies(max(0.5, deadline - time.monotonic()))
        if not drained:
            logger.warning(
                "titan_morph: %s: device copies into or out of the delegates' shared memory still queued "
                "after the close bound: segments left mapped until the process exits",
                self.where,
            )
        for dg in self.roles:
            for seg in dg.segments.values() if drained else ():
                try:
                    seg.close()
                except CudaCallError as e:
                    logger.warning("titan_morph: %s", e)
            for fd in (dg.cmd_w, dg.out_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
        if self._status_r is not None:
            try:
                os.close(self._status_r)
            except OSError:
                pass
        if self.token:
            unlink_prefix(self.prefix)
        self._master = None
        return undelivered if proc is not None else []
