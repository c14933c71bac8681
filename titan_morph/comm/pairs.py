"""The default path, contained per link: one 2-rank process group per pipeline link (paper §5.3).

A link whose GPU path fails (an NCCL error, a timeout on a bad NIC) must be routed around without
touching the others. With all pipeline traffic on one process group a failure poisons every link;
here each link ``i`` (stages ``i`` and ``i+1``) has its own 2-rank group (:class:`PairGroup`, group
rank 0 = stage ``i``), made from the job's c10d store under a per-link, per-generation prefix, so a
broken link's group can be torn down and a new one made, while the other links go on.

:class:`LinkTransport` is the default path on these groups (the same sends and receives torch's
``_batch_p2p`` would issue, one per op); a failed send or receive raises :class:`LinkFailedError`
naming the rank, link, direction and operation. :class:`LinkGroups` owns the groups of this rank,
re-creates them (``probe``) and, for tests and the ``[morph.inject] mode = "break"`` emulation,
breaks one for real (:meth:`PairGroup.break_`): on gloo it shuts down the group's connected
sockets (as a pulled cable would), so both ends see gloo's own "Connection closed" errors; on NCCL
it aborts the communicator.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from titan_morph.comm.records import MessageRecord
from titan_morph.comm.system import fd_targets
from titan_morph.comm.timeouts import DEFAULT_TIMEOUTS, CommTimeouts
from titan_morph.comm.transport import Handle, TorchTransport, classify_op

__all__ = ["BreakPlan", "LinkFailedError", "LinkGroups", "LinkTransport", "PairGroup"]

logger = logging.getLogger(__name__)

STORE_PREFIX = "titan_morph/links"
_create_lock = threading.Lock()  # group creation: one at a time, so its new sockets are its own


class LinkFailedError(RuntimeError):
    """A default-path send or receive on a link failed (an error or a timeout of its process group)."""

    def __init__(self, link: int, direction: str, detail: str) -> None:
        super().__init__(detail)
        self.link, self.direction = link, direction


def _sockets() -> dict[int, str]:
    """This process's socket descriptors and their inodes."""
    return {fd: target for fd, target in fd_targets().items() if target.startswith("socket:")}


class PairGroup:
    """The 2-rank process group of link ``link``, generation ``tag`` (``0``, ``probe3``...).

    Both ends construct it (blocking until the other does, at most ``timeout_s``)."""

    def __init__(
        self,
        store: Store,
        namespace: str,
        link: int,
        tag: str,
        index: int,
        *,
        backend: str,
        timeout_s: float,
        device: torch.device | None = None,
    ) -> None:
        self.link, self.tag, self.index, self.peer = link, tag, index, 1 - index
        self.backend = backend
        self.broken = ""
        prefixed = PrefixStore(f"{namespace}/{link}/{tag}", store)
        timeout = timedelta(seconds=timeout_s)
        with _create_lock:
            before = _sockets()
            if backend == "nccl":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                self.pg: Any = dist.ProcessGroupNCCL(prefixed, index, 2, opts)
                if device is not None:
                    self.pg.eager_connect_single_device(device)
            else:
                self.pg = dist.ProcessGroupGloo(prefixed, index, 2, timeout)
            self._fds = [fd for fd, inode in _sockets().items() if before.get(fd) != inode]

    def send(self, tensor: torch.Tensor) -> Any:
        return self.pg.send([tensor], self.peer, 0)

    def recv(self, tensor: torch.Tensor) -> Any:
        return self.pg.recv([tensor], self.peer, 0)

    def set_timeout(self, seconds: float) -> None:
        self.pg._set_default_timeout(timedelta(seconds=seconds))

    def break_(self, why: str) -> None:
        """Fail this group for real, now: every pending and later operation on it errors on both ends."""
        if self.broken:
            return
        self.broken = why
        if self.backend == "nccl":
            self.pg.abort()
            return
        for fd in self._fds:  # the connected pair socket(s); the listener is left alone
            try:
                sock = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            finally:
                sock.close()


