"""``[morph] transport = "auto"``: the default path per link, the delegated path when told or when a
path fails, without restart and without losing or reordering a message (paper §5.3: a failed
link/NIC is routed around via the delegates instead of crashing training).

:class:`FailoverTransport` routes each (link, direction) through ``primary`` (the default path:
per-link process groups, :mod:`titan_morph.comm.pairs`, possibly under the link emulator) or
``delegate`` (a :class:`~titan_morph.comm.delegate.DelegateTransport`).

* Told (``switch`` / ``restore``): between steps, on every rank, both directions of a link move.
  Nothing is in flight then. A link whose delegates failed stays on the default path: the two
  ranks of the link agree on that through the store before moving.
* A path fails mid-step (the default path: a process-group error or timeout, or the emulator's
  ``inf``; the delegated path: a delegate died): every direction of that link on the failed path
  moves to the other one, on both ranks, at once. The rank that notices first tears the failed
  default-path group down (so the peer's pending operations on it fail too) and posts a notice in
  the c10d store that a watcher thread on the peer picks up, so the peer moves even when it does
  not touch the link. Both ranks then replay the link's traffic of the failed step (``s``, in the
  notice) on the new path, in order: the sender re-sends every message it sent on that
  (link, direction) since step ``s`` began (it keeps references to their tensors for the current
  and the previous step); the receiver posts, for each receive since then, either a discard (the
  message was already here) or the receive itself again (it was not). Both sides count the same
  messages in the same order (every message of a step is matched within the step), so the new
  path carries the same sequence on both ends, with no message lost, duplicated or reordered.
  A message re-sent over the new path has the same bytes as the original.
* After the default path failed, a prober thread per link makes a fresh 2-rank group every
  ``probe_interval_s`` and exchanges a tensor on it (both ranks, results agreed through the
  store). After ``recover_probes`` good probes in a row the link moves back to the default path at
  a step boundary both ranks name in advance (the lower rank posts step + 2; ranks are within one
  step of each other, because every step ends with a collective). A default path under the link
  emulator is not probed (its ``inf`` is the model's, not a real failure): it stays delegated.
* A delegate that dies while its link runs on the default path is reported and the link stays
  there (a later ``switch`` of it is refused on both ranks). No path left (both failed) is one
  error naming both failures.

Each move to the delegates after a failure is counted (``failovers``, per (link, direction)) and
logged. Records: :meth:`take_records` returns both paths' records, each naming its ``path``.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from datetime import timedelta

import torch
import torch.distributed as dist

from titan_morph.comm.delegate import DelegateError, DelegateTransport
from titan_morph.comm.pairs import LinkFailedError, LinkGroups, PairGroup
from titan_morph.comm.records import CommTimeoutError, MessageBook, MessageRecord, close_at_exit
from titan_morph.comm.timeouts import DEFAULT_TIMEOUTS, CommTimeouts
from titan_morph.comm.transport import Handle, Transport, group_by_link
from titan_morph.pipelining.links import LinkDownError

logger = logging.getLogger(__name__)

__all__ = ["PATH_ERRORS", "FailoverTransport"]

PRIMARY, DELEGATE = "default", "delegate"
PATH_ERRORS = (LinkDownError, LinkFailedError, DelegateError)
STORE_PREFIX = "titan_morph/failover"
WATCH_S = 0.1  # how often the watcher looks for the peer's notices
SETTLE_S = 0.05  # how long a receive on a failed path may take to show it is complete
# bound of each of a probe's two waits: making the group and exchanging on it; the peer's verdict
PROBE_TIMEOUT_S = 5.0
_instances = itertools.count()


def _directions(link: int, stage: int) -> dict[str, bool]:
    """The directions of ``link`` and whether this stage sends them."""
    return {"fwd": link == stage, "bwd": link != stage}


class _Message:
    """A pipeline message through the failover transport: its (link, direction), the step it belongs
    to, its ops and the handles of the path that carries it now (``path``, as of ``gen``)."""

    due_s = None

    def __init__(self, owner: FailoverTransport, key: tuple[int, str], step: int, ops: list[dist.P2POp]) -> None:
        self.owner, self.key, self.step, self.ops = owner, key, step, ops
        self.inner: list[Handle] = []
        self.path = ""
        self.gen = -1
        self.issued = threading.Event()
        self.done = False
        self.error: BaseException | None = None

    @property
    def record(self) -> MessageRecord | None:
        return self.inner[0].record if self.inner else None

    def carry(self, handles: list[Handle], path: str, gen: int) -> None:
        self.inner, self.path, self.gen = handles, path, gen
        self.issued.set()

    def is_completed(self) -> bool:
        return self.done

    def wait(self, timeout: float | None = None) -> bool:
        owner = self.owner
        bound = owner.timeout_s if timeout is None else timeout
        deadline = time.monotonic() + bound
        while not self.done:
            if not self.issued.wait(max(0.0, deadline - time.monotonic())):
                link, d = self.key
                raise CommTimeoutError(
                    f"{owner.where()}: message of step {self.step} on link {link} ({d}) was not re-issued on its "
                    f"new path within {bound:.3g} s"
                )
            if self.error is not None:
                raise self.error
            with owner._lock:
                handles, gen, path = self.inner, self.gen, self.path
            try:
                for h in handles:
                    h.wait(max(1e-3, deadline - time.monotonic()))
            except PATH_ERRORS as e:
                owner._path_failed_at(self.key[0], path, gen, e)  # raises when no path is left
                continue
            if not self._before_done(gen):
                continue  # moved while we waited: the new path also delivers (the same bytes), wait for it
        return True

    def _before_done(self, gen: int) -> bool:
        with self.owner._lock:
            if self.gen != gen:
                return False
            self.done = True
            return True


class _Recv(_Message):
    def wait(self, timeout: float | None = None) -> bool:
        self.owner._drain_discards(self.key, self)
        return super().wait(timeout)

    def settle(self) -> bool:
        """Whether this receive's data is already here on its (failed) path, without waiting for it."""
        if self.done:
            return True
        if not self.issued.is_set():
            return False
        try:
            for h in self.inner:
                h.wait(SETTLE_S)
        except Exception:
            return False
        self.done = True
        return True


