"""DelegateTransport: pipeline traffic through shared memory and Gloo delegate processes (§5).

Paper §5: the training process must never wait on the wire. A send copies the message into a
free slot of a shared-memory ring (:mod:`titan_morph.comm.shm`), sets the slot's FILLED flag and
returns; a *delegate* subprocess (:mod:`titan_morph.comm.delegate_worker`) puts it on its own Gloo
pair group. On the receiving rank a delegate eagerly receives into its own ring and raises READY;
the receive handle's ``wait`` waits (bounded) for that and copies the bytes into the stage's
receive buffer (the P2POp tensor). The delegate's arrival time becomes ``MessageRecord.arrived``
(the monitor's delivery delays): when the data was in this rank's receive path, however late the
trainer consumes it —
unless all ``slots`` of that size were still unconsumed, then the delegate held the payload on the
wire until one was (back-pressure; the arrival then includes the consumer's lag).

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
thread can block on sends here.

CUDA (untested on the CPU-only development machine): segments are page-locked with
``cudaHostRegister``; a send from a CUDA tensor copies device→host on a side stream
(non-blocking) and then writes the FILLED flag with a second, stream-ordered 8-byte copy on the
same stream, so neither the compute stream nor the training thread waits for the copy; a receive
copies host→device (non-blocking) on the current stream and releases the slot once that copy's
event completed.

Lifecycle: delegates start in the constructor (collective over the pipeline group) and stop on
:meth:`close`, on leaving a ``with`` block, at interpreter exit (``atexit``), and by themselves when
the trainer dies (SIGTERM, SIGKILL: parent-death signal + polling); every segment is unlinked by
its creator or, after a crash, by the delegates. Every wait is bounded and names link, direction
and peer.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import select
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable
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
from titan_morph.comm.transport import Handle, TorchTransport, group_by_link
from titan_morph.pipelining.links import LinkModel, LinkQueue

__all__ = ["DelegateError", "DelegateTransport"]

STORE_PREFIX = "titan_morph/delegates"
_instances = itertools.count()


class DelegateError(RuntimeError):
    """A delegate process failed or exited while the transport needed it."""


class _FiniteDelays(LinkModel):
    """The link model as the delegated path sees it: ``inf`` (the default path's NIC is down)
    becomes ``down_delay_ms`` because delegated traffic is routed around the failed link."""

    def __init__(self, model: LinkModel, down_delay_ms: float) -> None:
        self.model, self.down_delay_ms, self.num_links = model, down_delay_ms, model.num_links

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        d = self.model.delay_ms(link, direction, t_ms, step)
        return self.down_delay_ms if math.isinf(d) else d


class _Delegate:
    """Trainer-side end of one delegate: its pipes, its segments, and (receive side) its records."""

    def __init__(self, link: int, direction: str, index: int, send: bool, prefix: str, peer: int) -> None:
        self.link, self.direction, self.index, self.send, self.prefix, self.peer = (
            link,
            direction,
            index,
            send,
            prefix,
            peer,
        )
        self.cmd_r, self.cmd_w = os.pipe()
        self.out_r, self.out_w = os.pipe()
        self.segments: dict[int, Segment] = {}
        self.by_size: dict[int, int] = {}  # send side: message size -> segment id
        self.cursor: dict[int, int] = {}  # send side: next slot (mod nslots) per segment
        # receive side: local seq -> (segment, slot, nbytes, time.monotonic() when the delegate had it)
        self.arrived: dict[int, tuple[int, int, int, float]] = {}
        self.lock = threading.Lock()
        self.failed = False
        self.buf = b""
        self.backlog: list[tuple] = []  # records read before anyone waited for them

    def describe(self) -> str:
        side = "send" if self.send else "receive"
        return f"{side} delegate #{self.index} of link {self.link} ({self.direction}, peer stage {self.peer})"

    def role(self, token: str, timeout_s: float, slots: int) -> dict[str, Any]:
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
            self.failed = True
            raise DelegateError(f"{self.describe()} is gone (command pipe: {e})") from e

    def poll_records(self, timeout_s: float) -> list[tuple]:
        """Records the delegate wrote, waiting at most ``timeout_s`` for the first one."""
        ready, _, _ = select.select([self.out_r], [], [], max(0.0, timeout_s))
        if not ready:
            return []
        chunk = os.read(self.out_r, 64 * wire.RECORD.size)
        if not chunk:
            self.failed = True
            raise DelegateError(f"{self.describe()} exited (record pipe closed); see the delegate's stderr above")
        self.buf += chunk
        n = len(self.buf) // wire.RECORD.size * wire.RECORD.size
        data, self.buf = self.buf[:n], self.buf[n:]
        return [wire.RECORD.unpack_from(data, i) for i in range(0, n, wire.RECORD.size)]


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

    def __init__(
        self, owner: DelegateTransport, ops: list[dist.P2POp], dg: _Delegate, local: int, record: MessageRecord
    ) -> None:
        self.owner, self.ops, self.dg, self.local, self.record = owner, ops, dg, local, record
        self._done = False

    due_s = None  # the delegate delivers on its own clock: the arrival is stamped, not predicted

    def wait(self, timeout: float | None = None) -> bool:
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
        view = seg.slot(slot)
        if any(t.is_cuda for t in tensors):
            owner._cuda_unpack(seg, view, tensors, offsets)
        else:
            unpack(view, tensors, offsets)
        seg.set_flag(slot, CONSUMED, self.local + 1)
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
        epoch: shared t=0 (``time.monotonic()``) of the link model; None = ``sync_epoch(group)``.
        timeout_s: bound of every wait (receive, back-pressure); startup_timeout_s: of delegate start.
        down_delay_ms: delay of delegated traffic on a link the model says is down (``inf``).
        record: keep a :class:`~titan_morph.comm.emulator.MessageRecord` per message (``records()``).
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
        timeout_s: float = 300.0,
        startup_timeout_s: float = 120.0,
        down_delay_ms: float = 0.0,
        record: bool = True,
        max_records: int = 200_000,
        wire_timeout_s: float = 7 * 24 * 3600.0,
    ) -> None:
        if not isinstance(delegates_per_link, int) or not 1 <= delegates_per_link <= 64:
            raise ValueError(f"delegates_per_link must be an integer in 1..64, got {delegates_per_link!r}")
        if not isinstance(slots, int) or not 1 <= slots <= 1024:
            raise ValueError(f"slots must be an integer in 1..1024, got {slots!r}")
        for nm, v in (("timeout_s", timeout_s), ("startup_timeout_s", startup_timeout_s)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{nm} must be a finite number of seconds > 0, got {v}")
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
        self.timeout_s, self.startup_timeout_s = float(timeout_s), float(startup_timeout_s)
        self._closed = False
        self._passthrough = TorchTransport(self.epoch)
        self._blocked: dict[int, float] = {}
        self._copy_ms: dict[int, float] = {}
        self._queues: dict[tuple[int, str], LinkQueue] = {}
        self._emulated = _FiniteDelays(links, down_delay_ms) if links is not None else None
        self._cuda_stream: Any = None
        self._master: dist.TCPStore | None = None
        self.proc: subprocess.Popen | None = None
        self.token = self._rendezvous()
        self.prefix = f"{PREFIX}{self.token}_s{stage}_"
        self._delegates: dict[tuple[int, str], list[_Delegate]] = {}
        self._close_at_exit()
        try:
            self._start(wire_timeout_s)
        except BaseException:
            self.close(timeout=2.0, drain=False)
            raise

    # -- setup -----------------------------------------------------------------------------
    def _rendezvous(self) -> str:
        """Rank 0's trainer serves a TCPStore for the delegates; its address and a run token travel
        through the training group's store (key namespace per group and construction order)."""
        base = dist.distributed_c10d._get_default_store()
        key = f"{STORE_PREFIX}/{self._group_name}/{next(_instances)}/addr"
        if self.stage == 0:
            host = os.environ.get("MASTER_ADDR", "127.0.0.1")
            self._master = dist.TCPStore(
                "0.0.0.0" if host not in ("127.0.0.1", "localhost") else host,
                0,
                is_master=True,
                wait_for_workers=False,
                timeout=timedelta(seconds=self.startup_timeout_s),
            )
            token = uuid.uuid4().hex[:12]
            base.set(key, f"{token}@{host}:{self._master.port}")
        client = base.clone()
        client.set_timeout(timedelta(seconds=self.startup_timeout_s))
        value = client.get(key).decode()
        token, self._store_addr = value.split("@", 1)
        return token

    def _start(self, wire_timeout_s: float) -> None:
        roles: list[_Delegate] = []
        for link in (self.stage - 1, self.stage):
            if not 0 <= link < self.num_stages - 1:
                continue
            for direction in ("fwd", "bwd"):
                send = (direction == "fwd") == (link == self.stage)
                peer = link + 1 if link == self.stage else link
                pool = [
                    _Delegate(link, direction, j, send, f"{self.prefix}l{link}{direction}{j}_", peer)
                    for j in range(self.k)
                ]
                self._delegates[(link, direction)] = pool
                roles += pool
        spec = {
            "parent": os.getpid(),
            "stage_prefix": self.prefix,
            "store": self._store_addr,
            "startup_timeout_s": self.startup_timeout_s,
            "wire_timeout_s": wire_timeout_s,
            "roles": [dg.role(self.token, self.timeout_s, self.slots) for dg in roles],
        }
        child_fds = [fd for dg in roles for fd in (dg.cmd_r, dg.out_w)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "titan_morph.comm.delegate_worker", f"--run={self.token}", json.dumps(spec)],
            pass_fds=child_fds,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        for fd in child_fds:
            os.close(fd)
        deadline = time.monotonic() + self.startup_timeout_s
        for dg in roles:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DelegateError(
                        f"stage {self.stage}: {dg.describe()} did not join its Gloo pair within "
                        f"{self.startup_timeout_s:.3g} s (is the peer rank constructing its DelegateTransport?)"
                    )
                records = dg.poll_records(min(remaining, 0.5))
                if any(r[0] == wire.READY for r in records):
                    # a fast peer may already have delivered messages: keep their records
                    dg.backlog = [r for r in records if r[0] != wire.READY]
                    break
                if any(r[0] == wire.ERROR for r in records):
                    raise DelegateError(f"stage {self.stage}: {dg.describe()} failed to start (see its stderr)")
                if self.proc.poll() is not None:
                    raise DelegateError(f"stage {self.stage}: delegate root exited with code {self.proc.returncode}")

    def hint_issue(self, t_s: float, max_early_ms: float = 2.0) -> None:
        pass  # a delegated send is timed from its copy into shared memory, which the caller does now

    # -- issue path ------------------------------------------------------------------------
    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        """Receives are registered at once; sends are copied to shared memory and handed to a delegate."""
        if self._closed:
            raise RuntimeError("DelegateTransport is closed")
        ops = list(ops)
        mine, handles = self._partition(ops, self._passthrough.batch_p2p, desc)
        if not mine:
            return handles
        messages = group_by_link(mine, self.stage, self.num_stages)
        with self._lock:
            for (link, d, send), mops in messages.items():
                if not send:
                    n = self._next(self._recv_seq, link, d)
                    dg = self._delegates[(link, d)][n % self.k]
                    rec = self._new_record("recv", link, d, n, mops)
                    handles.append(_RecvHandle(self, mops, dg, n // self.k, rec))
            for (link, d, send), mops in messages.items():
                if send:
                    handles.append(self._send(link, d, mops))
        return handles

    def _segment_for(self, dg: _Delegate, nbytes: int) -> int:
        seg_id = dg.by_size.get(nbytes)
        if seg_id is None:
            seg_id = dg.by_size[nbytes] = len(dg.by_size)
            dg.segments[seg_id] = Segment(f"{dg.prefix}t{seg_id}", nbytes, self.slots, create=True)
            dg.cursor[seg_id] = 0
            dg.command(wire.NEWSEG, seg_id, nbytes, self.slots)
        return seg_id

    def _send(self, link: int, direction: str, ops: list[dist.P2POp]) -> _SendHandle:
        n = self._next(self._send_seq, link, direction)
        dg = self._delegates[(link, direction)][n % self.k]
        local = n // self.k
        rec = self._new_record("send", link, direction, n, ops)
        tensors = [op.tensor for op in ops]
        offsets, total = layout(tensors)
        seg_id = self._segment_for(dg, total)
        seg = dg.segments[seg_id]
        slot = dg.cursor[seg_id] % self.slots
        dg.cursor[seg_id] += 1
        t0 = t1 = time.monotonic()
        # free once the delegate freed the slot's last message (host-side count: on CUDA the FILLED
        # word is written later, by the side stream)
        if seg.flag(slot, FREED) != seg.issued[slot]:  # back-pressure: every slot still in flight
            self._wait_free(dg, seg, slot, rec)
            t1 = time.monotonic()
        seg.issued[slot] = local + 1
        event = None
        seg.set_flag(slot, NBYTES, total)
        if any(t.is_cuda for t in tensors):
            event = self._cuda_pack(seg, slot, tensors, offsets, local + 1)
        else:
            pack(seg.slot(slot), tensors, offsets)
            seg.set_flag(slot, FILLED, local + 1)
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
        deadline = time.monotonic() + self.timeout_s
        delay = 50e-6
        while seg.flag(slot, FREED) != seg.issued[slot]:
            if time.monotonic() > deadline:
                rec.status = "error"
                raise CommTimeoutError(
                    f"send of message {rec.seq} on link {rec.link} ({rec.direction}) to stage {rec.peer_stage}: "
                    f"no free shared-memory slot within {self.timeout_s:.3g} s "
                    f"({self.slots} slots of {dg.describe()} in flight)"
                )
            self._check_alive(dg)
            time.sleep(delay)
            delay = min(2 * delay, 1e-3)

    def _check_alive(self, dg: _Delegate) -> None:
        if dg.failed:
            raise DelegateError(f"stage {self.stage}: {dg.describe()} has failed earlier")
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise DelegateError(
                f"stage {self.stage}: delegate processes exited (code {code}) while {dg.describe()} was needed"
            )

    def _await_arrival(
        self, dg: _Delegate, local: int, bound: float, rec: MessageRecord
    ) -> tuple[int, int, int, float]:
        deadline = time.monotonic() + bound
        with dg.lock:
            while local not in dg.arrived:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    rec.status = "error"
                    raise CommTimeoutError(
                        f"receive of message {rec.seq} on link {rec.link} ({rec.direction}) "
                        f"from stage {rec.peer_stage} did not arrive within {bound:.3g} s "
                        f"(posted at {rec.issued:.1f} ms, step {rec.step}, "
                        f"via {dg.describe()})"
                    )
                got, dg.backlog = dg.backlog + dg.poll_records(0.0 if dg.backlog else min(remaining, 0.5)), []
                for kind, a, b, c, d, t in got:
                    if kind == wire.MSG:
                        dg.arrived[a] = (b, c, d, t)
                    elif kind == wire.NEWSEG:
                        dg.segments[a] = Segment(f"{dg.prefix}d{a}", b, c, create=False)
                    elif kind == wire.ERROR:
                        dg.failed = True
                        raise DelegateError(f"stage {self.stage}: {dg.describe()} failed (see its stderr)")
                if local not in dg.arrived and self.proc is not None and self.proc.poll() is not None:
                    raise DelegateError(f"stage {self.stage}: delegate processes exited (code {self.proc.returncode})")
            return dg.arrived.pop(local)

    # -- CUDA (untested here: no GPU on the development machine) ----------------------------
    def _cuda_pack(self, seg: Segment, slot: int, tensors: list[torch.Tensor], offsets: list[int], flag: int) -> Any:
        """Device→host into the pinned slot on a side stream, then the stream-ordered FILLED write."""
        device = next(t.device for t in tensors if t.is_cuda)
        seg.pin()
        if self._cuda_stream is None:
            self._cuda_stream = torch.cuda.Stream(device=device)
        stream = self._cuda_stream
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream), torch.no_grad():
            view = seg.slot(slot)
            for t, off in zip(tensors, offsets):
                if t.numel():
                    n = t.numel() * t.element_size()
                    view[off : off + n].view(t.dtype).view(t.shape).copy_(t, non_blocking=True)
                    t.record_stream(stream)
            value = torch.full((1,), flag, dtype=torch.int64, device=device)
            seg.flag_view(slot, FILLED).copy_(value, non_blocking=True)  # lands after the data (same stream)
            event = torch.cuda.Event()
            event.record(stream)
        return event

    def _cuda_unpack(self, seg: Segment, view: torch.Tensor, tensors: list[torch.Tensor], offsets: list[int]) -> None:
        """Host→device from the pinned slot on the current stream; the slot is released after the copy."""
        seg.pin()
        unpack(view, tensors, offsets, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream())
        event.synchronize()

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
    def _drained(self) -> bool:
        for pool in self._delegates.values():
            for dg in pool:
                if dg.send:
                    for seg in dg.segments.values():
                        if any(seg.flag(s, FREED) != seg.issued[s] for s in range(seg.nslots)):
                            return False
        return True

    def close(self, timeout: float | None = None, drain: bool = True) -> None:
        """Stop the delegates (``drain``: after every queued send left), unlink all segments."""
        if self._closed:
            return
        self._closed = True
        self._close_at_exit(closing=True)
        bound = self.timeout_s if timeout is None else timeout
        deadline = time.monotonic() + bound
        undrained = False
        proc = self.proc
        if drain and proc is not None:
            while not self._drained() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(1e-3)
            undrained = not self._drained()
        for pool in self._delegates.values():
            for dg in pool:
                try:
                    dg.command(wire.STOP)
                except DelegateError:
                    pass
        if proc is not None:
            try:
                proc.wait(max(0.5, min(10.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(5.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5.0)
        for pool in self._delegates.values():
            for dg in pool:
                for seg in dg.segments.values():
                    seg.close()
                for fd in (dg.cmd_w, dg.out_r):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        if self.token:
            unlink_prefix(self.prefix)
        self._master = None
        if undrained and drain:
            raise CommTimeoutError(
                f"DelegateTransport.close: stage {self.stage} sends not drained within {bound:.3g} s"
            )

    def __enter__(self) -> DelegateTransport:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(drain=exc_type is None)
