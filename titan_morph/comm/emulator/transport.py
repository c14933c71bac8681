"""Link emulator: delay real pipeline messages exactly as the shared link model says (paper §7 set-up).

Semantics come from ``titan_morph.pipelining.core.links`` (one definition for simulator and emulator):
a message accepted on a link at ``t`` with delay ``c`` is delivered at ``t + c``; links are FIFO
per (link, direction); with ``depth=d`` (the default transport / NCCL model) a send issued while
``d`` messages are in flight blocks the caller until the oldest is delivered (head-of-line
blocking, what the paper's §3 measures); ``depth=None`` (a decoupled transport, §5) never blocks;
``inf`` delay means the link is down (:class:`LinkDownError`). :class:`LinkQueue` makes every
timing decision here, so measured and predicted iteration times are comparable.

How it works. A *message* is the ops one ``batch_p2p`` call addresses to one (link, direction)
(one microbatch's activations or gradients); both sides of a link group identically (torch's
stages do). Sends are held on the sender: per (link, direction) a thread releases each message to
the inner transport at its delivery time, so the receiver sees it ≈ ``accepted + c`` later.
Receives are posted to the inner transport at once and queued, per (link, direction), on a
*receive watcher* thread (started with the link's first receive) that handles them in posting
order whether or not the consumer is waiting yet: it waits (in ``poll_s`` slices that re-check
the model for a down link and the transport for ``close``) for the sender's commit notice in the
c10d store, written by the link thread as soon as the message is accepted (after releasing
whatever is due, so a message due at once never waits for a store round trip; the notice also
carries the planned delivery time, ``RecvHandle.due_s``, for a device clock). Then the inner
work is certain to complete at ≈ the delivery time; whoever blocks on it stamps
``MessageRecord.arrived`` when it does: the consumer if its ``wait`` had begun by the notice
(so it wakes once, at the arrival, as with no watcher), else the watcher — the true arrival even
while the training thread is busy elsewhere (the straggler monitor measures per-link
delivery delays from it). ``wait`` is bounded and re-raises the watcher's error. The store side
channel exists because gloo cannot poll a receive: ``Work.is_completed`` stays False until
``wait``, a ``wait(timeout)`` that expires closes the pair to the peer, and a thread left blocked
in a gloo wait aborts the process at exit (the watcher enters one only after the notice, and
``close`` joins it). With it every wait is bounded and a send refused on a down link reaches the
receiver as :class:`LinkDownError` at once, never as a hang.

Link down. A send whose link is down is refused with :class:`LinkDownError` at issue time (nothing
of its batch is issued); its payload still goes out undelayed behind earlier messages, marked
``down``, so the receiver's posted receive is consumed (the wire stays in step for later traffic,
e.g. when a trace brings the link back) and that receive raises :class:`LinkDownError`. A receive
whose peer never issues the send gives up after its consumer waited ``down_grace_s`` on a link the
model says is down (its gloo receive stays posted; the peer's later placeholder, if any, completes
it).

One stream per peer pair. On NCCL a pair's sends and receives run on one stream in posting order,
and receives posted at once ahead of sends released later could hold each other up on both ranks:
over plain torch P2P on NCCL the emulator therefore moves the bytes on one 2-rank group per (link,
direction) (:class:`~titan_morph.comm.pairs.LinkGroups`), where each stream carries one direction in
message order; ``auto``'s default path below it does the same on NCCL.

Time base: all ranks share ``epoch`` (the pipeline's common clock, :mod:`titan_morph.comm.clock`); times
handed to the link model are ms since the epoch, and step-keyed traces read :attr:`step`.

Threading: ``batch_p2p`` is meant for one issuing thread (the training loop; it holds a lock while
blocked, as NCCL would block it); handles may be waited from any thread. Every send handle must be
waited (torch's schedules wait all sends at the end of a step): the transport keeps unwaited
sends alive until then, since dropping a gloo Work early cancels the send. Per (link, direction)
this rank uses, one link thread (sends) and one receive watcher; ``close`` stops and joins both
(a watcher within ``poll_s``). ``arrived`` is stamped in Python: when another thread holds the
GIL in pure Python code, the stamp can lag by up to ``sys.getswitchinterval()`` (5 ms).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Store

from titan_morph.comm.emulator.notices import NoticeBoard
from titan_morph.comm.emulator.recv import RecvHandle, RecvWatcher
from titan_morph.comm.machine.devices import bind_device
from titan_morph.comm.pairs import one_stream_per_pair
from titan_morph.comm.records import CommTimeoutError, MessageBook, MessageRecord, UndeliveredError
from titan_morph.comm.timeouts import DEFAULT_TIMEOUTS, CommTimeouts
from titan_morph.comm.transport import DefaultPathOnly, Handle, TorchTransport, Transport, group_by_link
from titan_morph.pipelining.core.links import LinkDownError, LinkModel, LinkQueue

__all__ = ["EmulatedTransport"]


class _Outgoing:
    __slots__ = ("ops", "release_at", "key", "record", "done", "handles", "error", "value")

    def __init__(self, ops: list[dist.P2POp], release_at: float, key: str, record: MessageRecord, value: str) -> None:
        self.ops, self.release_at, self.key, self.record, self.value = ops, release_at, key, record, value
        self.done = threading.Event()
        self.handles: list[Handle] = []
        self.error: BaseException | None = None


_T = TypeVar("_T", bound=threading.Thread)


def _started(threads: dict[tuple[int, str], _T], key: tuple[int, str], make: Callable[[], _T]) -> _T:
    """The thread serving ``key`` (a (link, direction)), made and started on its first message: the
    senders and the receive watchers are both one thread per direction, started lazily."""
    thread = threads.get(key)
    if thread is None:
        thread = threads[key] = make()
        thread.start()
    return thread


class _Sender(threading.Thread):
    """Announces one (link, direction)'s messages at once and releases them at their delivery times.

    The announcement (store key ``ok:<nbytes>``) tells the receiver the message is committed, so it
    can block on the data itself and observe the true arrival time; the release hands the message
    to the inner transport at ``accepted + delay``.
    """

    def __init__(self, owner: EmulatedTransport, link: int, direction: str) -> None:
        super().__init__(name=f"titan_morph-link{link}-{direction}", daemon=True)
        self.owner, self.link, self.direction = owner, link, direction
        self.items: deque[_Outgoing] = deque()
        self.to_announce: list[_Outgoing] = []
        self.cond = threading.Condition()
        self.stopping = False
        self.aborted = False
        self.last_release = 0.0

    def put(self, item: _Outgoing) -> None:
        with self.cond:
            if self.stopping:
                raise RuntimeError(f"EmulatedTransport is closed (link {self.link} {self.direction})")
            item.release_at = max(item.release_at, self.last_release)  # FIFO on the wire
            self.last_release = item.release_at
            self.items.append(item)
            self.to_announce.append(item)
            self.cond.notify()

    def _next_batch(self) -> tuple[list[_Outgoing], list[_Outgoing]] | None:
        """Wait until something is to announce or due; None when stopped and drained (or aborted)."""
        with self.cond:
            while True:
                if self.aborted:
                    return None
                announce, self.to_announce = self.to_announce, []
                due = []
                now = time.monotonic()
                while self.items and self.items[0].release_at <= now:
                    due.append(self.items.popleft())
                if announce or due:
                    return announce, due
                if self.items:
                    self.cond.wait(self.items[0].release_at - now)
                elif self.stopping:
                    return None
                else:
                    self.cond.wait()

    def run(self) -> None:
        owner = self.owner
        bind_device(owner.device)
        while (batch := self._next_batch()) is not None:
            announce, due = batch
            # Due messages go to the wire first: a notice costs a store round trip, and a message
            # due now must not wait for it (its receiver is normally blocked on the notice already,
            # and reads the data the moment the notice lands).
            for item in due:
                try:
                    if item.error is None:
                        item.handles = owner.inner.batch_p2p(item.ops)
                        item.record.released = owner.now_ms()
                        if item.value == "down":
                            item.record.status = "down"
                except BaseException as e:
                    item.error = e
                if item.error is not None:
                    item.record.status = "error"
            for item in announce:
                try:
                    owner.notices.post(item.key, f"{item.value}:{item.record.nbytes}:{item.record.planned or 0.0:.4f}")
                    owner.notices.forget(self.link, self.direction, item.record.seq)
                except BaseException as e:  # surfaced by the handle's wait()
                    if not item.done.is_set():
                        item.error = e
                        item.record.status = "error"
            for item in due:
                item.done.set()
        self._fail_all(RuntimeError(f"EmulatedTransport closed before link {self.link} ({self.direction}) released"))

    def _fail_all(self, error: BaseException) -> None:
        with self.cond:
            items, self.items = list(self.items), deque()
        for item in items:
            item.error = error
            item.record.status = "error"
            item.done.set()

    def stop(self, drain: bool) -> None:
        with self.cond:
            self.stopping = True
            self.aborted = self.aborted or not drain
            self.cond.notify()


class _SendHandle:
    """Completes when the message was released and the inner send finished; ``ops``/``record`` are
    exposed so a failover path can re-issue the same ops elsewhere."""

    due_s = None

    def __init__(self, owner: EmulatedTransport, item: _Outgoing) -> None:
        self.owner, self.item = owner, item
        self.ops, self.record = item.ops, item.record

    def wait(self, timeout: float | None = None) -> bool:
        item, rec = self.item, self.item.record
        deadline = time.monotonic() + (self.owner.timeout_s if timeout is None else timeout)
        if not item.done.wait(max(0.0, deadline - time.monotonic())):
            raise CommTimeoutError(
                f"{self.owner.where()}: send of message {rec.seq} on link {rec.link} ({rec.direction}) to stage "
                f"{rec.peer_stage} was not "
                f"released within {self.owner.timeout_s if timeout is None else timeout:.3g} s "
                f"(planned delivery at {rec.planned:.1f} ms, now {self.owner.now_ms():.1f} ms)"
            )
        if item.error is not None:
            raise item.error
        for h in item.handles:
            h.wait(max(0.0, deadline - time.monotonic()))
        if rec.completed is None:
            rec.completed = self.owner.now_ms()
            rec.status = "done"
            self.owner._unwaited.pop(id(item), None)
        return True

    def is_completed(self) -> bool:
        return self.item.record.completed is not None


# Module-level: the store namespace of the n-th emulator built in this process must match on every rank.
_instances = itertools.count()
_wires = itertools.count()  # the same for the per-direction groups of emulators on NCCL


class EmulatedTransport(DefaultPathOnly, MessageBook, Transport):
    """Wraps ``inner`` and delays pipeline messages per ``links`` (see module docstring).

    Args:
        inner: the transport that moves the bytes (e.g. :class:`TorchTransport`); closed by ``close``.
        links: the shared link model (``StaticDelays``, ``RandomDelays``, ``TraceDelays``...).
        stage, num_stages: this rank's stage (= its rank in ``group``) and the pipeline size.
        group: the pipeline process group (None = default group); ops on other groups pass through.
        depth: in-flight bound per (link, direction): an int models the blocking default
            transport, None a decoupled one (see ``LinkQueue``).
        epoch: the pipeline's t=0 as a ``time.monotonic()`` value (:func:`~titan_morph.comm.clock.sync_clock`).
        record: keep a :class:`MessageRecord` per message (``records()``), the newest
            ``max_records`` of them (call ``take_records()`` per step to keep them all).
        timeouts: the bound of every ``wait`` (start-up and step 1, then training: TorchTitan's
            ``[comm]`` timeouts); down_grace_s: how long a receive waits on a link
            the model says is down before raising; poll_s: how often such a wait re-checks the model.
        store: c10d store for commit notices (default: the default group's store);
            namespace: key prefix, unique per transport instance (default: group name + a per-process
            instance counter, identical on all ranks if they construct transports in the same order).
    """

    name = "emulated"
    path = "emulated"

    def __init__(
        self,
        inner: Transport,
        links: LinkModel,
        *,
        stage: int,
        num_stages: int,
        group: dist.ProcessGroup | None = None,
        depth: int | None,
        epoch: float,
        record: bool = True,
        max_records: int = 200_000,
        timeouts: CommTimeouts = DEFAULT_TIMEOUTS,
        down_grace_s: float = 1.0,
        poll_s: float = 1.0,
        store: Store | None = None,
        namespace: str | None = None,
    ) -> None:
        if links.num_links != num_stages - 1:
            raise ValueError(f"link model has {links.num_links} links but {num_stages} stages need {num_stages - 1}")
        if depth is not None and depth < 1:
            raise ValueError(f"depth must be >= 1 (or None for a non-blocking transport), got {depth}")
        for nm, v in (("down_grace_s", down_grace_s), ("poll_s", poll_s)):
            if not (v >= 0 and math.isfinite(v)) or (nm != "down_grace_s" and v == 0):
                raise ValueError(f"{nm} must be a finite number of seconds > 0, got {v}")
        super().__init__(
            stage=stage, num_stages=num_stages, group=group, epoch=epoch, record=record, max_records=max_records
        )
        # the rank's device, for the link threads that issue and wait its NCCL operations
        self.device = torch.device("cuda", torch.cuda.current_device()) if one_stream_per_pair(self.group) else None
        if type(inner) is TorchTransport and self.device is not None:
            inner = self._direction_wire(timeouts, store)
        self.inner, self.links, self.depth = inner, links, depth
        self.timeouts = timeouts
        self.down_grace_s, self.poll_s = float(down_grace_s), float(poll_s)
        base = store if store is not None else dist.distributed_c10d._get_default_store()
        ns = namespace if namespace is not None else f"titan_morph/emu/{self._group_name}/{next(_instances)}"
        self.notices = NoticeBoard(base, ns)
        self._queues: dict[tuple[int, str], LinkQueue] = {}
        self._senders: dict[tuple[int, str], _Sender] = {}
        self._watchers: dict[tuple[int, str], RecvWatcher] = {}
        self._blocked: dict[int, float] = {}
        # Sends not yet waited, kept alive: dropping a gloo Work before it completes cancels the send.
        self._unwaited: dict[int, _Outgoing] = {}
        self._closed = False
        self._issue_hint: tuple[float, float] | None = None
        self._last_issue: dict[tuple[int, str], float] = {}
        self._close_at_exit()

    def _direction_wire(self, timeouts: CommTimeouts, store: Store | None) -> Transport:
        """torch's P2P on one group per (link, direction): on a backend with one stream per peer pair
        (NCCL) a receive posted at once would otherwise queue ahead of the delayed send that its own
        peer waits for, on both ranks (module docstring: receives post at once, sends later)."""
        from titan_morph.comm.pairs import LinkGroups, LinkTransport

        groups = LinkGroups(
            stage=self.stage,
            num_stages=self.num_stages,
            store=store,
            namespace=f"emu/{self._group_name}/{next(_wires)}",
            backend="nccl",
            timeouts=timeouts,
            device=self.device,
            split_directions=True,
        )
        return LinkTransport(groups, group=self.group, epoch=self.epoch)

    @property
    def closed(self) -> bool:
        return self._closed

    def set_step(self, step: int) -> None:
        """The training step about to run, here and in ``inner`` (its timeouts, its injected breaks)."""
        super().set_step(step)
        self.inner.set_step(step)

    @property
    def timeout_s(self) -> float:
        """The bound of a wait now (``timeouts`` for the current step)."""
        return self.timeouts.for_step(self.step)

    # -- time base -------------------------------------------------------------------------
    def hint_issue(self, t_s: float, max_early_ms: float = 2.0) -> None:
        """The sends of the next ``batch_p2p`` were logically issued at ``t_s`` (``time.monotonic()``).

        A device clock (the synthetic testbed) calls this with the producing op's device end: on
        a GPU the send is queued behind that op and leaves when it ends, while the host issues it
        a little later. The link model then times the message from ``t_s``, but never more than
        ``max_early_ms`` before the actual call (host latency beyond that stays visible).
        """
        if not (max_early_ms >= 0 and math.isfinite(max_early_ms)):
            raise ValueError(f"max_early_ms must be a finite number of ms >= 0, got {max_early_ms}")
        self._issue_hint = (float(t_s), float(max_early_ms))

    # -- issue path ------------------------------------------------------------------------
    def _sender(self, link: int, direction: str) -> _Sender:
        return _started(self._senders, (link, direction), lambda: _Sender(self, link, direction))

    def _watcher(self, link: int, direction: str) -> RecvWatcher:
        return _started(self._watchers, (link, direction), lambda: RecvWatcher(self, link, direction))

    def _refuse(self, link: int, direction: str, ops: list[dist.P2POp], when: str) -> LinkDownError:
        """Refuse a send on a down link. Its payload still travels, undelayed and behind earlier
        messages, as a placeholder marked ``down``: the receiver's posted receive is consumed (no
        dangling gloo receive to swallow a later message) and then raises ``LinkDownError``."""
        seq = self._next(self._send_seq, link, direction)
        rec = self._new_record("send", link, direction, seq, ops)
        rec.status = "down"
        item = _Outgoing(ops, time.monotonic(), self.notices.key(link, direction, seq), rec, "down")
        self._unwaited[id(item)] = item
        self._sender(link, direction).put(item)
        return LinkDownError(link, direction, f"{when}: send of message {seq} to stage {rec.peer_stage} refused")

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        """Issue ``ops``: receives post at once; sends block per ``depth`` and are held for their delay.

        Raises :class:`LinkDownError` (nothing of the batch issued) if a send's link is down now.
        """
        if self._closed:
            raise RuntimeError("EmulatedTransport is closed")
        ops = list(ops)
        mine, handles = self._partition(ops, self.inner.batch_p2p, desc)  # other groups: no emulated link
        if not mine:
            return handles
        messages = group_by_link(mine, self.stage, self.num_stages)
        hint, self._issue_hint = self._issue_hint, None
        with self._lock:
            t = self.now_ms()
            down = [k for k in messages if k[2] and math.isinf(self.links.delay_ms(k[0], k[1], t, self.step))]
            if down:
                errors = [self._refuse(link, d, messages[(link, d, s)], f" at t={t:.1f} ms") for link, d, s in down]
                raise errors[0]
            for (link, d, send), mops in messages.items():
                if send:
                    continue
                seq = self._next(self._recv_seq, link, d)
                rec = self._new_record("recv", link, d, seq, mops)
                handle = RecvHandle(self, mops, self.inner.batch_p2p(mops, desc), self.notices.key(link, d, seq), rec)
                self._watcher(link, d).put(handle)
                handles.append(handle)
            for (link, d, send), mops in messages.items():
                if send:
                    handles.append(self._issue_send(link, d, mops, hint))
        return handles

    def _issue_send(
        self, link: int, direction: str, ops: list[dist.P2POp], hint: tuple[float, float] | None = None
    ) -> _SendHandle:
        queue = self._queues.get((link, direction))
        if queue is None:
            queue = self._queues[(link, direction)] = LinkQueue(self.links, link, direction, self.depth)
        issued = self.now_ms()
        if hint is not None:  # see hint_issue: bounded, and never before this link's previous send
            t_ms, early_ms = (hint[0] - self.epoch) * 1e3, hint[1]
            issued = max(min(issued, t_ms), issued - early_ms, self._last_issue.get((link, direction), -math.inf))
        self._last_issue[(link, direction)] = issued
        try:
            timing = queue.send(issued, self.step)
        except LinkDownError as e:  # down at the (later) acceptance time
            raise self._refuse(link, direction, ops, f" at t={issued:.1f} ms") from e
        seq = self._next(self._send_seq, link, direction)
        rec = self._new_record("send", link, direction, seq, ops)
        rec.issued, rec.accepted, rec.planned = issued, timing.accepted, timing.delivered
        rec.delay_ms = self.links.delay_ms(link, direction, timing.accepted, self.step)
        wait_s = (timing.accepted - self.now_ms()) / 1e3
        if wait_s > 0:  # head-of-line blocking: the caller waits for the oldest in-flight delivery
            time.sleep(wait_s)
        self._blocked[link] = self._blocked.get(link, 0.0) + timing.blocked
        item = _Outgoing(ops, self.epoch + timing.delivered / 1e3, self.notices.key(link, direction, seq), rec, "ok")
        self._unwaited[id(item)] = item
        self._sender(link, direction).put(item)
        return _SendHandle(self, item)

    # -- metrics -------------------------------------------------------------------------
    def blocked_ms(self) -> dict[int, float]:
        """Total time the caller was blocked by full links (head-of-line), per link, in ms, since start."""
        return dict(self._blocked)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self, timeout: float | None = None, drain: bool = True) -> None:
        """Release queued sends (``drain``) or drop them, stop the link threads and the receive
        watchers (receives still outstanding then fail with RuntimeError), close ``inner``.

        A draining close also finishes the sends nobody waited; one that failed (released or not) is
        reported once everything is closed: :class:`~titan_morph.comm.records.UndeliveredError`
        naming rank, link, direction and message, chained to the first failure. Placeholders of
        refused sends are not reported again (their ``LinkDownError`` was raised at issue).
        ``CommTimeoutError`` when a thread did not finish in time (and no send failed)."""
        if self._closed:
            return
        self._closed = True
        self._close_at_exit(closing=True)
        deadline = time.monotonic() + (self.timeout_s if timeout is None else timeout)
        for w in self._watchers.values():
            w.stop()
        for s in self._senders.values():
            s.stop(drain)
        stuck = []
        for (link, d), s in self._senders.items():
            s.join(max(0.0, deadline - time.monotonic()))
            if s.is_alive():
                s.stop(drain=False)
                s.join(1.0)
                stuck.append(f"link {link} {d}")
        for (link, d), w in self._watchers.items():  # each sees the flag within one poll_s
            w.join(max(deadline - time.monotonic(), self.poll_s + 1.0))
            if w.is_alive():
                stuck.append(f"link {link} {d} (receive watcher)")
        failed = self._finish_unwaited(deadline) if drain else []
        self._unwaited.clear()
        # Break owner<->thread cycles and drop the extra store clients now, not at interpreter exit.
        self._senders, self._watchers = {}, {}
        self.notices.close()
        self.inner.close(timeout, drain)
        if failed:
            also = f"; threads not finished in time on {', '.join(stuck)}" if stuck else ""
            raise UndeliveredError(
                f"EmulatedTransport.close: {self.where()}: {len(failed)} send(s) nobody waited failed: "
                + "; ".join(f"{what}: {type(e).__name__}: {e}" for what, e in failed)
                + also
            ) from failed[0][1]
        if stuck:
            raise CommTimeoutError(f"EmulatedTransport.close: threads not finished in time on {', '.join(stuck)}")

    def _finish_unwaited(self, deadline: float) -> list[tuple[str, BaseException]]:
        """Wait the sends nobody waited (they must finish before teardown); the real ones that failed."""
        failed: list[tuple[str, BaseException]] = []
        for item in list(self._unwaited.values()):
            rec, error = item.record, item.error
            for h in item.handles:
                try:
                    h.wait(max(0.1, min(5.0, deadline - time.monotonic())))
                except Exception as e:
                    error = error or e
            if error is not None and item.value == "ok":
                rec.status = "error"
                failed.append(
                    (f"send of message {rec.seq} on link {rec.link} ({rec.direction}) to stage {rec.peer_stage}", error)
                )
        return failed

    def __enter__(self) -> EmulatedTransport:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(drain=exc_type is None)
