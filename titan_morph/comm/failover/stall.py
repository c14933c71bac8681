"""A default path that stalls instead of failing: a broken data path of a
:class:`~titan_morph.comm.failover.transport.FailoverTransport` (paper §5.3: route around a failed link or NIC).

A real broken path (a blackholed route, a dead switch port) raises nothing: gloo's sends and
receives just stall (a small send may even complete into the local socket buffer while the peer
never gets it) until the process group's own timeout, the job's whole ``[comm]`` bound, when the
other ranks' waits expire too. A long wait alone proves nothing, though: a receive also waits while
its sender computes, or while the sender itself waits on a stall further up the pipeline, and
moving every link of the pipeline for one broken path would be wrong.

So the stall is checked with the peer. Both ends number the default-path operations of each
(link, direction) per path generation (the same sequence on both ends). When this rank has waited
``stall_s`` on operation ``n``, the router's watcher asks the peer through the c10d store whether it
has posted its side of ``n`` on the same generation and how long ago (the peer's watcher answers,
whatever its training thread is doing). Both posted at least ``stall_s`` ago and still not complete:
the data path is broken, and the link fails over as after any default-path failure (store notice,
both ends move, the step's traffic replayed over the delegates). A peer that has not posted yet is
busy, not cut off: this rank keeps waiting (and asks again), up to the ``[comm]`` bound. A peer
that does not answer (its process stopped) gives no verdict either: the wait then ends at that bound
with its error naming rank, link and operation.

``stall_s`` is :data:`STALL_FRACTION` of the step's ``[comm]`` bound. The ranks waiting on the
stalled one started their waits no later than the stall did and are bounded by that same timeout:
the failover must be decided and the step finished over the delegates within it, so a quarter
leaves three quarters for the replay and the rest of the step. It has no option of its own: the
peer check removes the false alarms a shorter bound would risk, and a job that wants a faster
failover lowers ``[comm] train_timeout_seconds``, which also bounds how long a stall can last.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from titan_morph.comm.failover.router import PRIMARY, Router
from titan_morph.comm.pairs import LinkFailedError

logger = logging.getLogger(__name__)

__all__ = ["STALL_FRACTION", "StallWatch"]

STALL_FRACTION = 0.25
ASK_AGAIN_S = 1.0  # at most this long before a rank whose peer had not posted asks again
KEEP_POSTS = 4096  # post times kept per (link, direction): far more than a step's messages in flight


@dataclass
class _Wait:
    """A wait in progress on the default path: operation ``first`` of ``key`` at generation ``gen``."""

    key: tuple[int, str]
    gen: int
    first: int
    since: float


@dataclass
class _Ask:
    seq: int
    wait: _Wait
    sent: float
    answered: float = -1.0


class StallWatch:
    """Numbers ``router``'s default-path operations, answers the peer's questions about them and
    moves a link whose wait stalled with both sides posted (see the module docstring)."""

    def __init__(self, router: Router, fraction: float = STALL_FRACTION) -> None:
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"stall fraction must be in (0, 1), got {fraction}")
        self.router, self.fraction = router, fraction
        # key -> (generation, index of times[0], post times): the default-path operations posted
        self._posts: dict[tuple[int, str], tuple[int, int, deque[float]]] = {}
        self._waits: dict[int, _Wait] = {}  # id of the waiter's token -> wait
        self._asks: dict[int, _Ask] = {}  # link -> this rank's latest question
        self._next_seq: dict[int, int] = {}  # link -> this rank's next question number
        self._peer_seq: dict[int, int] = {}  # link -> the peer's next question number to answer
        self._lock = threading.Lock()
        self.stalls = 0  # links moved because of a stall

    @property
    def stall_s(self) -> float:
        return self.fraction * self.router.timeout_s

    def _key(self, link: int, asker: int, seq: int) -> str:
        return f"{self.router.ns}/stall/{link}/{asker}/{seq}"

    # -- the training side ---------------------------------------------------------------------
    def posted(self, key: tuple[int, str], path: str, gen: int, n: int) -> int:
        """``n`` operations of ``key`` posted on ``path`` as of ``gen``: the index of the first on the
        default path (the same on both ends), -1 elsewhere."""
        if path != PRIMARY:
            return -1
        now = time.monotonic()
        with self._lock:
            old = self._posts.get(key)
            if old is None or old[0] != gen:
                old = (gen, 0, deque())
            g, base, times = old
            first = base + len(times)
            times.extend([now] * n)
            while len(times) > KEEP_POSTS:
                times.popleft()
                base += 1
            self._posts[key] = (g, base, times)
        return first

    def begin(self, key: tuple[int, str], path: str, gen: int, first: int) -> object | None:
        """The training thread waits on operation ``first`` of ``key``: a token for :meth:`end`."""
        if path != PRIMARY or first < 0:
            return None
        token = object()
        with self._lock:
            self._waits[id(token)] = _Wait(key, gen, first, time.monotonic())
        return token

    def end(self, token: object | None) -> None:
        if token is not None:
            with self._lock:
                self._waits.pop(id(token), None)

    # -- the watcher's round ------------------------------------------------------------------
    def poll(self) -> None:
        """One round of the router's watcher: answer the peer's questions, ask about long waits, and
        move a link whose wait stalled with both sides posted."""
        store = self.router.store
        for link in self.router.served:
            try:
                self._answer(link)
            except Exception:  # the store is gone (the job is ending)
                logger.debug("titan_morph: stall questions of link %d not read", link, exc_info=True)
        now, stall_s = time.monotonic(), self.stall_s
        with self._lock:
            oldest: dict[int, _Wait] = {}
            for w in self._waits.values():
                if w.key[0] not in oldest or w.since < oldest[w.key[0]].since:
                    oldest[w.key[0]] = w
        for link, w in oldest.items():
            if now - w.since < stall_s:
                continue
            ask = self._asks.get(link)
            try:
                if ask is None or ask.wait is not w or (ask.answered >= 0 and now - ask.answered >= self._again_s()):
                    seq = self._next_seq.get(link, 0)
                    self._next_seq[link] = seq + 1
                    store.set(self._key(link, self.router.stage, seq), f"{w.key[1]}|{w.gen}|{w.first}")
                    self._asks[link] = _Ask(seq, w, now)
                elif ask.answered < 0:
                    reply = f"{self._key(link, self.router.stage, ask.seq)}/re"
                    if store.check([reply]):
                        ask.answered = time.monotonic()
                        self._judge(ask, store.get(reply).decode())
            except LinkFailedError as e:  # no path left: recorded, the training thread raises it
                logger.error("titan_morph: %s", e)
            except Exception:  # the store is gone (the job is ending)
                logger.debug("titan_morph: stall question on link %d failed", link, exc_info=True)

    def _again_s(self) -> float:
        return min(ASK_AGAIN_S, self.stall_s / 4)

    def _answer(self, link: int) -> None:
        """Answer the peer's questions about ``link``: ``generation|posted|age of the asked one``."""
        router, store = self.router, self.router.store
        peer = link + 1 if link == router.stage else link
        while True:
            seq = self._peer_seq.get(link, 0)
            key = self._key(link, peer, seq)
            if not store.check([key]):
                return
            d, gen, first = store.get(key).decode().split("|")
            theirs = (link, d)  # the same (link, direction): the peer's side of the same messages
            with router.lock:
                now_gen = router.gen.get(link, -1)
            with self._lock:
                g, base, times = self._posts.get(theirs, (-1, 0, deque()))
                n = base + len(times) if g == int(gen) == now_gen else 0
                i = int(first) - base
                age = time.monotonic() - times[i] if g == int(gen) and 0 <= i < len(times) else -1.0
            store.set(f"{key}/re", f"{now_gen}|{n}|{age:.6f}")
            self._peer_seq[link] = seq + 1

    def _judge(self, ask: _Ask, reply: str) -> None:
        """Move the link when the peer posted its side of the stalled operation ``stall_s`` ago."""
        gen, posted, age = reply.split("|")
        w, router = ask.wait, self.router
        waited, stall_s = time.monotonic() - w.since, self.stall_s
        if int(gen) != w.gen or int(posted) <= w.first or float(age) < stall_s or waited < stall_s:
            return  # the peer is busy (or moved already): not this link's failure
        link, d = w.key
        peer = link + 1 if link == router.stage else link
        op = "send to" if (d == "fwd") == (link == router.stage) else "receive from"
        err = LinkFailedError(
            link,
            d,
            f"{router.where()}: {op} stage {peer} on link {link} ({d}) made no progress on the link's default "
            f"path for {waited:.3g} s although stage {peer} had posted its side {float(age):.3g} s before "
            f"(stall bound {stall_s:.3g} s = {self.fraction:g} x the [comm] timeout): the data path is broken",
        )
        with router.lock:
            if router.gen.get(link) != w.gen:
                return
            self.stalls += 1
        logger.warning("titan_morph: %s", err)
        router.failed_at(link, PRIMARY, w.gen, err)
