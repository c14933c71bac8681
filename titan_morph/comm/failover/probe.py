"""Bringing a failed-over link of a :class:`~titan_morph.comm.failover.transport.FailoverTransport` back to its
default path.

After the default path of a link failed, a prober thread makes a fresh 2-rank group (one per
direction on NCCL) and exchanges a tensor on it every ``probe_interval_s``, on the same group while
the probes succeed, so a recovering link makes one communicator, not one per probe (both ranks;
each probe's result agreed through the store). After ``recover_probes`` good probes in a row the
link moves back at a step boundary both ranks name in advance. Each prober posts that it is ready
(its group kept); the lower rank, at a step boundary once both are, posts that step + 2: the upper
rank cannot have finished the next step yet (it needs the lower rank's data of it), so it reads the
step in time and, being ready already, moves at the same boundary. Named by a thread the moment the
probes agreed, the step could pass before the other rank's prober (descheduled on a loaded host) had
kept its group, and the two ends would move one step apart. A default path under
the link emulator is not probed (its ``inf`` is the model's, not a real failure).

Before a new group is made, the two probers shake hands over plain TCP between the addresses the
failed group used (the lower end listens, the upper one connects, both agree through the store): a
gloo group made over a blackholed route blocks in its connect far beyond its timeout (the kernel's
SYN retries), and a thread inside it when the process exits aborts the process. A Python socket
wait is bounded, and harmless at exit.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import timedelta

from titan_morph.comm.failover.router import Router
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
            ip = local_address(self.pairs.group(link))  # now, while the failed group's sockets are its own
            self.router.thread(lambda: self._probe(link, gen, ip), f"titan_morph-probe-link{link}")

    def _probe(self, link: int, gen: int, ip: str | None) -> None:
        """Probe ``link``'s default path until ``recover_probes`` agreed good probes in a row; ``ip``:
        this end's address on it (None: unknown, gloo's probe alone tells)."""
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
            base = f"{router.ns}/probe/{link}/{gen}/{attempt}"
            group = None
            if kept is not None or ip is None or self._handshake(link, base, peer, ip, timeout):
                group = pairs.probe(link, f"{gen}.{attempt}", timeout, reuse=kept)
            with router.lock:
                if router.closed:  # the peer may be gone: do not wait for its verdict
                    if group is not None:
                        group.break_("transport closed")
                    return
            try:
                router.store.set(f"{base}/{router.stage}", "1" if group is not None else "0")
                client = router.store.clone()  # type: ignore[attr-defined, unused-ignore]  # in torch's stub from 2.15 only
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
                router.store.set(f"{router.ns}/ready/{link}/{gen}/{attempt}/{router.stage}", "1")
                logger.warning(
                    "titan_morph: link %d: default path good again (%d probes in a row); moving back",
                    link,
                    good,
                )
                return

    def _handshake(self, link: int, base: str, peer: int, ip: str, timeout: float) -> bool:
        """One TCP handshake over the link's path, from ``ip`` (both ends; the same verdict on both)."""
        router = self.router
        ok = False
        try:
            client = router.store.clone()  # type: ignore[attr-defined, unused-ignore]  # in torch's stub from 2.15 only
            client.set_timeout(timedelta(seconds=timeout))
            family = socket.AF_INET6 if ":" in ip else socket.AF_INET
            if link == router.stage:  # the lower end listens
                with socket.socket(family, socket.SOCK_STREAM) as server:
                    server.bind((ip, 0))
                    server.listen(1)
                    server.settimeout(timeout)
                    router.store.set(f"{base}/tcp", f"{ip}|{server.getsockname()[1]}")
                    conn, _ = server.accept()
                    with conn:
                        conn.settimeout(timeout)
                        ok = conn.recv(1) == b"x"
            else:
                host, port = client.get(f"{base}/tcp").decode().split("|")
                with socket.create_connection((host, int(port)), timeout=timeout, source_address=(ip, 0)) as c:
                    c.sendall(b"x")
                    ok = True
        except Exception as e:  # OSError (refused, timed out), or the peer's address never came
            logger.debug("titan_morph: probe handshake of link %d: %s", link, e)
        try:
            router.store.set(f"{base}/tcp/{router.stage}", "1" if ok else "0")
            return ok and client.get(f"{base}/tcp/{peer}").decode() == "1"
        except Exception:
            return False

    def move_back_due(self, step: int) -> None:
        """At a step boundary: move links whose default path probed good back to it, at the step the
        lower rank named (both ranks)."""
        router = self.router
        for link, (attempt, group) in list(self._ready.items()):
            gen = router.gen[link]
            key = f"{router.ns}/back/{link}/{gen}"
            try:
                if link == router.stage and not router.store.check([key]):  # the lower rank names the step
                    if router.store.check([f"{router.ns}/ready/{link}/{gen}/{attempt}/{link + 1}"]):
                        router.store.set(key, f"{step + 2}:{attempt}")
                    continue
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


def local_address(wire: LinkWire) -> str | None:
    """This end's IP address on ``wire``'s connections (None when none is readable)."""
    for group in wire.groups:
        for fd in getattr(group, "_fds", []):
            try:
                sock = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                    ip = str(sock.getsockname()[0])
                    if ip not in ("0.0.0.0", "::"):
                        return ip
            except OSError:
                pass
            finally:
                sock.close()
    return None