@dataclass(frozen=True)
class BreakPlan:
    """``[morph.inject] mode = "break"``: the default path of ``links`` fails for real from training
    step ``start_step`` to ``end_step`` (0 = for good), broken by the link's upper stage (the
    receiver of its activations); re-created groups fail too while the window lasts."""

    links: frozenset[int]
    start_step: int = 1
    end_step: int = 0

    def active(self, link: int, step: int) -> bool:
        return link in self.links and step >= self.start_step and (self.end_step == 0 or step <= self.end_step)


class LinkGroups:
    """This rank's per-link default-path groups (links ``stage-1`` and ``stage``), made in link order.

    Collective between neighbouring ranks: every pipeline rank constructs one, in the same order."""

    def __init__(
        self,
        *,
        stage: int,
        num_stages: int,
        store: Store | None = None,
        namespace: str,
        backend: str = "gloo",
        timeouts: CommTimeouts = DEFAULT_TIMEOUTS,
        device: torch.device | None = None,
        breaks: BreakPlan | None = None,
    ) -> None:
        self.stage, self.num_stages = stage, num_stages
        self.store = store if store is not None else dist.distributed_c10d._get_default_store()
        self.namespace = f"{STORE_PREFIX}/{namespace}"
        self.backend, self.timeouts, self.device, self.breaks = backend, timeouts, device, breaks
        self.step = 0
        self.rank = dist.get_rank()
        self.links = [link for link in (stage - 1, stage) if 0 <= link < num_stages - 1]
        self._groups = {link: self._make(link, "0", timeouts.init_s) for link in self.links}
        self._lock = threading.Lock()

    def where(self) -> str:
        return f"stage {self.stage} (rank {self.rank})"

    def _make(self, link: int, tag: str, timeout_s: float) -> PairGroup:
        index = 0 if link == self.stage else 1
        return PairGroup(
            self.store, self.namespace, link, tag, index, backend=self.backend, timeout_s=timeout_s, device=self.device
        )

    def group(self, link: int) -> PairGroup:
        return self._groups[link]

    def set_step(self, step: int) -> None:
        """Follow TorchTitan's timeouts (start-up, then training) and apply the break plan."""
        if self.timeouts.for_step(step) != self.timeouts.for_step(self.step):
            for g in self._groups.values():
                g.set_timeout(self.timeouts.for_step(step))
        self.step = step
        for link in self.links:
            if self.breaking(link, step):
                self._groups[link].break_(f"[morph.inject] break of link {link} at step {step}")

    def breaking(self, link: int, step: int) -> bool:
        """Whether this rank breaks ``link`` at ``step`` (the link's upper stage, inside the window)."""
        return self.breaks is not None and link + 1 == self.stage and self.breaks.active(link, step)

    def break_link(self, link: int, why: str) -> None:
        """Tear the link's group down on this side (the peer's operations on it fail at once too)."""
        self._groups[link].break_(why)

    def probe(self, link: int, attempt: str, timeout_s: float) -> PairGroup | None:
        """Make a fresh group for ``link`` and exchange one small tensor each way on it; the group when
        that worked (both ends must call this with the same ``attempt``), else None."""
        try:
            group = self._make(link, f"probe{attempt}", timeout_s)
        except Exception as e:  # the peer did not come, or the network refused: a failed probe
            logger.debug("titan_morph: probe %d of link %d: %s", attempt, link, e)
            return None
        if self.breaking(link, self.step):
            group.break_(f"[morph.inject] break of link {link} (probe {attempt})")
        ours = torch.full((4,), float(zlib.crc32(attempt.encode()) % 65521))  # the same on both ends
        theirs = torch.zeros(4)
        try:
            works = [group.send(ours), group.recv(theirs)]
            for w in works:
                w.wait(timedelta(seconds=timeout_s))
        except Exception as e:
            logger.debug("titan_morph: probe %d of link %d: %s", attempt, link, e)
            group.break_("failed probe")
            return None
        return group if torch.equal(theirs, ours) else None

    def replace(self, link: int, group: PairGroup) -> None:
        """Carry the link's default path on ``group`` from now on (a probe's group; both ends)."""
        with self._lock:
            old, self._groups[link] = self._groups[link], group
        group.set_timeout(self.timeouts.for_step(self.step))
        old.break_("replaced")


