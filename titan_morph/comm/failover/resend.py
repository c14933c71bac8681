"""The messages of a :class:`~titan_morph.comm.failover.transport.FailoverTransport` and their replay on a new path.

Every message is kept for the current and the previous step. When a link moves after a failure,
the sending side re-sends (on a re-sender thread per (link, direction), oldest first, ahead of later
sends) every message of the failed step, and the receiving side posts again each receive of that
step: a discard for a message already here, the receive itself for one that is not. Both ends thus
carry the same sequence on the new path.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import torch
import torch.distributed as dist

from titan_morph.comm.failover.router import PATH_ERRORS, PRIMARY, Router
from titan_morph.comm.failover.stall import StallWatch
from titan_morph.comm.pairs import LinkFailedError
from titan_morph.comm.records import CommTimeoutError, MessageRecord
from titan_morph.comm.transport import DeviceOrdered, Handle, Settles

__all__ = ["DefaultPathWaits", "Message", "Recv", "Resender"]

logger = logging.getLogger(__name__)

SETTLE_S = 0.05  # how long a receive on a failed path may take to show it is complete
WAITER_IDLE_S = 5.0  # how long an idle waiter stays for the next wait before it ends


class Message:
    """A pipeline message through the failover transport: its (link, direction), the step it belongs
    to, its ops and the handles of the path that carries it now (``path``, as of ``gen``)."""

    due_s = None

    def __init__(self, owner: Resender, key: tuple[int, str], step: int, ops: list[dist.P2POp]) -> None:
        self.owner, self.key, self.step, self.ops = owner, key, step, ops
        self.inner: list[Handle] = []
        self.path = ""
        self.gen = -1
        self.first = -1  # index of its first op on the default path as of ``gen`` (-1: elsewhere)
        self.issued = threading.Event()
        self.job: _Job | None = None  # the default path's waiter's job on ``inner``, once waited there
        self.done = False
        self.error: BaseException | None = None

    @property
    def record(self) -> MessageRecord | None:
        return self.inner[0].record if self.inner else None

    def carry(self, handles: list[Handle], path: str, gen: int, first: int = -1) -> None:
        self.inner, self.path, self.gen, self.first = handles, path, gen, first
        waits = self.owner.waits
        if waits is not None and path == PRIMARY and all(isinstance(h, Settles) for h in handles):
            waits.submit(self, handles, gen)  # settled ahead of the consumer, who stamps its own wait
        self.issued.set()

    def is_completed(self) -> bool:
        return self.done

    def wait(self, timeout: float | None = None) -> bool:
        router = self.owner.router
        bound = router.timeout_s if timeout is None else timeout
        deadline = time.monotonic() + bound
        while not self.done:
            if not self.issued.wait(max(0.0, deadline - time.monotonic())):
                link, d = self.key
                raise CommTimeoutError(
                    f"{router.where()}: message of step {self.step} on link {link} ({d}) was not re-issued on its "
                    f"new path within {bound:.3g} s"
                )
            if self.error is not None:
                raise self.error
            with router.lock:
                handles, gen, path, first = self.inner, self.gen, self.path, self.first
            token = self.owner.stalls.begin(self.key, path, gen, first)  # a stall moves the link meanwhile
            waits = self.owner.waits
            try:
                if waits is not None and path == PRIMARY:
                    if not waits.wait(self, handles, gen, deadline):
                        continue  # moved: the new path carries it again
                else:
                    for h in handles:
                        h.wait(max(1e-3, deadline - time.monotonic()))
            except PATH_ERRORS as e:
                router.failed_at(self.key[0], path, gen, e)  # raises when no path is left
                continue
            finally:
                self.owner.stalls.end(token)
            if not self._before_done(gen):
                continue  # moved while we waited: the new path also delivers (the same bytes), wait for it
        return True

    def _before_done(self, gen: int) -> bool:
        with self.owner.router.lock:
            if self.gen != gen:
                return False
            self.done = True
            return True


class Recv(Message):
    def wait(self, timeout: float | None = None) -> bool:
        self.owner.drain_discards(self.key, self)
        return super().wait(timeout)

    def settle(self) -> bool:
        """Whether this receive's data is already here on its (failed) path, without waiting for it:
        on the device's queue (NCCL, whose waits return at once), once the device ran the receive."""
        if not self.issued.is_set():
            return False
        on_device = [op for h in self.inner if isinstance(h, DeviceOrdered) for op in h.device_ops()]
        if on_device:
            self.done = all(op.landed() for op in on_device)
            return self.done
        if self.done:
            return True
        job = self.job
        if job is not None and job.handles is self.inner:  # its waiter holds the handles: its verdict
            self.done = job.done and job.error is None
            return self.done
        try:
            for h in self.inner:
                h.wait(SETTLE_S)
        except Exception:
            return False
        self.done = True
        return True


