"""Which path carries each (link, direction) of a :class:`~titan_morph.comm.failover.transport.FailoverTransport`
now, and the moves between the two paths (told, or after a failure; see that module's docstring).

A move bumps the link's generation (equal on both ends) and hands each moved direction to the
``replay`` hook (the re-sender re-issues its traffic of the failed step on the new path); a failed
default path goes to the ``probe`` hook. A failure notice in the c10d store moves the peer too: the
watcher thread reads the peer's notices and the delegates' failure reports.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable
from datetime import timedelta

from torch._C._distributed_c10d import Store

from titan_morph.comm.delegate.transport import DelegateError, DelegateTransport
from titan_morph.comm.pairs import LinkFailedError, LinkGroups
from titan_morph.comm.timeouts import CommTimeouts
from titan_morph.comm.transport import Transport
from titan_morph.pipelining.core.links import LinkDownError

logger = logging.getLogger(__name__)

__all__ = ["DELEGATE", "PATH_ERRORS", "PRIMARY", "Router", "directions"]

PRIMARY, DELEGATE = "default", "delegate"
PATH_ERRORS = (LinkDownError, LinkFailedError, DelegateError)
STORE_PREFIX = "titan_morph/failover"
WATCH_S = 0.1  # how often the watcher looks for the peer's notices
# Module-level: the store namespace of the n-th transport built in this process must match on every rank.
_instances = itertools.count()

Replay = Callable[[tuple[int, str], bool, int, str, int], None]
"""``replay(key, sends, step, new_path, gen)``: re-issue ``key``'s traffic since ``step`` on ``new_path``."""


def directions(link: int, stage: int) -> dict[str, bool]:
    """The directions of ``link`` and whether this stage sends them."""
    return {"fwd": link == stage, "bwd": link != stage}