class FailoverTransport:
    """Per-(link, direction) routing between a default ``primary`` and a ``delegate`` transport.

    Args:
        primary: the default path (``LinkTransport`` on per-link groups, possibly wrapped by the
            recorder or the link emulator; any transport works, real failures of a non-emulated
            primary on ``pairs`` are re-probed).
        delegate: the delegated path (built with ``strict=False``: a failure is per link).
        stage, num_stages, group: this rank's stage and the pipeline (one stage per rank).
        pairs: the per-link groups under ``primary`` (None: the primary cannot be re-made).
        timeouts: bound of every wait (TorchTitan's ``[comm]`` timeouts).
        recover_probes: good probes in a row before a failed default path is used again
            (``[morph] recover_consecutive``); probe_interval_s: seconds between probes.
        store: the c10d store of the notices (default: the default group's).
    """

    name = "auto"
    exit_timeout_s = 2.0  # bound of the close at interpreter exit (a prober inside a probe: PROBE_TIMEOUT_S)

    def __init__(
        self,
        primary: Transport,
        delegate: DelegateTransport,
        *,
        stage: int,
        num_stages: int,
        group: dist.ProcessGroup | None = None,
        pairs: LinkGroups | None = None,
        timeouts: CommTimeouts = DEFAULT_TIMEOUTS,
        recover_probes: int = 5,
        probe_interval_s: float = 1.0,
        store: dist.Store | None = None,
    ) -> None:
        if primary.epoch != delegate.epoch:
            raise ValueError(
                f"FailoverTransport: primary and delegate must share one epoch (records' t=0), got "
                f"{primary.epoch} and {delegate.epoch}"
            )
        if recover_probes < 1:
            raise ValueError(f"recover_probes must be >= 1, got {recover_probes}")
        self.primary, self.delegate = primary, delegate
        self.stage, self.num_stages = stage, num_stages
        self.rank = dist.get_rank()
        self.epoch = primary.epoch
        self.links = primary.links  # the link model predictions and metrics use
        self.depth = primary.depth
        self.pairs, self.timeouts = pairs, timeouts
        self.recover_probes, self.probe_interval_s = recover_probes, probe_interval_s
        self.routed: set[tuple[int, str]] = set()  # (link, direction) on the delegates
        self.switched: set[tuple[int, str]] = set()  # delegated by switch() (not by a failure)
        self.failovers = 0
        self.fallbacks = 0  # (link, direction) moved back to the default path because a delegate failed
        self.failover_log: list[tuple[int, int, str, str]] = []  # (step, link, direction, why)
        self.step = 0
        self._lock = threading.RLock()
        self._group_name = (group if group is not None else dist.group.WORLD).group_name
        self._store = store if store is not None else dist.distributed_c10d._get_default_store()
        self._ns = f"{STORE_PREFIX}/{self._group_name}/{next(_instances)}"
        self._served = [link for link in (stage - 1, stage) if 0 <= link < num_stages - 1]
        self._gen = dict.fromkeys(self._served, 0)  # path changes of each link so far (equal on both ends)
        self._sends: dict[tuple[int, str], list[_Message]] = {}  # this and the previous step's, in order
        self._recvs: dict[tuple[int, str], list[_Recv]] = {}
        self._outbox: dict[tuple[int, str], deque[_Message]] = {}  # sends waiting for the re-sender
        self._resenders: dict[tuple[int, str], threading.Thread] = {}
        self._discards: dict[tuple[int, str], deque[tuple[_Recv, list[Handle], list[torch.Tensor]]]] = {}
        self._primary_broken: dict[int, str] = {}
        self._delegate_dead: dict[int, str] = {}
        self._fatal: dict[int, BaseException] = {}
        self._events: list[tuple[int, str, int, str]] = []  # delegate failures heard by the reader thread
        self._ready: dict[int, tuple[int, PairGroup]] = {}  # link -> (probe attempt, group): probes agreed
        self._closed = False
        self._wake = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        delegate.add_listener(self._on_delegate_failure)
        self._watcher = self._thread(self._watch, "titan_morph-failover-watch")
        close_at_exit(self)

    # -- the Transport protocol --------------------------------------------------------------
    @property
    def timeout_s(self) -> float:
        return self.timeouts.for_step(self.step)

    def where(self) -> str:
        return f"stage {self.stage} (rank {self.rank})"

    def now_ms(self) -> float:
        return self.primary.now_ms()

    def set_step(self, step: int) -> None:
        """Before step ``step``: forget messages older than the previous step, apply due moves back."""
        for key in list(self._discards):
            self._drain_discards(key, None)
        with self._lock:
            self.step = int(step)
            for table in (self._sends, self._recvs):
                for key, msgs in table.items():
                    table[key] = [m for m in msgs if m.step >= step - 1]  # type: ignore[assignment]
        self.primary.set_step(step)
        self.delegate.set_step(step)
        self._move_back_due(step)

    def hint_issue(self, t_s: float, max_early_ms: float = 2.0) -> None:
        self.primary.hint_issue(t_s, max_early_ms)
        self.delegate.hint_issue(t_s, max_early_ms)

    def delegated(self) -> frozenset[int]:
        return frozenset(link for link, _ in self.routed)

    def switch(self, links: Iterable[int]) -> None:
        """Move both directions of ``links`` to the delegates; call between steps on every rank. A link
        whose delegates failed (on either rank: the two agree through the store) stays."""
        for link in links:
            self._check_link(link)
            if link in self._served and not self._delegates_usable(link):
                continue
            with self._lock:
                moved = False
                for d in ("fwd", "bwd"):
                    if (link, d) not in self.routed:
                        self.switched.add((link, d))
                        self.routed.add((link, d))
                        moved = True
                if moved and link in self._gen:
                    self._gen[link] += 1

    def restore(self, links: Iterable[int]) -> None:
        """Move ``links`` that :meth:`switch` delegated back to the default path (a recovered straggler);
        call between steps on every rank. Directions moved by a failure stay until probes succeed."""
        for link in links:
            self._check_link(link)
            with self._lock:
                moved = False
                for d in ("fwd", "bwd"):
                    if (link, d) in self.switched:
                        self.switched.discard((link, d))
                        self.routed.discard((link, d))
                        moved = True
                if moved and link in self._gen:
                    self._gen[link] += 1

    def _check_link(self, link: int) -> None:
        if not 0 <= link < self.num_stages - 1:
            raise ValueError(f"link must be in 0..{self.num_stages - 2}, got {link}")

    def records(self) -> list[MessageRecord]:
        """Snapshot (copies) of the primary's and the delegate's message records; see ``path``."""
        return self.primary.records() + self.delegate.records()

    def take_records(self) -> list[MessageRecord]:
        """The primary's and the delegate's records so far, then forget them (per-step metrics)."""
        return self.primary.take_records() + self.delegate.take_records()

    def blocked_ms(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for t in (self.primary, self.delegate):
            for link, ms in t.blocked_ms().items():
                out[link] = out.get(link, 0.0) + ms
        return out

    # -- issue path ---------------------------------------------------------------------------
    def _transport(self, path: str) -> Transport:
        return self.delegate if path == DELEGATE else self.primary

    def _path_of(self, key: tuple[int, str]) -> str:
        return DELEGATE if key in self.routed else PRIMARY

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        ops = list(ops)
        mine = [op for op in ops if op.group.group_name == self._group_name]
        others = [op for op in ops if op.group.group_name != self._group_name]
        handles: list[Handle] = self.primary.batch_p2p(others, desc) if others else []
        if not mine:
            return handles
        messages = group_by_link(mine, self.stage, self.num_stages)
        # receives first (they never block), then sends, as every transport issues a batch
        for (link, d, send), mops in sorted(messages.items(), key=lambda kv: kv[0][2]):
            kind = _Message if send else _Recv
            msg = kind(self, (link, d), self.step, mops)
            self._issue(msg, send, desc)
            handles.append(msg)
        return handles

    def _issue(self, msg: _Message, send: bool, desc: str | None = None) -> None:
        link = msg.key[0]
        with self._lock:
            self._raise_fatal(link)
            (self._sends if send else self._recvs).setdefault(msg.key, []).append(msg)  # type: ignore[arg-type]
            if send and self._outbox.get(msg.key):  # a re-send is under way: queue behind it
                self._outbox[msg.key].append(msg)
                return
            path, gen = self._path_of(msg.key), self._gen.get(link, 0)
        handles: list[Handle] | None = None
        try:
            handles = self._transport(path).batch_p2p(msg.ops, desc)
        except PATH_ERRORS as e:  # refused at issue (the emulator's down link, a failed delegate)
            self._path_failed_at(link, path, gen, e)
        with self._lock:
            if msg.issued.is_set():
                return  # a move re-posted this receive on the new path meanwhile
            if handles is not None and self._gen.get(link, 0) == gen:
                msg.carry(handles, path, gen)
                return
            # the link moved while this was issued (or its path refused it): the new path carries it
            self._raise_fatal(link)
            if send:
                self._outbox.setdefault(msg.key, deque()).append(msg)
                self._start_resender(msg.key)
            else:
                path = self._path_of(msg.key)
                msg.carry(self._transport(path).batch_p2p(msg.ops, desc), path, self._gen[link])

    # -- failures ----------------------------------------------------------------------------
    def _raise_fatal(self, link: int) -> None:
        err = self._fatal.get(link)
        if err is not None:
            raise LinkFailedError(link, "", str(err))

    def _path_failed_at(self, link: int, path: str, gen: int, error: BaseException) -> None:
        """An operation on ``link``'s ``path`` (issued as of ``gen``) failed: move the link, unless that
        happened since; raise when no path is left."""
        with self._lock:
            if self._gen.get(link, 0) != gen:
                return  # handled since: the message was re-issued on the new path
            self._move(link, path, self.step, f"{type(error).__name__}: {error}", notify=True)

    def _on_delegate_failure(self, link: int, direction: str, error: DelegateError) -> None:
        """From the delegates' reader thread: a delegate of ``link`` failed (this rank's or its peer)."""
        with self._lock:
            self._delegate_dead.setdefault(link, str(error))
            if any(self._path_of((link, d)) == DELEGATE for d in ("fwd", "bwd")):
                self._events.append((link, DELEGATE, self.step, str(error)))
                self._wake.notify_all()

    def _notice_key(self, link: int, gen: int) -> str:
        return f"{self._ns}/fail/{link}/{gen}"

    def _move(self, link: int, failed: str, step: int, why: str, *, notify: bool) -> None:
        """Move every direction of ``link`` on path ``failed`` to the other path, replaying the link's
        traffic since step ``step`` began (see the module docstring). Caller holds the lock."""
        if link in self._fatal:
            raise LinkFailedError(link, "", str(self._fatal[link]))
        dirs = [d for d in ("fwd", "bwd") if self._path_of((link, d)) == failed]
        if not dirs or link not in self._gen:
            return
        new = PRIMARY if failed == DELEGATE else DELEGATE
        gone = self._primary_broken.get(link) if new == PRIMARY else self._delegate_dead.get(link)
        if gone is not None:
            err = LinkFailedError(
                link,
                dirs[0],
                f"{self.where()}: link {link} has no path left: its {failed} path failed at step {step} ({why}), "
                f"and its {new} path had failed before ({gone})",
            )
            self._fatal[link] = err
            raise err
        if notify:
            try:
                self._store.set(self._notice_key(link, self._gen[link]), f"{failed}|{step}|{why[:500]}")
            except Exception:  # the peer still finds out from its own failed operations
                logger.exception("titan_morph: could not post the failure notice of link %d", link)
        if failed == PRIMARY:
            self._primary_broken[link] = why
            if self.pairs is not None:
                self.pairs.break_link(link, why)
        else:
            self._delegate_dead.setdefault(link, why)
            self.delegate.abandon(link, why)
        self._gen[link] += 1
        gen = self._gen[link]
        sends = _directions(link, self.stage)
        for d in dirs:
            key = (link, d)
            if new == DELEGATE:
                self.routed.add(key)
                self.failovers += 1
            else:
                self.routed.discard(key)
                self.fallbacks += 1
            self.switched.discard(key)
            self.failover_log.append((self.step, link, d, why))
            logger.warning(
                "titan_morph: link %d (%s) failed on its %s path at step %d on %s; moving it to the %s path (%s)",
                link,
                d,
                failed,
                step,
                self.where(),
                new,
                why,
            )
            if sends[d]:
                self._resend(key, step)
            else:
                self._repost(key, step, new, gen)
        if failed == PRIMARY and self._probeable():
            self._thread(lambda: self._probe(link, gen), f"titan_morph-probe-link{link}")

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
            self._resenders[key] = self._thread(lambda: self._resender(key), f"titan_morph-resend-{key[0]}{key[1]}")

    def _resender(self, key: tuple[int, str]) -> None:
        """Issues the queued sends of ``key`` on the link's current path, oldest first, without holding
        the lock while a send may block (a full ring waits for the peer's consumer)."""
        link = key[0]
        while True:
            with self._lock:
                queue = self._outbox.get(key)
                if not queue or self._closed:
                    self._outbox.pop(key, None)
                    self._resenders.pop(key, None)
                    return
                msg = queue[0]
                path, gen = self._path_of(key), self._gen[link]
                fatal = self._fatal.get(link)
            if fatal is not None:
                with self._lock:
                    for m in self._outbox.pop(key, deque()):
                        m.error = LinkFailedError(link, key[1], str(fatal))
                        m.issued.set()
                return
            try:
                handles = self._transport(path).batch_p2p(msg.ops)
            except PATH_ERRORS as e:
                try:
                    self._path_failed_at(link, path, gen, e)
                except LinkFailedError:
                    pass  # recorded as fatal: the next round fails the queue
                continue
            with self._lock:
                if queue and queue[0] is msg and self._gen[link] == gen:
                    queue.popleft()
                    msg.carry(handles, path, gen)

    def _repost(self, key: tuple[int, str], step: int, new: str, gen: int) -> None:
        """Post every receive of ``key`` since ``step`` again on path ``new``, in order: a discard for
        each message already here, the receive itself for each one that is not."""
        transport = self._transport(new)
        for r in self._recvs.get(key, []):
            if r.step < step:
                continue
            if r.settle():
                scratch = [torch.empty_like(op.tensor) for op in r.ops]
                ops = [dist.P2POp(dist.irecv, t, r.ops[0].group_peer, r.ops[0].group) for t in scratch]
                self._discards.setdefault(key, deque()).append((r, transport.batch_p2p(ops), scratch))
            else:
                for h in r.inner:
                    if h.record is not None:
                        h.record.status = "error"
                r.carry(transport.batch_p2p(r.ops), new, gen)

    def _drain_discards(self, key: tuple[int, str], upto: _Recv | None) -> None:
        """Consume the discarded copies posted for receives before ``upto`` (all of them when None)."""
        while True:
            with self._lock:
                queue = self._discards.get(key)
                if not queue:
                    return
                recv, handles, _ = queue[0]
                if upto is not None:
                    order = {id(r): i for i, r in enumerate(self._recvs.get(key, []))}
                    if order.get(id(recv), -1) > order.get(id(upto), -1):
                        return
                queue.popleft()
            for h in handles:
                try:
                    h.wait()
                except PATH_ERRORS:
                    pass  # the path failed again: its own move re-posts what is needed

    # -- the watcher, the prober ----------------------------------------------------------
    def _thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        t = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(t)
        t.start()
        return t

    def _watch(self) -> None:
        """Moves links on the peer's notices and on delegate failures, even while the training thread
        is busy elsewhere (its peer may be waiting for this rank's re-sent messages)."""
        while True:
            with self._lock:
                if self._closed:
                    return
                events, self._events = self._events, []
                gens = dict(self._gen)
            for link, path, step, why in events:
                with self._lock:
                    try:
                        self._move(link, path, step, why, notify=True)
                    except LinkFailedError as e:
                        logger.error("titan_morph: %s", e)
            pause = WATCH_S
            for link, gen in gens.items():
                key = self._notice_key(link, gen)
                try:
                    if not self._store.check([key]):
                        continue
                    path, step, why = self._store.get(key).decode().split("|", 2)
                except Exception:  # the store is gone (the job is ending): look again later
                    pause = 2.0
                    continue
                with self._lock:
                    if self._gen[link] == gen:
                        try:
                            self._move(link, path, int(step), f"the peer's notice: {why}", notify=False)
                        except LinkFailedError as e:
                            logger.error("titan_morph: %s", e)
            with self._lock:
                if not self._closed and not self._events:
                    self._wake.wait(pause)

    def _probeable(self) -> bool:
        return self.pairs is not None and self.primary.links is None

    def _probe(self, link: int, gen: int) -> None:
        """Probe ``link``'s default path until ``recover_probes`` agreed good probes in a row."""
        assert self.pairs is not None
        peer = link + 1 if link == self.stage else link
        good, attempt, kept = 0, 0, None
        timeout = min(PROBE_TIMEOUT_S, self.timeouts.train_s)
        while True:
            time.sleep(self.probe_interval_s)
            with self._lock:
                if self._closed or self._gen[link] != gen or link in self._fatal:
                    return
            attempt += 1
            group = self.pairs.probe(link, f"{gen}.{attempt}", timeout)
            with self._lock:
                if self._closed:  # the peer may be gone: do not wait for its verdict
                    if group is not None:
                        group.break_("transport closed")
                    return
            base = f"{self._ns}/probe/{link}/{gen}/{attempt}"
            try:
                self._store.set(f"{base}/{self.stage}", "1" if group is not None else "0")
                client = self._store.clone()
                client.set_timeout(timedelta(seconds=timeout))
                theirs = client.get(f"{base}/{peer}").decode() == "1"
            except Exception:
                theirs = False
            ok = group is not None and theirs
            if not ok and group is not None:
                group.break_("probe not agreed")
            good = good + 1 if ok else 0
            if ok:
                if kept is not None:
                    kept.break_("superseded by a later probe")
                kept = group
            if good >= self.recover_probes:
                with self._lock:
                    if self._gen[link] == gen:
                        self._ready[link] = (attempt, kept)  # type: ignore[assignment]
                if link == self.stage:  # the lower rank names the step both move back at
                    self._store.set(f"{self._ns}/back/{link}/{gen}", f"{self.step + 2}:{attempt}")
                logger.warning(
                    "titan_morph: link %d: default path good again (%d probes in a row); moving back",
                    link,
                    good,
                )
                return

    def _move_back_due(self, step: int) -> None:
        """At a step boundary: move links whose default path probed good back to it, at the step the
        lower rank named (both ranks)."""
        for link, (attempt, group) in list(self._ready.items()):
            gen = self._gen[link]
            key = f"{self._ns}/back/{link}/{gen}"
            try:
                if not self._store.check([key]):
                    continue
                at, named = map(int, self._store.get(key).decode().split(":"))
            except Exception:
                continue
            if step < at or named != attempt:
                continue
            with self._lock:
                self._ready.pop(link, None)
                assert self.pairs is not None
                self.pairs.replace(link, group)
                self._primary_broken.pop(link, None)
                for d in ("fwd", "bwd"):
                    self.routed.discard((link, d))
                    self.switched.discard((link, d))
                self._gen[link] += 1
                if isinstance(self.primary, MessageBook):
                    self.primary.restart_numbering(link)
            logger.warning("titan_morph: link %d is back on its default path from step %d on", link, step)

    def _delegates_usable(self, link: int) -> bool:
        """Both ranks of ``link`` agree (through the store) whether its delegates still work."""
        with self._lock:
            mine = link not in self._delegate_dead and link not in self._fatal
            gen = self._gen[link]
        peer = link + 1 if link == self.stage else link
        base = f"{self._ns}/switch/{link}/{gen}"
        self._store.set(f"{base}/{self.stage}", "1" if mine else "0")
        client = self._store.clone()
        client.set_timeout(timedelta(seconds=self.timeout_s))
        theirs = client.get(f"{base}/{peer}").decode() == "1"
        if not (mine and theirs):
            logger.warning("titan_morph: link %d stays on its default path: its delegates failed earlier", link)
        return mine and theirs

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self, timeout: float | None = None, drain: bool = True) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake.notify_all()
        close_at_exit(self, closing=True)
        try:
            self.primary.close(timeout, drain)
        finally:
            self.delegate.close(timeout, drain)
        for t in self._threads:
            if t is not threading.current_thread():
                # a prober may be inside one probe's group creation (C++, bounded): let it finish, so
                # that no thread is inside torch.distributed when the process groups are destroyed
                t.join(PROBE_TIMEOUT_S + 1.0 if t.name.startswith("titan_morph-probe") else 2.0)

    def __enter__(self) -> FailoverTransport:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(drain=exc_type is None)