def _failure(
    groups: LinkGroups,
    group: PairGroup,
    link: int,
    direction: str,
    send: bool,
    took: float,
    bound: float | None,
    error: BaseException,
) -> LinkFailedError:
    """The error of a failed operation on a link's group: rank, link, direction, operation, cause."""
    op = "send to" if send else "receive from"
    peer = link + 1 if group.index == 0 else link
    when = "when issued" if bound is None else f"after {took:.3g} s (bound {bound:.3g} s)"
    cause = group.broken or str(error).splitlines()[0][:300]
    return LinkFailedError(
        link,
        direction,
        f"{groups.where()}: {op} stage {peer} on link {link} ({direction}) failed on the link's default path "
        f"{when}: {cause}",
    )


class _LinkHandle:
    """One op on a link's group; a failure of the group is a :class:`LinkFailedError`."""

    __slots__ = ("owner", "work", "ops", "link", "direction", "send", "group")
    record: MessageRecord | None = None
    due_s: float | None = None
    ops: Sequence[dist.P2POp]

    def __init__(
        self, owner: LinkTransport, work: Any, op: dist.P2POp, link: int, direction: str, send: bool, group: PairGroup
    ) -> None:
        self.owner, self.work, self.ops = owner, work, (op,)
        self.link, self.direction, self.send, self.group = link, direction, send, group

    def wait(self, timeout: float | None = None) -> bool:
        bound = self.owner.timeouts.for_step(self.owner.groups.step) if timeout is None else timeout
        t0 = time.monotonic()
        try:
            return bool(self.work.wait(timedelta(seconds=max(1e-3, bound))))  # 0 would mean the group's own
        except Exception as e:  # gloo/NCCL errors and timeouts come as RuntimeError / DistError
            took = time.monotonic() - t0
            raise _failure(self.owner.groups, self.group, self.link, self.direction, self.send, took, bound, e) from e

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())


class LinkTransport(TorchTransport):
    """The default path on per-link groups: each pipeline op is issued on its link's group (other
    groups' ops go to torch unchanged). Keeps no records (wrap it in ``RecordedTransport``); the
    per-link groups belong to :class:`LinkGroups`, so closing it stops nothing."""

    def __init__(
        self, groups: LinkGroups, *, group: dist.ProcessGroup | None = None, epoch: float | None = None
    ) -> None:
        super().__init__(epoch)
        self.groups = groups
        self.timeouts = groups.timeouts
        self.stage, self.num_stages = groups.stage, groups.num_stages
        world = group if group is not None else dist.group.WORLD
        if world is None:
            raise RuntimeError("LinkTransport needs an initialised torch.distributed (no default process group)")
        self._group_name = world.group_name

    def set_step(self, step: int) -> None:
        self.groups.set_step(step)

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        mine = [op for op in ops if op.group.group_name == self._group_name]
        others = [op for op in ops if op.group.group_name != self._group_name]
        handles: list[Handle] = super().batch_p2p(others, desc) if others else []
        for op in mine:
            lo = classify_op(op, self.stage, self.num_stages)
            group = self.groups.group(lo.link)
            try:
                work = group.send(op.tensor) if lo.is_send else group.recv(op.tensor)
            except Exception as e:  # gloo refuses at once on a pair it already knows is closed
                raise _failure(self.groups, group, lo.link, lo.direction, lo.is_send, 0.0, None, e) from e
            handles.append(_LinkHandle(self, work, op, lo.link, lo.direction, lo.is_send, group))
        return handles