class Router:
    """The path of each (link, direction), the moves, the failure notices and the watcher thread.

    ``lock`` guards the state of every part of the failover transport (re-sender and prober too).
    """

    def __init__(
        self,
        primary: Transport,
        delegate: DelegateTransport,
        *,
        stage: int,
        num_stages: int,
        rank: int,
        group_name: str,
        store: Store,
        pairs: LinkGroups | None,
        timeouts: CommTimeouts,
    ) -> None:
        self.primary, self.delegate = primary, delegate
        self.stage, self.num_stages, self.rank = stage, num_stages, rank
        self.pairs, self.timeouts, self.store = pairs, timeouts, store
        self.ns = f"{STORE_PREFIX}/{group_name}/{next(_instances)}"
        self.routed: set[tuple[int, str]] = set()  # (link, direction) on the delegates
        self.switched: set[tuple[int, str]] = set()  # delegated by switch() (not by a failure)
        self.failovers = 0
        self.fallbacks = 0  # (link, direction) moved back to the default path because a delegate failed
        self.failover_log: list[tuple[int, int, str, str]] = []  # (step, link, direction, why)
        self.step = 0
        self.lock = threading.RLock()
        self.wake = threading.Condition(self.lock)  # the watcher's: an event to act on, or close
        # called under the lock when a link moves (its number) or the transport closes (None): the
        # waits on the old path leave it (each wakes only those of its own, not every thread)
        self.on_move: list[Callable[[int | None], None]] = []
        self.closed = False
        self.served = [link for link in (stage - 1, stage) if 0 <= link < num_stages - 1]
        self.gen = dict.fromkeys(self.served, 0)  # path changes of each link so far (equal on both ends)
        self.primary_broken: dict[int, str] = {}
        self.delegate_dead: dict[int, str] = {}
        self.fatal: dict[int, BaseException] = {}
        self._events: list[tuple[int, str, int, str]] = []  # delegate failures heard by the reader thread
        self.threads: list[threading.Thread] = []
        self.replay: Replay = lambda key, sends, step, new, gen: None
        self.probe: Callable[[int, int], None] = lambda link, gen: None
        self.on_round: Callable[[], None] = lambda: None  # more of the watcher's work (the stall check)

    @property
    def timeout_s(self) -> float:
        return self.timeouts.for_step(self.step)

    def where(self) -> str:
        return f"stage {self.stage} (rank {self.rank})"

    def thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        t = threading.Thread(target=target, name=name, daemon=True)
        self.threads = [*(old for old in self.threads if old.is_alive()), t]
        t.start()
        return t

    def path_of(self, key: tuple[int, str]) -> str:
        return DELEGATE if key in self.routed else PRIMARY

    def transport(self, path: str) -> Transport:
        return self.delegate if path == DELEGATE else self.primary

    # -- told -----------------------------------------------------------------------------------
    def check_link(self, link: int) -> None:
        if not 0 <= link < self.num_stages - 1:
            raise ValueError(f"link must be in 0..{self.num_stages - 2}, got {link}")

    def switch(self, links: Iterable[int]) -> None:
        for link in links:
            self.check_link(link)
            if link in self.served and not self._delegates_usable(link):
                continue
            with self.lock:
                moved = False
                for d in ("fwd", "bwd"):
                    if (link, d) not in self.routed:
                        self.switched.add((link, d))
                        self.routed.add((link, d))
                        moved = True
                if moved and link in self.gen:
                    self.gen[link] += 1

    def restore(self, links: Iterable[int]) -> None:
        for link in links:
            self.check_link(link)
            with self.lock:
                moved = False
                for d in ("fwd", "bwd"):
                    if (link, d) in self.switched:
                        self.switched.discard((link, d))
                        self.routed.discard((link, d))
                        moved = True
                if moved and link in self.gen:
                    self.gen[link] += 1

    def _delegates_usable(self, link: int) -> bool:
        """Both ranks of ``link`` agree (through the store) whether its delegates still work."""
        with self.lock:
            mine = link not in self.delegate_dead and link not in self.fatal
            gen = self.gen[link]
        peer = link + 1 if link == self.stage else link
        base = f"{self.ns}/switch/{link}/{gen}"
        self.store.set(f"{base}/{self.stage}", "1" if mine else "0")
        client = self.store.clone()  # type: ignore[attr-defined, unused-ignore]  # in torch's stub from 2.15 only
        client.set_timeout(timedelta(seconds=self.timeout_s))
        theirs: bool = client.get(f"{base}/{peer}").decode() == "1"
        if not (mine and theirs):
            logger.warning("titan_morph: link %d stays on its default path: its delegates failed earlier", link)
        return mine and theirs

    def moved_back(self, link: int) -> None:
        """``link``'s default path probed good and carries it again from now on (caller holds the lock)."""
        self.primary_broken.pop(link, None)
        for d in ("fwd", "bwd"):
            self.routed.discard((link, d))
            self.switched.discard((link, d))
        self.gen[link] += 1

    # -- failures ----------------------------------------------------------------------------
    def raise_fatal(self, link: int) -> None:
        err = self.fatal.get(link)
        if err is not None:
            raise LinkFailedError(link, "", str(err))

    def failed_at(self, link: int, path: str, gen: int, error: BaseException) -> None:
        """An operation on ``link``'s ``path`` (issued as of ``gen``) failed: move the link, unless that
        happened since; raise when no path is left."""
        with self.lock:
            if self.gen.get(link, 0) != gen:
                return  # handled since: the message was re-issued on the new path
            self.move(link, path, self.step, f"{type(error).__name__}: {error}", notify=True)

    def on_delegate_failure(self, link: int, direction: str, error: DelegateError) -> None:
        """From the delegates' reader thread: a delegate of ``link`` failed (this rank's or its peer)."""
        with self.lock:
            self.delegate_dead.setdefault(link, str(error))
            if any(self.path_of((link, d)) == DELEGATE for d in ("fwd", "bwd")):
                self._events.append((link, DELEGATE, self.step, str(error)))
                self.wake.notify_all()

    def _notice_key(self, link: int, gen: int) -> str:
        return f"{self.ns}/fail/{link}/{gen}"

    def move(self, link: int, failed: str, step: int, why: str, *, notify: bool) -> None:
        """Move every direction of ``link`` on path ``failed`` to the other path, replaying the link's
        traffic since step ``step`` began (see the failover module docstring). Caller holds the lock."""
        if link in self.fatal:
            raise LinkFailedError(link, "", str(self.fatal[link]))
        dirs = [d for d in ("fwd", "bwd") if self.path_of((link, d)) == failed]
        if not dirs or link not in self.gen:
            return
        new = PRIMARY if failed == DELEGATE else DELEGATE
        gone = self.primary_broken.get(link) if new == PRIMARY else self.delegate_dead.get(link)
        if gone is not None:
            err = LinkFailedError(
                link,
                dirs[0],
                f"{self.where()}: link {link} has no path left: its {failed} path failed at step {step} ({why}), "
                f"and its {new} path had failed before ({gone})",
            )
            self.fatal[link] = err
            raise err
        if notify:
            try:
                self.store.set(self._notice_key(link, self.gen[link]), f"{failed}|{step}|{why[:500]}")
            except Exception:  # the peer still finds out from its own failed operations
                logger.exception("titan_morph: could not post the failure notice of link %d", link)
        if failed == PRIMARY:
            self.primary_broken[link] = why
            if self.pairs is not None:
                self.pairs.break_link(link, why)
        else:
            self.delegate_dead.setdefault(link, why)
            self.delegate.abandon(link, why)
        self.gen[link] += 1
        gen = self.gen[link]
        for hook in self.on_move:  # waits on the old path leave it (the new path carries their messages again)
            hook(link)
        sends = directions(link, self.stage)
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
            self.replay(key, sends[d], step, new, gen)
        if failed == PRIMARY:
            self.probe(link, gen)

    # -- the watcher ----------------------------------------------------------------------------
    def watch(self) -> None:
        """Moves links on the peer's notices and on delegate failures, even while the training thread
        is busy elsewhere (its peer may be waiting for this rank's re-sent messages)."""
        while True:
            with self.lock:
                if self.closed:
                    return
                events, self._events = self._events, []
                gens = dict(self.gen)
            for link, path, step, why in events:
                with self.lock:
                    try:
                        self.move(link, path, step, why, notify=True)
                    except LinkFailedError as e:
                        logger.error("titan_morph: %s", e)
            self.on_round()
            pause = WATCH_S
            for link, gen in gens.items():
                key = self._notice_key(link, gen)
                try:
                    if not self.store.check([key]):
                        continue
                    failed, at, why = self.store.get(key).decode().split("|", 2)
                except Exception:  # the store is gone (the job is ending): look again later
                    pause = 2.0
                    continue
                with self.lock:
                    if self.gen[link] == gen:
                        try:
                            self.move(link, failed, int(at), f"the peer's notice: {why}", notify=False)
                        except LinkFailedError as e:
                            logger.error("titan_morph: %s", e)
            with self.lock:
                if not self.closed and not self._events:
                    self.wake.wait(pause)