class _Job:
    __slots__ = ("handles", "deadline", "done", "error", "signal", "_woken")

    def __init__(self, handles: list[Handle], deadline: float) -> None:
        self.handles, self.deadline = handles, deadline
        self.done = False
        self.error: BaseException | None = None
        # held until the verdict, a move or the transport's close: the caller's wait is an acquire
        self.signal = threading.Lock()
        self.signal.acquire()
        self._woken = False

    def wake(self) -> None:
        """Let the caller go (under the router's lock: at most once)."""
        if not self._woken:
            self._woken = True
            self.signal.release()


class DefaultPathWaits:
    """Waits on the default path's messages off the training thread: a waiter thread per
    (link, direction) and path generation settles them in the order they were issued.

    gloo fails the operations of a pair torn down under it that had not started moving bytes, not
    one it was writing or reading then: that one ends only at its bound, and a shorter timed wait
    would close a healthy pair. So the training thread waits for the waiter's verdict or for the
    link's move, whichever comes first; after a move the new path carries the message again.
    (NCCL's waits are stream-ordered on the caller's stream and its abort ends them: they stay on
    the training thread.) A step makes hundreds of these waits, so the waiter starts on a message
    when it is issued (:meth:`submit`), not when it is waited: by then most have settled and the
    training thread takes their verdict without blocking, or blocks for one wake-up. The waiter
    stamps nothing (:class:`~titan_morph.comm.transport.Settles`): the consumer's own wait, which
    returns at once after the verdict, records when it waited and saw the data. Handles that cannot
    settle without stamping (the link emulator's) are handed to the waiter when the consumer waits,
    and the waiter's wait is theirs (a gloo send or receive work takes exactly one wait).
    """

    def __init__(self, router: Router) -> None:
        self.router = router
        self._queues: dict[tuple[tuple[int, str], int], queue.SimpleQueue[_Job | None]] = {}
        self._pending: dict[tuple[tuple[int, str], int], set[_Job]] = {}  # submitted, no verdict yet
        router.on_move.append(self._leave)

    def _leave(self, link: int | None) -> None:
        """Under the router's lock: ``link`` moved (None: the transport closed); its callers and
        waiters leave (a waiter still inside a gloo wait leaves after it)."""
        for (key, gen), jobs in self._pending.items():
            if link is None or key[0] == link:
                for job in jobs:
                    job.wake()
                self._queues[(key, gen)].put(None)

    def submit(self, msg: Message, handles: list[Handle], gen: int) -> _Job | None:
        """Have ``msg``'s waiter settle ``handles`` (on the default path as of ``gen``), within the
        bound of the step: its job, or None when the link moved or the transport closed first."""
        router, key = self.router, msg.key
        with router.lock:
            if router.gen[key[0]] != gen or router.closed:
                return None
            job = msg.job = _Job(handles, time.monotonic() + router.timeout_s)
            jobs = self._queues.get((key, gen))
            if jobs is None:
                jobs = self._queues[(key, gen)] = queue.SimpleQueue()
                self._pending[(key, gen)] = set()
                router.thread(lambda: self._waiter(key, gen), f"titan_morph-wait-{key[0]}{key[1]}")
            self._pending[(key, gen)].add(job)
            jobs.put(job)
            return job

    def wait(self, msg: Message, handles: list[Handle], gen: int, deadline: float) -> bool:
        """Wait ``handles`` (``msg`` on the default path as of ``gen``): True once they completed,
        False when the link moved first; their error when they failed."""
        router, key = self.router, msg.key
        link = key[0]
        with router.lock:
            if router.gen[link] != gen:
                return False
            job = msg.job if msg.job is not None and msg.job.handles is handles else None
        if job is None:  # not submitted at issue (handles that cannot settle, or a move meanwhile): now
            job = self.submit(msg, handles, gen)
            if job is None:
                return False  # moved (or closed) meanwhile: the caller looks again
        while True:
            with router.lock:
                if job.done:
                    break
                if router.gen[link] != gen:
                    return False
                if router.closed:  # its waiter is gone with the transport
                    raise CommTimeoutError(
                        f"{router.where()}: link {link} ({key[1]}): the transport closed during a wait"
                    )
            # the waiter's own wait ends at its deadline; the margin lets its verdict arrive
            left = min(deadline, job.deadline) + 1.0 - time.monotonic()
            if left <= 0:
                what = "receive" if isinstance(msg, Recv) else "send"
                raise CommTimeoutError(
                    f"{router.where()}: {what} of step {msg.step} on link {link} ({key[1]}) did not "
                    "complete on the default path within its bound"
                )
            job.signal.acquire(timeout=left)
        if job.error is not None:
            raise job.error
        for h in handles:  # settled: the consumer's stamps, at once (the waiter waited the others)
            if isinstance(h, Settles):
                h.wait(max(1e-3, deadline - time.monotonic()))
        return True

    def _waiter(self, key: tuple[int, str], gen: int) -> None:
        router, link = self.router, key[0]
        jobs = self._queues[(key, gen)]
        while True:
            try:
                job = jobs.get(timeout=WAITER_IDLE_S)
            except queue.Empty:
                job = None
            with router.lock:
                moved = router.gen[link] != gen or router.closed
                if job is None and (moved or jobs.empty()):
                    if moved or not self._pending[(key, gen)]:  # a stale job's caller left on the move
                        del self._queues[(key, gen)], self._pending[(key, gen)]
                        return
                if job is None or moved:
                    continue
            try:
                for h in job.handles:
                    left = max(1e-3, job.deadline - time.monotonic())
                    if isinstance(h, Settles):
                        h.settle(left)
                    else:
                        h.wait(left)
            except BaseException as e:  # handed to the training thread, which decides
                job.error = e
            with router.lock:
                job.done = True
                self._pending[(key, gen)].discard(job)
                job.wake()


