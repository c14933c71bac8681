"""``[morph] transport = "auto"``: the default path per link, the delegated path when told or when a
path fails, without restart and without losing or reordering a message (paper §5.3: a failed
link/NIC is routed around via the delegates instead of crashing training).

:class:`FailoverTransport` routes each (link, direction) through ``primary`` (the default path:
per-link process groups, :mod:`titan_morph.comm.pairs`, possibly under the link emulator) or
``delegate`` (a :class:`~titan_morph.comm.delegate.transport.DelegateTransport`).

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
* A default path that stalls instead of failing (a broken data path: a blackholed route raises
  nothing, its sends may even complete into the local socket buffer) fails the same way: a wait on
  it that made no progress for a quarter of the ``[comm]`` bound while the peer had posted its side
  (asked through the store) is the link's failure; a peer that had not posted is busy, not cut off
  (:mod:`~titan_morph.comm.failover.stall`).
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

import threading
from collections.abc import Iterable

import torch.distributed as dist
from torch._C._distributed_c10d import Store

from titan_morph.comm.delegate.transport import DelegateTransport
from titan_morph.comm.failover.probe import PROBE_JOIN_S, Prober
from titan_morph.comm.failover.resend import DefaultPathWaits, Message, Recv, Resender
from titan_morph.comm.failover.router import PATH_ERRORS, Router
from titan_morph.comm.failover.stall import STALL_FRACTION, StallWatch
from titan_morph.comm.pairs import LinkGroups
from titan_morph.comm.records import MessageRecord, close_at_exit
from titan_morph.comm.timeouts import DEFAULT_TIMEOUTS, CommTimeouts
from titan_morph.comm.transport import P2P, Handle, RateProbeable, Transport, group_by_link
from titan_morph.pipelining.core.links import LinkModel

__all__ = ["PATH_ERRORS", "FailoverTransport"]


class FailoverTransport(Transport):
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
        stall_fraction: a default-path wait that stalls this fraction of the ``[comm]`` bound while
            the peer has posted its side is the link's failure (:mod:`~titan_morph.comm.failover.stall`).
        store: the c10d store of the notices (default: the default group's).
    """

    name = "auto"
    exit_timeout_s = 2.0  # bound of the close at interpreter exit (a prober inside a probe: PROBE_JOIN_S)

    def __init__(
        self,
        primary: Transport,
        delegate: DelegateTransport,
        *,
        pairs: LinkGroups | None = None,
        stage: int,
        num_stages: int,
        group: dist.ProcessGroup | None = None,
        timeouts: CommTimeouts = DEFAULT_TIMEOUTS,
        recover_probes: int = 5,
        probe_interval_s: float = 1.0,
        stall_fraction: float = STALL_FRACTION,
        store: Store | None = None,
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
        self.links: LinkModel | None = primary.links  # the link model predictions and metrics use
        self.depth = primary.depth
        self.pairs, self.timeouts = pairs, timeouts
        pipeline = group if group is not None else dist.group.WORLD
        assert pipeline is not None, "torch.distributed must be initialized"
        self._group_name = pipeline.group_name
        self.router = Router(
            primary,
            delegate,
            stage=stage,
            num_stages=num_stages,
            rank=self.rank,
            group_name=self._group_name,
            store=store if store is not None else dist.distributed_c10d._get_default_store(),
            pairs=pairs,
            timeouts=timeouts,
        )
        self.stalls = StallWatch(self.router, stall_fraction)
        gloo = pairs is not None and pairs.backend == "gloo"  # see DefaultPathWaits
        self.resender = Resender(self.router, self.stalls, DefaultPathWaits(self.router) if gloo else None)
        self.prober = Prober(self.router, pairs, recover_probes, probe_interval_s)
        self.router.replay, self.router.probe = self.resender.replay, self.prober.start
        self.router.on_round = self.stalls.poll
        delegate.add_listener(self.router.on_delegate_failure)
        self._watcher = self.router.thread(self.router.watch, "titan_morph-failover-watch")
        close_at_exit(self)

    # -- the Transport protocol (routes, moves and their log: ``self.router``) ---------------------
    @property
    def failovers(self) -> int:
        return self.router.failovers

    @property
    def timeout_s(self) -> float:
        return self.router.timeout_s

    def where(self) -> str:
        return self.router.where()

    def now_ms(self) -> float:
        return self.primary.now_ms()

    def set_step(self, step: int) -> None:
        """Before step ``step``: forget messages older than the previous step, apply due moves back."""
        self.resender.drain_all()
        with self.router.lock:
            self.router.step = int(step)
            self.resender.forget_before(step)
        self.primary.set_step(step)
        self.delegate.set_step(step)
        self.prober.move_back_due(step)

    def hint_issue(self, t_s: float, max_early_ms: float = 2.0) -> None:
        self.primary.hint_issue(t_s, max_early_ms)
        self.delegate.hint_issue(t_s, max_early_ms)

    def delegated(self) -> frozenset[int]:
        return frozenset(link for link, _ in self.router.routed)

    def switch(self, links: Iterable[int]) -> None:
        """Move both directions of ``links`` to the delegates; call between steps on every rank. A link
        whose delegates failed (on either rank: the two agree through the store) stays."""
        self.router.switch(links)

    def restore(self, links: Iterable[int]) -> None:
        """Move ``links`` that :meth:`switch` delegated back to the default path (a recovered straggler);
        call between steps on every rank. Directions moved by a failure stay until probes succeed."""
        self.router.restore(links)

    def rate_probe_path(self, link: int) -> P2P | None:
        """The primary's path of ``link`` while the link is on it (a delegated link's messages
        take the delegates, which stamp arrivals themselves)."""
        if link in self.delegated() or not isinstance(self.primary, RateProbeable):
            return None
        return self.primary.rate_probe_path(link)

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
            kind = Message if send else Recv
            msg = kind(self.resender, (link, d), self.router.step, mops)
            self._issue(msg, send, desc)
            handles.append(msg)
        return handles

    def _issue(self, msg: Message, send: bool, desc: str | None = None) -> None:
        router, link = self.router, msg.key[0]
        with router.lock:
            router.raise_fatal(link)
            if self.resender.keep(msg):  # a re-send is under way: queued behind it
                return
            path, gen = router.path_of(msg.key), router.gen.get(link, 0)
            first = self.stalls.posted(msg.key, path, gen, len(msg.ops))
        handles: list[Handle] | None = None
        try:
            handles = router.transport(path).batch_p2p(msg.ops, desc)
        except PATH_ERRORS as e:  # refused at issue (the emulator's down link, a failed delegate)
            router.failed_at(link, path, gen, e)
        with router.lock:
            if msg.issued.is_set():
                return  # a move re-posted this receive on the new path meanwhile
            if handles is not None and router.gen.get(link, 0) == gen:
                msg.carry(handles, path, gen, first)
                return
            # the link moved while this was issued (or its path refused it): the new path carries it
            router.raise_fatal(link)
            if send:
                self.resender.queue(msg)
            else:
                path, gen = router.path_of(msg.key), router.gen[link]
                first = self.stalls.posted(msg.key, path, gen, len(msg.ops))
                msg.carry(router.transport(path).batch_p2p(msg.ops, desc), path, gen, first)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self, timeout: float | None = None, drain: bool = True) -> None:
        router = self.router
        with router.lock:
            if router.closed:
                return
            router.closed = True
            router.wake.notify_all()
            for hook in router.on_move:
                hook(None)
        close_at_exit(self, closing=True)
        try:
            self.primary.close(timeout, drain)
        finally:
            self.delegate.close(timeout, drain)
        for t in router.threads:
            if t is not threading.current_thread():
                # a prober may be inside one probe's group creation (C++, bounded): let it finish, so
                # that no thread is inside torch.distributed when the process groups are destroyed
                probe = t.name.startswith("titan_morph-probe")
                t.join(max(PROBE_JOIN_S, self.timeouts.train_s) if probe else 2.0)

    def __enter__(self) -> FailoverTransport:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(drain=exc_type is None)
