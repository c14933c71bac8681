"""Bringing a failed-over link of a :class:`~titan_morph.comm.failover.FailoverTransport` back to its
default path.

After the default path of a link failed, a prober thread makes a fresh 2-rank group (one per
direction on NCCL) and exchanges a tensor on it every ``probe_interval_s``, on the same group while
the probes succeed, so a recovering link makes one communicator, not one per probe (both ranks;
each probe's result agreed through the store). After ``recover_probes`` good probes in a row the
link moves back at a step boundary both ranks name in advance: the lower rank posts step + 2 (ranks
are within one step of each other, because every step ends with a collective). A default path under
the link emulator is not probed (its ``inf`` is the model's, not a real failure).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from titan_morph.comm.failover_router import Router
from titan_morph.comm.pairs import LinkGroups, LinkWire
from titan_morph.comm.records import MessageBook

logger = logging.getLogger(__name__)

__all__ = ["PROBE_JOIN_S", "PROBE_TIMEOUT_S", "Prober"]

# bound of each of a probe's two waits: making the group and exchanging on it; the peer's verdict
PROBE_TIMEOUT_S = 5.0
# how long a closing transport waits at least for a prober inside a group's creation (C++: a thread
# caught there at interpreter exit aborts the process): the creation waits for the peer's address in
# the store, then for the connection, each up to PROBE_TIMEOUT_S. Over a blackholed route gloo's
# connect overruns its timeout (15 s and more were seen, with SYN retries): the transport then waits
# up to the [comm] train timeout.
PROBE_JOIN_S = 2 * PROBE_TIMEOUT_S + 1.0


class Prober:
    """Probes the failed default paths of ``router``'s links and moves them back when they work."""

    def __init__(self, router: Router, pairs: LinkGroups | None, recover_probes: int, probe_interval_s: float) -> None:
        self.router, self.pairs = router, pairs
        self.recover_probes, self.probe_interval_s = recover_probes, probe_interval_s
        self._ready: dict[int, tuple[int, LinkWire]] = {}  # link -> (probe attempt, group): probes agreed

    def start(self, link: int, gen: int) -> None:
        """Probe ``link``'s default path (failed as of ``gen``) on a thread, where it can be re-made."""
        if self.pairs is not None and self.router.primary.links is None:
            self.router.thread(lambda: self._probe(link, gen), f"titan_morph-probe-link{link}")

    def _probe(self, link: int, gen: int) -> None:
        """Probe ``link``'s default path until ``recover_probes`` agreed good probes in a row."""
        router, pairs = self.router, self.pairs
        assert pairs is not None
        peer = link + 1 if link == router.stage else link
        good, attempt = 0, 0
        kept: LinkWire | None = None
        timeout = min(PROBE_TIMEOUT_S, router.timeouts.train_s)
        while True:
            time.sleep(self.probe_interval_s)
            with router.lock:
                if router.closed or router.gen[link] != gen or link in router.fatal:
                    return
            attempt += 1
            group = pairs.probe(link, f"{gen}.{attempt}", timeout, reuse=kept)
            with router.lock:
                if router.closed:  # the peer may be gone: do not wait for its verdict
                    if group is not None:
                        group.break_("transport closed")
                    return
            base = f"{router.ns}/probe/{link}/{gen}/{attempt}"
            try:
                router.store.set(f"{base}/{router.stage}", "1" if group is not None else "0")
                client = router.store.clone()  # type: ignore[attr-defined]  # torch's stub omits Store.clone
                client.set_timeout(timedelta(seconds=timeout))
                theirs = client.get(f"{base}/{peer}").decode() == "1"
            except Exception:
                theirs = False
            ok = group is not None and theirs  # the same verdict on both ends
            if not ok:
                for failed in (group, kept):
                    if failed is not None:
                        failed.break_("probe not agreed")
                kept, good = None, 0  # both ends start over on fresh groups
            else:
                good += 1
                kept = group  # the next probe reuses it: one communicator per recovery
            if good >= self.recover_probes and kept is not None:
                with router.lock:
                    if router.gen[link] == gen:
                        self._ready[link] = (attempt, kept)
                if link == router.stage:  # the lower rank names the step both move back at
                    router.store.set(f"{router.ns}/back/{link}/{gen}", f"{router.step + 2}:{attempt}")
                logger.warning(
                    "titan_morph: link %d: default path good again (%d probes in a row); moving back",
                    link,
                    good,
                )
                return

    def move_back_due(self, step: int) -> None:
        """At a step boundary: move links whose default path probed good back to it, at the step the
        lower rank named (both ranks)."""
        router = self.router
        for link, (attempt, group) in list(self._ready.items()):
            gen = router.gen[link]
            key = f"{router.ns}/back/{link}/{gen}"
            try:
                if not router.store.check([key]):
                    continue
                at, named = map(int, router.store.get(key).decode().split(":"))
            except Exception:
                continue
            if step < at or named != attempt:
                continue
            with router.lock:
                self._ready.pop(link, None)
                assert self.pairs is not None
                self.pairs.replace(link, group)
                router.moved_back(link)
                if isinstance(router.primary, MessageBook):
                    router.primary.restart_numbering(link)
            logger.warning("titan_morph: link %d is back on its default path from step %d on", link, step)