class Resender:
    """The messages of the current and the previous step, and their replay after a move."""

    def __init__(self, router: Router, stalls: StallWatch, waits: DefaultPathWaits | None = None) -> None:
        self.router, self.stalls, self.waits = router, stalls, waits
        self._sends: dict[tuple[int, str], list[Message]] = {}  # this and the previous step's, in order
        self._recvs: dict[tuple[int, str], list[Recv]] = {}
        self._outbox: dict[tuple[int, str], deque[Message]] = {}  # sends waiting for the re-sender
        self._resenders: dict[tuple[int, str], threading.Thread] = {}
        # per key: (the receive, handles, scratch tensors, path, generation, first op on the default path)
        self._discards: dict[tuple[int, str], deque[tuple[Recv, list[Handle], list[torch.Tensor], str, int, int]]] = {}

    def keep(self, msg: Message) -> bool:
        """Track ``msg`` (caller holds the lock); True when a re-send of its key is under way and
        ``msg`` was queued behind it."""
        if isinstance(msg, Recv):
            self._recvs.setdefault(msg.key, []).append(msg)
            return False
        self._sends.setdefault(msg.key, []).append(msg)
        if self._outbox.get(msg.key):
            self._outbox[msg.key].append(msg)
            return True
        return False

    def forget_before(self, step: int) -> None:
        """Drop messages older than step ``step - 1`` (caller holds the lock)."""
        for key, sends in self._sends.items():
            self._sends[key] = [m for m in sends if m.step >= step - 1]
        for key, recvs in self._recvs.items():
            self._recvs[key] = [m for m in recvs if m.step >= step - 1]

    def drain_all(self) -> None:
        for key in list(self._discards):
            self.drain_discards(key, None)

    def replay(self, key: tuple[int, str], sends: bool, step: int, new: str, gen: int) -> None:
        """After a move of ``key`` to path ``new`` (as of ``gen``): re-issue its traffic since ``step``."""
        if sends:
            self._resend(key, step)
        else:
            self._repost(key, step, new, gen)

    def queue(self, msg: Message) -> None:
        """Have the re-sender issue ``msg`` on its key's current path (caller holds the lock)."""
        self._outbox.setdefault(msg.key, deque()).append(msg)
        self._start_resender(msg.key)

    def _resend(self, key: tuple[int, str], step: int) -> None:
        """Queue every send of ``key`` since ``step`` for the re-sender (in order), ahead of later ones."""
        again = [m for m in self._sends.get(key, []) if m.step >= step and m.issued.is_set()]
        for m in again:
            m.issued.clear()
            for h in m.inner:
                if h.record is not None:
                    h.record.status = "error"  # the old path's copy: left out of the statistics
        queue = self._outbox.setdefault(key, deque())
        queue.extendleft(reversed(again))
        if queue:
            self._start_resender(key)

    def _start_resender(self, key: tuple[int, str]) -> None:
        """Start the re-sender of ``key`` unless one runs (caller holds the lock)."""
        running = self._resenders.get(key)
        if running is None or not running.is_alive():
            name = f"titan_morph-resend-{key[0]}{key[1]}"
            self._resenders[key] = self.router.thread(lambda: self._resender(key), name)

    def _resender(self, key: tuple[int, str]) -> None:
        """Issues the queued sends of ``key`` on the link's current path, oldest first, without holding
        the lock while a send may block (a full ring waits for the peer's consumer)."""
        router, link = self.router, key[0]
        while True:
            with router.lock:
                queue = self._outbox.get(key)
                if not queue or router.closed:
                    self._outbox.pop(key, None)
                    self._resenders.pop(key, None)
                    return
                msg = queue[0]
                path, gen = router.path_of(key), router.gen[link]
                fatal = router.fatal.get(link)
                first = self.stalls.posted(key, path, gen, len(msg.ops)) if fatal is None else -1
            if fatal is not None:
                with router.lock:
                    for m in self._outbox.pop(key, deque()):
                        m.error = LinkFailedError(link, key[1], str(fatal))
                        m.issued.set()
                return
            try:
                handles = router.transport(path).batch_p2p(msg.ops)
            except PATH_ERRORS as e:
                try:
                    router.failed_at(link, path, gen, e)
                except LinkFailedError:
                    pass  # recorded as fatal: the next round fails the queue
                continue
            with router.lock:
                if queue and queue[0] is msg and router.gen[link] == gen:
                    queue.popleft()
                    msg.carry(handles, path, gen, first)

    def _repost(self, key: tuple[int, str], step: int, new: str, gen: int) -> None:
        """Post every receive of ``key`` since ``step`` again on path ``new``, in order: a discard for
        each message already here, the receive itself for each one that is not."""
        transport = self.router.transport(new)
        for r in self._recvs.get(key, []):
            if r.step < step:
                continue
            first = self.stalls.posted(key, new, gen, len(r.ops))
            consumed = r.done
            if not r.settle() and consumed:
                self._unreplayable(key, r)
            if r.done:
                scratch = [torch.empty_like(op.tensor) for op in r.ops]
                ops = [dist.P2POp(dist.irecv, t, r.ops[0].group_peer, r.ops[0].group) for t in scratch]
                self._discards.setdefault(key, deque()).append((r, transport.batch_p2p(ops), scratch, new, gen, first))
            else:
                for h in r.inner:
                    if h.record is not None:
                        h.record.status = "error"
                r.carry(transport.batch_p2p(r.ops), new, gen, first)

    def _unreplayable(self, key: tuple[int, str], r: Recv) -> None:
        """``r`` was handed to the device (NCCL: a stream-ordered wait) and had not run there when its
        path failed: the work queued behind it reads its buffer once the failed group's operations end,
        before any re-sent copy could land. The link is lost for this run (caller holds the lock);
        the discard posted for ``r`` keeps both ends counting the same messages meanwhile."""
        link, d = key
        router = self.router
        err = LinkFailedError(
            link,
            d,
            f"{router.where()}: the receive of step {r.step} on link {link} ({d}) from stage "
            f"{link if d == 'fwd' else link + 1} was handed to the device before the link's default path failed, "
            "and had not run there: the work queued behind it reads its buffer, so it cannot be replayed",
        )
        router.fatal.setdefault(link, err)
        logger.error("titan_morph: %s", err)
        r.done = True  # its data is lost, not awaited: a discard takes the re-sent copy

    def drain_discards(self, key: tuple[int, str], upto: Recv | None) -> None:
        """Consume the discarded copies posted for receives before ``upto`` (all of them when None)."""
        while True:
            with self.router.lock:
                queue = self._discards.get(key)
                if not queue:
                    return
                recv, handles, _, path, gen, first = queue[0]
                if upto is not None:
                    order = {id(r): i for i, r in enumerate(self._recvs.get(key, []))}
                    if order.get(id(recv), -1) > order.get(id(upto), -1):
                        return
                queue.popleft()
            token = self.stalls.begin(key, path, gen, first)
            try:
                for h in handles:
                    h.wait()
            except PATH_ERRORS:
                pass  # the path failed again: its own move re-posts what is needed
            finally:
                self.stalls.end(token)
