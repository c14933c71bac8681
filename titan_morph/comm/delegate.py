"""DelegateTransport: pipeline traffic through shared memory and Gloo delegate processes (§5).

Paper §5: the training process must never wait on the wire. A send copies the message into a
free slot of a shared-memory ring (:mod:`titan_morph.comm.shm`), sets the slot's FILLED flag and
returns; a *delegate* subprocess (:mod:`titan_morph.comm.delegate_worker`) puts it on its own Gloo
pair group. On the receiving rank a delegate eagerly receives into its own ring and raises READY;
the receive handle's ``wait`` waits (bounded) for that and copies the bytes into the stage's
receive buffer (the P2POp tensor). The delegate's arrival time becomes ``MessageRecord.arrived``
(the monitor's delivery delays): when the data was in this rank's receive path, however late the
trainer consumes it — unless all ``slots`` of that size were still unconsumed, then the delegate
held the payload on the wire until one was (back-pressure; the arrival then includes the
consumer's lag).

Multi-queue (§5.2): per (link, direction) a pool of K delegates (``delegates_per_link``). Message
``n`` of a (link, direction) goes to delegate ``n % K`` as its local message ``n // K`` on both
sides, so the receiver recovers per-link order whatever order the K wires deliver in.

Emulated links: the trainer accounts every message in a ``LinkQueue(depth=None)`` of the shared
link model (accepted when the data is in shared memory at ``t``, delivered at ``t + c``, FIFO
per link and direction) and the delegate releases it on the wire at that delivery time — the same
semantics as :class:`~titan_morph.comm.emulator.EmulatedTransport` with ``depth=None``, so the
two transports are compared fairly. A link the model says is down (``inf``) is the failed NIC
of the default path; delegated traffic avoids it and is delayed by ``down_delay_ms`` instead.

Back-pressure: when all slots of a ring are still in flight, a send waits (bounded) for the
oldest; that time is recorded (:meth:`blocked_ms`, per link) — it is the only way the training
thread can block on sends here. A send that fails (a copy that raises, a failed delegate) leaves
the link's sequence number, slot cursor and slot ownership as they were: the next send takes its
place and the receiver never waits for a message that was never handed over.

Reports. One reader thread per transport reads everything the delegates write (arrivals, new
segments, errors) and the delegate root's status pipe (which delegate exited, with its exit code
or signal). A delegate that dies is reported at once (logged, with link, direction and exit status,
and passed to :meth:`add_listener` callbacks); waits on its (link, direction) then raise
:class:`DelegateError` instead of running into their timeout. With ``strict`` (the ``delegate``
transport, which has no other path) any failure fails every operation of the transport at once, so
the rank stops with one clear error; without it (``auto``) only the failed (link, direction) does,
and the failover transport moves that link back to the default path.

CUDA: segments are page-locked with ``cudaHostRegister`` and their pages touched when they are
made (once per message size, in the first step, not in later ones). A send from CUDA tensors
copies device→host on a side stream (non-blocking) and then writes the FILLED flag with a second,
stream-ordered 8-byte copy on the same stream, so neither the compute stream nor the training
thread waits for the copy (CPU tensors of the same message are copied by the host). A receive
copies host→device (non-blocking) on the current stream and releases the slot once that copy's
event has completed: the reader thread and every later call query it, the host never blocks on
the device queue.

Lifecycle: delegates start in the constructor (collective over the pipeline group) and stop on
:meth:`close`, on leaving a ``with`` block, at interpreter exit (``atexit``), and by themselves when
the trainer dies (SIGTERM, SIGKILL: parent-death signal + polling); every segment is unlinked by
its creator or, after a crash, by the delegates. Every wait is bounded by the ``[comm]`` timeouts
(:class:`~titan_morph.comm.timeouts.CommTimeouts`) and names stage, link, direction and peer.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from titan_morph.comm import delegate_worker as wire
from titan_morph.comm.clock import sync_clock
from titan_morph.comm.records import CommTimeoutError, MessageBook, MessageRecord
from titan_morph.comm.shm import (
    CONSUMED,
    FILLED,
    FREED,
    NBYTES,
    PREFIX,
    READY,
    Segment,
    layout,
    pack,
    unlink_prefix,
    unpack,
)
from titan_morph.comm.timeouts import DEFAULT_TIMEOUTS, CommTimeouts
from titan_morph.comm.transport import Handle, TorchTransport, group_by_link
from titan_morph.pipelining.links import LinkModel, LinkQueue

__all__ = ["DeferredReleases", "DelegateError", "DelegateTransport", "exit_status"]

logger = logging.getLogger(__name__)

STORE_PREFIX = "titan_morph/delegates"
READ_POLL_S = 0.25  # the reader thread's select() bound when nothing is pending
REPORT_GRACE_S = 1.0  # how long a first sign of failure waits for the root's exit status
QUICK_CLOSE_S = 0.5  # a close without drain: how long a send delegate may wait for its END to be acknowledged
_instances = itertools.count()

Listener = Callable[[int, str, "DelegateError"], None]


class DelegateError(RuntimeError):
    """A delegate process failed or exited while the transport needed it (names the delegate)."""


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


class DeferredReleases:
    """Receive slots whose host→device copy is still queued on the device, in issue order.

    Each entry is released (its ``release`` callback run, which writes CONSUMED) once its event has
    completed. :meth:`poll` only queries events (``event.query()``), so nothing here ever blocks
    the host on the device queue; it is called by the reader thread and by every later call.
    """

    def __init__(self) -> None:
        self._items: deque[tuple[Any, Callable[[], None]]] = deque()
        self._lock = threading.Lock()

    def add(self, event: Any, release: Callable[[], None]) -> None:
        with self._lock:
            self._items.append((event, release))

    def pending(self) -> int:
        return len(self._items)

    def poll(self) -> int:
        """Release every slot whose copy has completed, oldest first; returns how many."""
        done = 0
        with self._lock:
            while self._items and self._items[0][0].query():
                _, release = self._items.popleft()
                release()
                done += 1
        return done


class _FiniteDelays(LinkModel):
    """The link model as the delegated path sees it: ``inf`` (the default path's NIC is down)
    becomes ``down_delay_ms`` because delegated traffic is routed around the failed link."""

    def __init__(self, model: LinkModel, down_delay_ms: float) -> None:
        self.model, self.down_delay_ms, self.num_links = model, down_delay_ms, model.num_links

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        d = self.model.delay_ms(link, direction, t_ms, step)
        return self.down_delay_ms if math.isinf(d) else d


def _split_records(buf: bytes) -> tuple[list[tuple[Any, ...]], bytes]:
    """The whole fixed-size records at the start of ``buf`` (a pipe delivers them in any chunks) and
    the incomplete rest."""
    n = len(buf) // wire.RECORD.size * wire.RECORD.size
    return [wire.RECORD.unpack_from(buf, i) for i in range(0, n, wire.RECORD.size)], buf[n:]


class _Delegate:
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


class _SendHandle:
    """A send is complete once its bytes are in shared memory (CUDA: once the side-stream copy ran)."""

    due_s = None

    def __init__(self, ops: list[dist.P2POp], record: MessageRecord, event: Any = None) -> None:
        self.ops, self.record, self.event = ops, record, event

    def wait(self, timeout: float | None = None) -> bool:
        if self.event is not None:  # CUDA: the compute stream must not reuse the source too early
            torch.cuda.current_stream().wait_event(self.event)
        return True

    def is_completed(self) -> bool:
        return self.event is None or bool(self.event.query())


class _RecvHandle:
    """Waits (bounded) for the delegate's READY and copies the slot into the receive buffers."""

    due_s = None  # the delegate delivers on its own clock: the arrival is stamped, not predicted

    def __init__(
        self, owner: DelegateTransport, ops: list[dist.P2POp], dg: _Delegate, local: int, record: MessageRecord
    ) -> None:
        self.owner, self.ops, self.dg, self.local, self.record = owner, ops, dg, local, record
        self._done = False
        self._lock = threading.Lock()  # one taker: the consumer, or a failover settling the message

    def wait(self, timeout: float | None = None) -> bool:
        with self._lock:
            return self._take(timeout)

    def _take(self, timeout: float | None) -> bool:
        if self._done:
            return True
        owner, dg, rec = self.owner, self.dg, self.record
        if rec.waited is None:
            rec.waited = owner.now_ms()
        bound = owner.timeout_s if timeout is None else timeout
        seg_id, slot, nbytes, t = owner._await_arrival(dg, self.local, bound, rec)
        # the receive delegate's clock: CLOCK_MONOTONIC is shared by the processes of one host
        rec.arrived = (t - owner.epoch) * 1e3
        tensors = [op.tensor for op in self.ops]
        offsets, total = layout(tensors)
        seg = dg.segments[seg_id]
        if nbytes != total:
            rec.status = "error"
            raise RuntimeError(
                f"link {rec.link} ({rec.direction}) message {rec.seq}: stage {rec.peer_stage} sent {nbytes} bytes but "
                f"this stage posted {total} (tensors {[tuple(t.shape) for t in tensors]}); both sides must group "
                "ops into messages identically"
            )
        if seg.flag(slot, READY) != self.local + 1:
            raise DelegateError(f"{dg.describe()}: slot {slot} of {seg.name} is not READY for message {rec.seq}")
        value = self.local + 1
        if any(t.is_cuda for t in tensors):
            owner._cuda_unpack(seg, slot, tensors, offsets, value)
        else:
            unpack(seg.slot(slot), tensors, offsets)
            seg.set_flag(slot, CONSUMED, value)
        rec.completed = owner.now_ms()
        rec.status = "done"
        self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done


class DelegateTransport(MessageBook):
    """The delegated data plane (see module docstring). Construct on every pipeline rank, same order.

    Args:
        stage, num_stages: this rank's stage (= its rank in ``group``) and the pipeline size.
        group: the pipeline process group (None = default group); ops of other groups go through
            torch.distributed unchanged.
        links: link model whose delays the delegates apply (None = no delay).
        delegates_per_link: K delegate processes per (link, direction) on each side (§5.2).
        slots: ring slots per delegate and message size (how far the trainer can run ahead).
        epoch: shared t=0 (``time.monotonic()``) of the link model; None = ``sync_clock(group)``.
        timeouts: the bounds of every wait (start-up and step 1, then training; TorchTitan's
            ``[comm]`` timeouts).
        down_delay_ms: delay of delegated traffic on a link the model says is down (``inf``).
        record: keep a :class:`~titan_morph.comm.records.MessageRecord` per message (``records()``).
        strict: a failed delegate fails every operation (True: the ``delegate`` transport), or only
            those of its own (link, direction) (False: under ``auto``, which falls back).
        device: the training device; on CUDA the segments are page-locked when made.
    """

    name = "delegate"
    path = "delegate"
    exit_timeout_s = 2.0
    depth = None  # never blocks the caller on the wire (LinkQueue depth=None semantics)

    def __init__(
        self,
        *,
        stage: int,
        num_stages: int,
        group: dist.ProcessGroup | None = None,
        links: LinkModel | None = None,
        delegates_per_link: int = 1,
        slots: int = 8,
        epoch: float | None = None,
        timeouts: CommTimeouts = DEFAULT_TIMEOUTS,
        down_delay_ms: float = 0.0,
        record: bool = True,
        max_records: int = 200_000,
        wire_timeout_s: float = 7 * 24 * 3600.0,
        strict: bool = True,
        device: torch.device | str | None = None,
    ) -> None:
        if not isinstance(delegates_per_link, int) or not 1 <= delegates_per_link <= 64:
            raise ValueError(f"delegates_per_link must be an integer in 1..64, got {delegates_per_link!r}")
        if not isinstance(slots, int) or not 1 <= slots <= 1024:
            raise ValueError(f"slots must be an integer in 1..1024, got {slots!r}")
        if not (math.isfinite(down_delay_ms) and down_delay_ms >= 0):
            raise ValueError(f"down_delay_ms must be a finite number of ms >= 0, got {down_delay_ms}")
        if links is not None and links.num_links != num_stages - 1:
            raise ValueError(f"link model has {links.num_links} links but {num_stages} stages need {num_stages - 1}")
        super().__init__(
            stage=stage,
            num_stages=num_stages,
            group=group,
            epoch=epoch if epoch is not None else sync_clock(group).epoch,
            record=record,
            max_records=max_records,
        )
        self.k, self.slots = delegates_per_link, slots
        self.links = links
        self.timeouts = timeouts
        self.strict = strict
        self.device = torch.device(device) if device is not None else None
        self._closed = False
        self._closing = False
        self._passthrough = TorchTransport(self.epoch)
        self._blocked: dict[int, float] = {}
        self._copy_ms: dict[int, float] = {}
        self._queues: dict[tuple[int, str], LinkQueue] = {}
        self._emulated = _FiniteDelays(links, down_delay_ms) if links is not None else None
        self._cuda_stream: Any = None
        self._releases = DeferredReleases()
        self._send_locks: dict[tuple[int, str], threading.Lock] = {}
        self._cond = threading.Condition()
        self._listeners: list[Listener] = []
        self._first_error: DelegateError | None = None
        self._root_exit: int | None = None
        self._status_r: int | None = None
        self._status_eof = False
        self._status_buf = b""
        self._reader: threading.Thread | None = None
        self._master: dist.TCPStore | None = None
        self.proc: subprocess.Popen | None = None
        self.token = self._rendezvous()
        self.prefix = f"{PREFIX}{self.token}_s{stage}_"
        self._delegates: dict[tuple[int, str], list[_Delegate]] = {}
        self._roles: list[_Delegate] = []
        self._close_at_exit()
        try:
            self._start(wire_timeout_s)
        except BaseException:
            self.close(timeout=2.0, drain=False)
            raise

    @property
    def timeout_s(self) -> float:
        """The bound of a wait now (``timeouts`` for the current step)."""
        return self.timeouts.for_step(self.step)

    # -- setup -----------------------------------------------------------------------------
    def _rendezvous(self) -> str:
        """Rank 0's trainer serves a TCPStore for the delegates; its address and a run token travel
        through the training group's store (key namespace per group and construction order)."""
        base = dist.distributed_c10d._get_default_store()
        key = f"{STORE_PREFIX}/{self._group_name}/{next(_instances)}/addr"
        startup = timedelta(seconds=self.timeouts.init_s)
        if self.stage == 0:
            host = os.environ.get("MASTER_ADDR", "127.0.0.1")
            self._master = dist.TCPStore(
                "0.0.0.0" if host not in ("127.0.0.1", "localhost") else host,
                0,
                is_master=True,
                wait_for_workers=False,
                timeout=startup,
            )
            token = uuid.uuid4().hex[:12]
            base.set(key, f"{token}@{host}:{self._master.port}")
        client = base.clone()
        client.set_timeout(startup)
        value = client.get(key).decode()
        token, self._store_addr = value.split("@", 1)
        return token

    def _start(self, wire_timeout_s: float) -> None:
        for link in (self.stage - 1, self.stage):
            if not 0 <= link < self.num_stages - 1:
                continue
            for direction in ("fwd", "bwd"):
                send = (direction == "fwd") == (link == self.stage)
                peer = link + 1 if link == self.stage else link
                pool = []
                for j in range(self.k):
                    prefix = f"{self.prefix}l{link}{direction}{j}_"
                    pool.append(_Delegate(link, direction, j, send, prefix, peer, len(self._roles)))
                    self._roles.append(pool[-1])
                self._delegates[(link, direction)] = pool
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
            "roles": [dg.role_spec(self.token, self.timeouts.init_s, self.slots) for dg in self._roles],
        }
        child_fds = [fd for dg in self._roles for fd in (dg.cmd_r, dg.out_w)] + [status_w]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "titan_morph.comm.delegate_worker", f"--run={self.token}", json.dumps(spec)],
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
        with self._cond:
            for dg in self._roles:
                while not dg.ready:
                    if dg.error is not None or dg.sign is not None:
                        raise DelegateError(
                            f"{self.where()}: {dg.describe()} failed to start: {dg.error or dg.sign[0]}"  # type: ignore[index]
                        )
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DelegateError(
                            f"{self.where()}: {dg.describe()} did not join its Gloo pair within "
                            f"{self.timeouts.init_s:.3g} s ([comm] init_timeout_seconds; is the peer rank "
                            "constructing its DelegateTransport?)"
                        )
                    self._cond.wait(min(remaining, 0.5))

    # -- the reader thread -------------------------------------------------------------------
    def _read_loop(self) -> None:
        """Reads every delegate's record pipe and the root's status pipe until the transport closes."""
        by_fd = {dg.out_r: dg for dg in self._roles}
        while True:
            with self._cond:
                if self._closed and (self._status_eof or self._root_exit is not None):
                    return
                watch = [dg.out_r for dg in self._roles if not dg.eof]
                if self._status_r is not None and not self._status_eof:
                    watch.append(self._status_r)
            timeout = 0.002 if self._releases.pending() else READ_POLL_S
            try:
                ready = select.select(watch, [], [], timeout)[0] if watch else []
            except (OSError, ValueError):  # descriptors closed by close(): done
                return
            if not watch:
                time.sleep(timeout)
            for fd in ready:
                try:
                    chunk = os.read(fd, 64 * wire.RECORD.size)
                except OSError:
                    chunk = b""
                with self._cond:
                    if fd == self._status_r:
                        self._on_status(chunk)
                    else:
                        self._on_records(by_fd[fd], chunk)
            self._releases.poll()
            with self._cond:
                self._declare_due()
                if ready:
                    self._cond.notify_all()

    def _on_records(self, dg: _Delegate, chunk: bytes) -> None:
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
                seg = Segment(f"{dg.prefix}d{a}", b, c, create=False)
                self._prepare_segment(seg)
                dg.segments[a] = seg
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
            for dg in self._roles:
                if not dg.exited and dg.sign is None:
                    dg.sign = (f"lost its delegate root ({exit_status(self._root_exit)})", time.monotonic())
            return
        records, self._status_buf = _split_records(self._status_buf + chunk)
        for kind, role, pid, code, _, _ in records:
            if kind == wire.EXITED and 0 <= role < len(self._roles):
                dg = self._roles[role]
                dg.pid, dg.exit_code, dg.exited = pid, code, True
                if dg.sign is None:
                    dg.sign = (exit_status(code), time.monotonic())

    def _declare_due(self) -> None:
        """Turn signs of failure into declared failures once the exit status is known (or after a grace)."""
        now = time.monotonic()
        for dg in self._roles:
            if dg.error is not None or dg.sign is None:
                continue
            if not dg.exited and now - dg.sign[1] < REPORT_GRACE_S and not self._status_eof:
                continue
            what = exit_status(dg.exit_code) if dg.exited else dg.sign[0]
            if dg.exited and dg.sign[0] != what and "record pipe" not in dg.sign[0]:
                what = f"{dg.sign[0]} and {what}"
            pid = f" (pid {dg.pid})" if dg.pid else ""
            dg.error = DelegateError(f"{self.where()}: {dg.describe()}{pid} {what}")
            if self._closing:
                continue
            if self._first_error is None:
                self._first_error = dg.error
            logger.warning("titan_morph: %s", dg.error)
            for listener in list(self._listeners):
                try:
                    listener(dg.link, dg.direction, dg.error)
                except Exception:  # a listener's bug must not stop the reports
                    logger.exception("titan_morph: delegate failure listener failed")

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(link, direction, error)`` (from the reader thread) when a delegate fails."""
        self._listeners.append(listener)

    def failed(self) -> dict[tuple[int, str], DelegateError]:
        """The (link, direction) pools with a failed delegate, and the first failure of each."""
        with self._cond:
            out: dict[tuple[int, str], DelegateError] = {}
            for dg in self._roles:
                if dg.error is not None:
                    out.setdefault((dg.link, dg.direction), dg.error)
            return out

    def abandon(self, link: int, why: str) -> None:
        """Give the delegated path of ``link`` up (both directions, e.g. after a peer's delegate failed):
        waits on it raise :class:`DelegateError` at once; messages already here can still be taken."""
        with self._cond:
            for d in ("fwd", "bwd"):
                for dg in self._delegates.get((link, d), []):
                    if dg.error is None:
                        dg.error = DelegateError(f"{self.where()}: {dg.describe()} given up: {why}")
            self._cond.notify_all()

    def _check(self, dg: _Delegate) -> None:
        """Raise if ``dg`` failed (or, when ``strict``, any delegate of this transport did)."""
        err = dg.error if dg.error is not None else (self._first_error if self.strict else None)
        if err is not None:
            raise DelegateError(str(err))

    # -- issue path ------------------------------------------------------------------------
    def hint_issue(self, t_s: float, max_early_ms: float = 2.0) -> None:
        pass  # a delegated send is timed from its copy into shared memory, which the caller does now

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        """Receives are registered at once; sends are copied to shared memory and handed to a delegate."""
        if self._closed:
            raise RuntimeError("DelegateTransport is closed")
        ops = list(ops)
        mine, handles = self._partition(ops, self._passthrough.batch_p2p, desc)
        if not mine:
            return handles
        if self._releases.pending():
            self._releases.poll()
        messages = group_by_link(mine, self.stage, self.num_stages)
        with self._lock:
            for (link, d, send), mops in messages.items():
                if not send:
                    n = self._next(self._recv_seq, link, d)
                    dg = self._delegates[(link, d)][n % self.k]
                    rec = self._new_record("recv", link, d, n, mops)
                    handles.append(_RecvHandle(self, mops, dg, n // self.k, rec))
        for (link, d, send), mops in messages.items():
            if send:  # one issuer per (link, direction) at a time; a send blocked on a full ring holds no other
                with self._send_locks.setdefault((link, d), threading.Lock()):
                    handles.append(self._send(link, d, mops))
        return handles

    def _segment_for(self, dg: _Delegate, nbytes: int) -> int:
        seg_id = dg.by_size.get(nbytes)
        if seg_id is None:
            seg = Segment(f"{dg.prefix}t{len(dg.by_size)}", nbytes, self.slots, create=True)
            self._prepare_segment(seg)
            seg_id = dg.by_size[nbytes] = len(dg.by_size)
            dg.segments[seg_id], dg.cursor[seg_id] = seg, 0
            dg.command(wire.NEWSEG, seg_id, nbytes, self.slots)
        return seg_id

    def _prepare_segment(self, seg: Segment) -> None:
        """Fault a new segment's pages in and, for a CUDA device, page-lock it: once, when it is made."""
        seg.touch()
        if self.device is not None and self.device.type == "cuda":
            seg.pin()

    def _send(self, link: int, direction: str, ops: list[dist.P2POp]) -> _SendHandle:
        # Nothing of the link's state (sequence number, slot cursor, slot ownership, the record) is
        # committed before the payload is in its slot: a send that raises leaves it as it was.
        n = self._send_seq.get((link, direction), 0)
        dg = self._delegates[(link, direction)][n % self.k]
        self._check(dg)
        local = n // self.k
        rec = self._new_record("send", link, direction, n, ops, keep=False)
        tensors = [op.tensor for op in ops]
        offsets, total = layout(tensors)
        seg_id = self._segment_for(dg, total)
        seg = dg.segments[seg_id]
        slot = dg.cursor[seg_id] % self.slots
        t0 = t1 = time.monotonic()
        # free once the delegate freed the slot's last message (host-side count: on CUDA the FILLED
        # word is written later, by the side stream)
        if seg.flag(slot, FREED) != seg.issued[slot]:  # back-pressure: every slot still in flight
            self._wait_free(dg, seg, slot, rec)
            t1 = time.monotonic()
        seg.set_flag(slot, NBYTES, total)
        event = None
        if any(t.is_cuda for t in tensors):
            event = self._cuda_pack(seg, slot, tensors, offsets, local + 1)  # FILLED: stream-ordered, last
        else:
            pack(seg.slot(slot), tensors, offsets)
        # commit
        self._send_seq[(link, direction)] = n + 1
        dg.cursor[seg_id] += 1
        seg.issued[slot] = local + 1
        if event is None:
            seg.set_flag(slot, FILLED, local + 1)
        self._keep(rec)
        t2 = time.monotonic()
        rec.accepted = self.now_ms()
        deliver_at = time.monotonic()
        if self._emulated is not None:
            queue = self._queues.get((link, direction))
            if queue is None:
                queue = self._queues[(link, direction)] = LinkQueue(self._emulated, link, direction, None)
            timing = queue.send(rec.accepted, self.step)
            rec.planned = timing.delivered
            rec.delay_ms = self._emulated.delay_ms(link, direction, timing.accepted, self.step)
            deliver_at = self.epoch + timing.delivered / 1e3
        dg.command(wire.MSG, local, seg_id, slot, total, deliver_at)
        self._blocked[link] = self._blocked.get(link, 0.0) + (t1 - t0) * 1e3
        self._copy_ms[link] = self._copy_ms.get(link, 0.0) + (t2 - t1) * 1e3
        rec.completed = self.now_ms()
        rec.status = "done"
        return _SendHandle(ops, rec, event)

    def _wait_free(self, dg: _Delegate, seg: Segment, slot: int, rec: MessageRecord) -> None:
        bound = self.timeout_s
        deadline = time.monotonic() + bound
        delay = 50e-6
        while seg.flag(slot, FREED) != seg.issued[slot]:
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"{self.where()}: send of message {rec.seq} on link {rec.link} ({rec.direction}) to stage "
                    f"{rec.peer_stage}: no free shared-memory slot within {bound:.3g} s "
                    f"({self.slots} slots of {dg.describe()} in flight)"
                )
            self._check(dg)
            time.sleep(delay)
            delay = min(2 * delay, 1e-3)

    def _await_arrival(
        self, dg: _Delegate, local: int, bound: float, rec: MessageRecord
    ) -> tuple[int, int, int, float]:
        deadline = time.monotonic() + bound
        with self._cond:
            while local not in dg.arrived:
                self._check(dg)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    rec.status = "error"
                    raise CommTimeoutError(
                        f"{self.where()}: receive of message {rec.seq} on link {rec.link} ({rec.direction}) "
                        f"from stage {rec.peer_stage} did not arrive within {bound:.3g} s "
                        f"(posted at {rec.issued:.1f} ms, step {rec.step}, via {dg.describe()})"
                    )
                self._cond.wait(min(remaining, 0.5))
            return dg.arrived.pop(local)

    # -- CUDA -----------------------------------------------------------------------------------
    def _cuda_pack(self, seg: Segment, slot: int, tensors: list[torch.Tensor], offsets: list[int], flag: int) -> Any:
        """CUDA tensors device→host into the pinned slot on a side stream, CPU tensors by the host, then
        the stream-ordered FILLED write (enqueued last: nothing can fail after the delegate may see it)."""
        device = next(t.device for t in tensors if t.is_cuda)
        seg.pin()
        if self._cuda_stream is None:
            self._cuda_stream = torch.cuda.Stream(device=device)
        stream = self._cuda_stream
        stream.wait_stream(torch.cuda.current_stream(device))
        view = seg.slot(slot)
        with torch.cuda.stream(stream), torch.no_grad():
            for t, off in zip(tensors, offsets):
                if t.numel():
                    n = t.numel() * t.element_size()
                    dst = view[off : off + n].view(t.dtype).view(t.shape)
                    dst.copy_(t, non_blocking=t.is_cuda)
                    if t.is_cuda:  # the caller's allocator must not reuse it before the copy ran
                        t.record_stream(stream)
            value = torch.full((1,), flag, dtype=torch.int64, device=device)
            event = torch.cuda.Event()
            seg.flag_view(slot, FILLED).copy_(value, non_blocking=True)  # lands after the data (same stream)
            event.record(stream)
        return event

    def _cuda_unpack(
        self, seg: Segment, slot: int, tensors: list[torch.Tensor], offsets: list[int], value: int
    ) -> None:
        """Host→device from the pinned slot on the current stream; the slot is released (CONSUMED) once
        that copy's event has completed, found by polling: the host never waits for the device."""
        seg.pin()
        unpack(seg.slot(slot), tensors, offsets, non_blocking=True)
        device = next(t.device for t in tensors if t.is_cuda)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        self._releases.add(event, lambda: seg.set_flag(slot, CONSUMED, value))

    # -- metrics and paths ---------------------------------------------------------------
    failovers = 0  # everything is delegated: nothing to fail over

    def delegated(self) -> frozenset[int]:
        return frozenset(range(self.num_stages - 1))

    def switch(self, links: Iterable[int]) -> None:
        pass  # every link is on the delegated path already

    def restore(self, links: Iterable[int]) -> None:
        pass

    def blocked_ms(self) -> dict[int, float]:
        """Total ms the caller waited for a free slot (back-pressure), per link, since start."""
        return dict(self._blocked)

    def copy_ms(self) -> dict[int, float]:
        """Total ms the caller spent copying send payloads into shared memory, per link."""
        return dict(self._copy_ms)

    def delegate_pids(self) -> list[int]:
        """The delegate root's pid (its children carry the run token in their command line too)."""
        return [] if self.proc is None else [self.proc.pid]

    # -- lifecycle -------------------------------------------------------------------------
    def close(self, timeout: float | None = None, drain: bool = True) -> None:
        """Stop the delegates and unlink all segments.

        ``drain``: every send delegate first hands over its queue and the close handshake (END,
        acknowledged by the peer's receive delegate once everything before it arrived), and each
        receive delegate waits for its peer's END; ``CommTimeoutError`` if a send delegate could not
        confirm delivery within the bound. Without ``drain`` the receive delegates stop at once and
        the send delegates give the handshake at most ``QUICK_CLOSE_S``."""
        if self._closed:
            return
        self._closed = True
        self._close_at_exit(closing=True)
        bound = self.timeout_s if timeout is None else timeout
        deadline = time.monotonic() + bound
        with self._cond:
            self._closing = True
        # send delegates always hand END over (briefly without drain: the peer then sees an orderly close,
        # not a failure); receive delegates wait for their peer's END only when draining
        handshake_ms = max(1, int(bound * 1e3)) if drain else int(1e3 * min(bound, QUICK_CLOSE_S))
        for dg in self._roles:
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
        undelivered = [dg.describe() for dg in self._roles if dg.send and dg.exit_code != 0 and dg.error is None]
        for dg in self._roles:
            for seg in dg.segments.values():
                seg.close()
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
        if drain and proc is not None and undelivered:
            raise CommTimeoutError(
                f"DelegateTransport.close: {self.where()}: delivery of the queued sends not confirmed within "
                f"{bound:.3g} s by {', '.join(undelivered)}"
            )

    def __enter__(self) -> DelegateTransport:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(drain=exc_type is None)
