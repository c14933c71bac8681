"""DelegateTransport: pipeline traffic through shared memory and Gloo delegate processes (§5).

Paper §5: the training process must never wait on the wire. A send copies the message into a
free slot of a shared-memory ring (:mod:`titan_morph.comm.delegate.shm`), sets the slot's FILLED flag and
returns; a *delegate* subprocess (:mod:`titan_morph.comm.delegate.worker`) puts it on its own Gloo
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
semantics as :class:`~titan_morph.comm.emulator.transport.EmulatedTransport` with ``depth=None``, so the
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

import math
import subprocess
import threading
import time
from collections.abc import Iterable

import torch
import torch.distributed as dist

from titan_morph.comm.clock import sync_clock
from titan_morph.comm.delegate import worker as wire
from titan_morph.comm.delegate.pool import DelegateEnd, DelegateError, DelegatePool, Listener, exit_status
from titan_morph.comm.delegate.shm import DEFAULT_SLOTS
from titan_morph.comm.delegate.slots import DeferredReleases, RecvHandle, SendHandle, SlotPath
from titan_morph.comm.records import CommTimeoutError, MessageBook
from titan_morph.comm.timeouts import DEFAULT_TIMEOUTS, CommTimeouts
from titan_morph.comm.transport import Handle, TorchTransport, Transport, group_by_link
from titan_morph.pipelining.core.links import LinkModel, LinkQueue

__all__ = ["DeferredReleases", "DelegateError", "DelegateTransport", "exit_status"]


class _FiniteDelays(LinkModel):
    """The link model as the delegated path sees it: ``inf`` (the default path's NIC is down)
    becomes ``down_delay_ms`` because delegated traffic is routed around the failed link; a rate
    holds on both paths (an emulated link's wire, like netlab's ``tc`` on both NICs)."""

    def __init__(self, model: LinkModel, down_delay_ms: float) -> None:
        self.model, self.down_delay_ms, self.num_links = model, down_delay_ms, model.num_links

    def delay_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        d = self.model.delay_ms(link, direction, t_ms, step)
        return self.down_delay_ms if math.isinf(d) else d

    def transmit_ms(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float:
        return self.model.transmit_ms(link, direction, t_ms, step)  # the same wire, whichever path

    def rate_mbit(self, link: int, direction: str, t_ms: float = 0.0, step: int = 0) -> float | None:
        return self.model.rate_mbit(link, direction, t_ms, step)


class DelegateTransport(MessageBook, Transport):
    """The delegated data plane (see module docstring). Construct on every pipeline rank, same order.

    Composes the delegate processes (:class:`~titan_morph.comm.delegate.pool.DelegatePool`) and the
    shared-memory data path (:class:`~titan_morph.comm.delegate.slots.SlotPath`); it numbers the
    messages, picks each one's delegate and times its release on emulated links.

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
        host_interfaces: ``[morph] host_ifnames``: the delegates' network interfaces (() = torch's).
    """

    name = "delegate"
    path = "delegate"
    exit_timeout_s = 2.0
    depth = None  # never blocks the caller on the wire (LinkQueue depth=None semantics)
    failovers = 0  # everything is delegated: nothing to fail over

    def __init__(
        self,
        *,
        stage: int,
        num_stages: int,
        group: dist.ProcessGroup | None = None,
        links: LinkModel | None = None,
        delegates_per_link: int = 1,
        slots: int = DEFAULT_SLOTS,
        epoch: float | None = None,
        timeouts: CommTimeouts = DEFAULT_TIMEOUTS,
        down_delay_ms: float = 0.0,
        record: bool = True,
        max_records: int = 200_000,
        wire_timeout_s: float = 7 * 24 * 3600.0,
        strict: bool = True,
        device: torch.device | str | None = None,
        host_interfaces: tuple[str, ...] = (),
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
        self._passthrough = TorchTransport(self.epoch)
        self._blocked: dict[int, float] = {}
        self._copy_ms: dict[int, float] = {}
        self._queues: dict[tuple[int, str], LinkQueue] = {}
        self._emulated = _FiniteDelays(links, down_delay_ms) if links is not None else None
        self._send_locks: dict[tuple[int, str], threading.Lock] = {}
        self.pool = DelegatePool(
            stage=stage,
            num_stages=num_stages,
            where=self.where(),
            group_name=self._group_name,
            k=delegates_per_link,
            slots=slots,
            timeouts=timeouts,
            strict=strict,
            prepare_segment=lambda seg: self.data.prepare_segment(seg),  # the reader starts once both exist
            releases_pending=lambda: self.data.releases.pending(),
            poll_releases=lambda: self.data.releases.poll(),
            drain_copies=lambda bound_s: self.data.drain(bound_s),
            device=self.device,
            interfaces=host_interfaces,
        )
        self.data = SlotPath(self, self.pool, slots, self.device)
        # This run's token (in the delegates' command lines and segment names) and the name prefix of
        # this rank's shared-memory segments: fixed once the pool met its peers.
        self.token, self.prefix = self.pool.token, self.pool.prefix
        self._close_at_exit()
        try:
            self.pool.start(wire_timeout_s)
        except BaseException:
            self.close(timeout=2.0, drain=False)
            raise

    @property
    def timeout_s(self) -> float:
        """The bound of a wait now (``timeouts`` for the current step)."""
        return self.timeouts.for_step(self.step)

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The delegate root process (None before it started)."""
        return self.pool.proc

    @property
    def _releases(self) -> DeferredReleases:
        return self.data.releases

    @property
    def _delegates(self) -> dict[tuple[int, str], list[DelegateEnd]]:
        return self.pool.delegates

    # -- failures ---------------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(link, direction, error)`` (from the reader thread) when a delegate fails."""
        self.pool.add_listener(listener)

    def failed(self) -> dict[tuple[int, str], DelegateError]:
        """The (link, direction) pools with a failed delegate, and the first failure of each."""
        return self.pool.failed()

    def abandon(self, link: int, why: str) -> None:
        """Give the delegated path of ``link`` up (both directions, e.g. after a peer's delegate failed):
        waits on it raise :class:`DelegateError` at once; messages already here can still be taken."""
        self.pool.abandon(link, why)

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
        if self.data.releases.pending():
            self.data.releases.poll()
        messages = group_by_link(mine, self.stage, self.num_stages)
        with self._lock:
            for (link, d, send), mops in messages.items():
                if not send:
                    n = self._next(self._recv_seq, link, d)
                    dg = self.pool.delegates[(link, d)][n % self.k]
                    rec = self._new_record("recv", link, d, n, mops)
                    handles.append(RecvHandle(self.data, mops, dg, n // self.k, rec))
        for (link, d, send), mops in messages.items():
            if send:  # one issuer per (link, direction) at a time; a send blocked on a full ring holds no other
                with self._send_locks.setdefault((link, d), threading.Lock()):
                    handles.append(self._send(link, d, mops))
        return handles

    def _send(self, link: int, direction: str, ops: list[dist.P2POp]) -> SendHandle:
        # Nothing of the link's state (sequence number, slot cursor, slot ownership, the record) is
        # committed before the payload is in its slot: a send that raises leaves it as it was.
        n = self._send_seq.get((link, direction), 0)
        dg = self.pool.delegates[(link, direction)][n % self.k]
        self.pool.check(dg)
        local = n // self.k
        rec = self._new_record("send", link, direction, n, ops, keep=False)
        placed = self.data.put(dg, local, ops, rec)
        self._send_seq[(link, direction)] = n + 1
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
        dg.command(wire.MSG, local, placed.seg_id, placed.slot, placed.nbytes, deliver_at)
        self._blocked[link] = self._blocked.get(link, 0.0) + (placed.t1 - placed.t0) * 1e3
        self._copy_ms[link] = self._copy_ms.get(link, 0.0) + (t2 - placed.t1) * 1e3
        rec.completed = self.now_ms()
        rec.status = "done"
        return SendHandle(ops, rec, placed.event)

    # -- metrics and paths ---------------------------------------------------------------
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
        proc = self.pool.proc
        return [] if proc is None else [proc.pid]

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
        undelivered = self.pool.stop(bound, drain)
        if drain and undelivered:
            raise CommTimeoutError(
                f"DelegateTransport.close: {self.where()}: delivery of the queued sends not confirmed within "
                f"{bound:.3g} s by {', '.join(undelivered)}"
            )

    def __enter__(self) -> DelegateTransport:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(drain=exc_type is None)
