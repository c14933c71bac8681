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

On NCCL (paper §5.3: titan_morph's failover must act before NCCL does) each link has one group per
direction, so a peer pair's sends and receives never share a stream (the link emulator releases
sends late, from another thread: on one stream a receive queued first would hold the send that
completes it, on both ranks); waits are stream-ordered, so the host runs ahead of the device, and an op
that outlasts the ``[comm]`` bound on the device is found by a watch thread, which tears the link's
group down (:mod:`titan_morph.comm.waits`); a group's own NCCL timeout is well beyond that bound
(:func:`nccl_timeout_s`) and its watchdog only cleans up a failed communicator
(:data:`NCCL_PAIR_ENV`), so the process lives on and titan_morph's timeout, abort and failover come
first; probes exchange tensors on the group's device, from a thread on the rank's device.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from titan_morph.comm.groups import GROUP_LOCK, check_interface, gloo_options
from titan_morph.comm.machine.devices import bind_device
from titan_morph.comm.machine.system import fd_targets
from titan_morph.comm.records import MessageRecord
from titan_morph.comm.timeouts import DEFAULT_TIMEOUTS, CommTimeouts
from titan_morph.comm.transport import Handle, TorchTransport, classify_op
from titan_morph.comm.waits import DeviceOp, on_nccl, poll_until, stream_wait

__all__ = ["NCCL_PAIR_ENV", "BreakPlan", "LinkFailedError", "LinkGroups", "LinkTransport", "LinkWire", "PairGroup"]

logger = logging.getLogger(__name__)

STORE_PREFIX = "titan_morph/links"
_create_lock = GROUP_LOCK  # group creation: one at a time, so its new sockets are its own (and no
# temporary GLOO_SOCKET_IFNAME of another group leaks into it)


# ProcessGroupNCCL reads these when a group is made: 2 = CleanUpOnly (a timed-out or failed
# communicator is aborted, the process is not killed: the default 3 would end the rank before the
# failover can move the link), and no blocking waits (the host must never wait inside NCCL).
NCCL_PAIR_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2", "TORCH_NCCL_BLOCKING_WAIT": "0"}


def nccl_timeout_s(bound_s: float) -> float:
    """A pair group's own NCCL timeout for waits bounded by ``bound_s``: twice the bound plus a
    minute, so titan_morph's bound always expires (and the failover acts) before NCCL's watchdog."""
    return 2.0 * bound_s + 60.0


_env_lock = threading.Lock()
_env_applied = False


def apply_pair_env() -> None:
    """Put :data:`NCCL_PAIR_ENV` into this process's environment, once, for good.

    ProcessGroupNCCL reads these variables only from the environment, when a group is made, and
    writing the environment is unsafe while another thread may read it (a C ``getenv`` racing
    ``setenv``; a delegate started meanwhile would inherit a half-changed one). So it is written once,
    by :class:`LinkGroups` on the thread that builds the transport, before titan_morph starts any
    thread of its own, and never restored: the probes that make groups later, from their own
    threads, find it set. Groups made before (TorchTitan's world group) keep what they read; NCCL
    groups made after it in this process clean up only on failure, as the pair groups must."""
    global _env_applied
    with _env_lock:
        if _env_applied:
            return
        for key, value in NCCL_PAIR_ENV.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        _env_applied = True


def _nccl_group(store: Store, index: int, timeout_s: float, device: torch.device | None) -> Any:
    """A 2-rank ProcessGroupNCCL whose watchdog lets titan_morph's own bound act first."""
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timedelta(seconds=nccl_timeout_s(timeout_s))
    apply_pair_env()  # set already by LinkGroups (a no-op here); for a group made on its own
    pg = dist.ProcessGroupNCCL(store, index, 2, opts)
    if device is not None:
        pg.eager_connect_single_device(device)
    return pg


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

    Both ends construct it (blocking until the other does, at most ``timeout_s``). ``interface``:
    a gloo group's connections use that network interface ("" = torch's choice)."""

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
        interface: str = "",
    ) -> None:
        self.link, self.tag, self.index, self.peer = link, tag, index, 1 - index
        self.backend = backend
        self.broken = ""
        prefixed = PrefixStore(f"{namespace}/{link}/{tag}", store)
        self.device = device if backend == "nccl" else None
        with _create_lock:
            before = _sockets()
            if backend == "nccl":
                self.pg: Any = _nccl_group(prefixed, index, timeout_s, device)
            elif interface:
                self.pg = dist.ProcessGroupGloo(prefixed, index, 2, gloo_options(interface, timeout_s))
            else:
                self.pg = dist.ProcessGroupGloo(prefixed, index, 2, timedelta(seconds=timeout_s))
            self._fds = [fd for fd, inode in _sockets().items() if before.get(fd) != inode]

    @property
    def polls(self) -> bool:
        """Whether its ops run on the device's queue and report completion by themselves (NCCL):
        training waits are then stream-ordered and watched, a probe's polled; gloo's receives report
        completion only from a bounded ``wait``."""
        return self.backend == "nccl"

    def send(self, tensor: torch.Tensor) -> Any:
        return self.pg.send([tensor], self.peer, 0)

    def recv(self, tensor: torch.Tensor) -> Any:
        return self.pg.recv([tensor], self.peer, 0)

    def set_timeout(self, seconds: float) -> None:
        """Waits on this group are bounded by ``seconds`` (NCCL: its own timeout stays beyond them)."""
        own = nccl_timeout_s(seconds) if self.backend == "nccl" else seconds
        self.pg._set_default_timeout(timedelta(seconds=own))

    def tensor(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` where this group's backend can carry them (the group's device on NCCL)."""
        return values if self.device is None else values.to(self.device)

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


class LinkWire:
    """The default path of one link: one group for both directions (gloo), or one per direction
    (NCCL: each stream then carries one direction only, so no delayed send can queue behind a
    receive it completes). ``tag`` names the generation (``0``, ``probe3.1``...)."""

    def __init__(self, fwd: PairGroup, bwd: PairGroup | None = None) -> None:
        self.fwd, self.bwd = fwd, bwd if bwd is not None else fwd
        self.tag, self.index, self.link = fwd.tag, fwd.index, fwd.link

    @property
    def split(self) -> bool:
        return self.fwd is not self.bwd

    @property
    def groups(self) -> tuple[PairGroup, ...]:
        return (self.fwd, self.bwd) if self.split else (self.fwd,)

    def group(self, direction: str) -> PairGroup:
        """The group that carries ``direction`` (``fwd``: activations up, ``bwd``: gradients down)."""
        return self.fwd if direction == "fwd" else self.bwd

    @property
    def broken(self) -> str:
        return next((g.broken for g in self.groups if g.broken), "")

    def set_timeout(self, seconds: float) -> None:
        for g in self.groups:
            g.set_timeout(seconds)

    def break_(self, why: str) -> None:
        for g in self.groups:
            g.break_(why)


GroupFactory = Callable[[int, str, int, float], PairGroup]
"""How :class:`LinkGroups` makes one group: (link, tag, group index, timeout s) -> group."""


def _wait_work(group: PairGroup, work: Any, bound_s: float) -> None:
    """Wait ``work`` of ``group`` at most ``bound_s`` without blocking the host inside NCCL."""
    if not group.polls:
        work.wait(timedelta(seconds=max(1e-3, bound_s)))  # 0 would mean the group's own
        return
    if not poll_until(work.is_completed, time.monotonic() + bound_s):
        raise TimeoutError(f"not completed within {bound_s:.3g} s")
    work.wait()  # complete: raises its error, or orders the current stream after it


class LinkGroups:
    """This rank's per-link default-path groups (links ``stage-1`` and ``stage``), made in link order.

    Collective between neighbouring ranks: every pipeline rank constructs one, in the same order.
    ``split_directions``: one group per direction (None: on NCCL, see the module docstring);
    ``make_group``: how one group is made (tests pass a fake backend's); ``interface``: the network
    interface of gloo groups (``[morph] data_ifname``; "" = torch's choice; NCCL picks its RNIC
    from its own environment)."""

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
        split_directions: bool | None = None,
        make_group: GroupFactory | None = None,
        interface: str = "",
    ) -> None:
        if interface and backend == "gloo":
            check_interface(interface, "[morph] data_ifname")
        if backend == "nccl":
            apply_pair_env()  # here, before this transport's threads (and the probes' groups) exist
        self.interface = interface if backend == "gloo" else ""
        self.stage, self.num_stages = stage, num_stages
        self.namespace = f"{STORE_PREFIX}/{namespace}"
        self.backend, self.timeouts, self.breaks = backend, timeouts, breaks
        self.device = torch.device(device) if device is not None else None
        self.split = backend == "nccl" if split_directions is None else split_directions
        if make_group is None:
            base = store if store is not None else dist.distributed_c10d._get_default_store()
            make_group = self._pair_factory(base)
        self._make_group = make_group
        self.step = 0
        self.rank = dist.get_rank() if dist.is_initialized() else stage
        self.links = [link for link in (stage - 1, stage) if 0 <= link < num_stages - 1]
        self._groups = {link: self._make(link, "0", timeouts.init_s) for link in self.links}
        self._lock = threading.Lock()

    def _pair_factory(self, store: Store) -> GroupFactory:
        def make(link: int, tag: str, index: int, timeout_s: float) -> PairGroup:
            return PairGroup(
                store,
                self.namespace,
                link,
                tag,
                index,
                backend=self.backend,
                timeout_s=timeout_s,
                device=self.device,
                interface=self.interface,
            )

        return make

    def where(self) -> str:
        return f"stage {self.stage} (rank {self.rank})"

    def _make(self, link: int, tag: str, timeout_s: float) -> LinkWire:
        index = 0 if link == self.stage else 1
        if not self.split:
            return LinkWire(self._make_group(link, tag, index, timeout_s))
        fwd = self._make_group(link, f"{tag}-fwd", index, timeout_s)
        try:
            bwd = self._make_group(link, f"{tag}-bwd", index, timeout_s)
        except BaseException:
            fwd.break_("its other direction could not be made")
            raise
        wire = LinkWire(fwd, bwd)
        wire.tag = tag
        return wire

    def group(self, link: int) -> LinkWire:
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
        """Tear the link's group(s) down on this side (the peer's operations on them fail at once too)."""
        self._groups[link].break_(why)

    def probe(self, link: int, attempt: str, timeout_s: float, reuse: LinkWire | None = None) -> LinkWire | None:
        """Exchange one small tensor each way on each group of ``reuse`` (the last good probe's, so a
        recovering link makes one communicator, not one per probe) or of fresh group(s) for ``link``,
        on the group's device; the link's new default path when that worked (both ends must call this
        with the same ``attempt`` and agree on ``reuse``), else None (``reuse`` is then broken).
        Runs on the rank's device (a prober thread)."""
        bind_device(self.device if self.backend == "nccl" else None)
        try:
            wire = reuse if reuse is not None else self._make(link, f"probe{attempt}", timeout_s)
        except Exception as e:  # the peer did not come, or the network refused: a failed probe
            logger.debug("titan_morph: probe %s of link %d: %s", attempt, link, e)
            return None
        if self.breaking(link, self.step):
            wire.break_(f"[morph.inject] break of link {link} (probe {attempt})")
        ours = torch.full((4,), float(zlib.crc32(attempt.encode()) % 65521))  # the same on both ends
        try:
            for group in wire.groups:
                mine, theirs = group.tensor(ours), group.tensor(torch.zeros(4))
                # lower end sends first, upper end receives first: on one stream per pair (NCCL) both
                # ends posting "send, then receive" would each wait for the other's receive
                if group.index == 0:
                    _wait_work(group, group.send(mine), timeout_s)
                    _wait_work(group, group.recv(theirs), timeout_s)
                else:
                    _wait_work(group, group.recv(theirs), timeout_s)
                    _wait_work(group, group.send(mine), timeout_s)
                if not torch.equal(theirs.cpu(), ours):
                    raise RuntimeError(f"probe payload {theirs.cpu().tolist()} != {ours.tolist()}")
        except Exception as e:
            logger.debug("titan_morph: probe %s of link %d: %s", attempt, link, e)
            wire.break_("failed probe")
            return None
        return wire

    def replace(self, link: int, wire: LinkWire) -> None:
        """Carry the link's default path on ``wire`` from now on (a probe's; both ends)."""
        with self._lock:
            old, self._groups[link] = self._groups[link], wire
        wire.set_timeout(self.timeouts.for_step(self.step))
        old.break_("replaced")


def one_stream_per_pair(group: dist.ProcessGroup) -> bool:
    """Whether ``group``'s point-to-point traffic between two ranks runs on one stream (NCCL): a
    transport that posts a peer pair's operations out of the order both ranks agree on can then
    deadlock, and must give each direction its own group (:class:`LinkGroups`)."""
    return on_nccl(group)


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
    """One op on a link's group; a failure of the group is a :class:`LinkFailedError`. On NCCL the
    wait is stream-ordered and the op watched off the host (:mod:`titan_morph.comm.waits`): one that
    outlasts its bound tears the link's group down (:meth:`LinkTransport.stalled`)."""

    __slots__ = ("owner", "work", "ops", "link", "direction", "send", "group", "op")
    record: MessageRecord | None = None
    due_s: float | None = None
    ops: Sequence[dist.P2POp]

    def __init__(
        self, owner: LinkTransport, work: Any, op: dist.P2POp, link: int, direction: str, send: bool, group: PairGroup
    ) -> None:
        self.owner, self.work, self.ops = owner, work, (op,)
        self.link, self.direction, self.send, self.group = link, direction, send, group
        self.op = DeviceOp(work) if group.polls else None

    def wait(self, timeout: float | None = None) -> bool:
        bound = self.owner.timeouts.for_step(self.owner.groups.step) if timeout is None else timeout
        t0 = time.monotonic()
        try:
            if self.op is None:
                _wait_work(self.group, self.work, bound)
            else:
                self.owner.raise_stall(self.link, self.direction)
                stream_wait(self.op, bound, self._stalled)
            return True
        except LinkFailedError:
            raise
        except Exception as e:  # gloo/NCCL errors and timeouts come as RuntimeError / DistError / TimeoutError
            took = time.monotonic() - t0
            raise _failure(self.owner.groups, self.group, self.link, self.direction, self.send, took, bound, e) from e

    def _stalled(self, waited_s: float) -> None:
        self.owner.stalled(self, waited_s)

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())

    def device_ops(self) -> list[DeviceOp]:
        return [self.op] if self.op is not None else []


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
        self._stalls: dict[tuple[int, str], tuple[PairGroup, LinkFailedError]] = {}
        self._stall_lock = threading.Lock()

    def set_step(self, step: int) -> None:
        self.groups.set_step(step)

    def stalled(self, handle: _LinkHandle, waited_s: float) -> None:
        """From the watch's thread: ``handle``'s op outlasted its bound on the device. The link's
        group is torn down (its queued ops end, so the device queue moves again) and the error is
        the next wait's or issue's on that (link, direction) (raised by the training thread)."""
        op = "send to" if handle.send else "receive from"
        peer = handle.link + 1 if handle.group.index == 0 else handle.link
        why = f"not completed on the device within {waited_s:.3g} s"
        err = LinkFailedError(
            handle.link,
            handle.direction,
            f"{self.groups.where()}: {op} stage {peer} on link {handle.link} ({handle.direction}) stalled on the "
            f"link's default path: {why} (its consumer may already be queued behind it on the device)",
        )
        with self._stall_lock:
            self._stalls.setdefault((handle.link, handle.direction), (handle.group, err))
        logger.warning("titan_morph: %s", err)
        handle.group.break_(f"stalled: {why}")

    def raise_stall(self, link: int, direction: str) -> None:
        """Raise the stall the watch found on ``(link, direction)``'s current group, if any (the
        training thread; a group made since, by a probe, starts clean)."""
        found = self._stalls.get((link, direction))
        if found is not None and found[0] is self.groups.group(link).group(direction):
            raise found[1]

    def batch_p2p(self, ops: list[dist.P2POp], desc: str | None = None) -> list[Handle]:
        mine = [op for op in ops if op.group.group_name == self._group_name]
        others = [op for op in ops if op.group.group_name != self._group_name]
        handles: list[Handle] = super().batch_p2p(others, desc) if others else []
        for op in mine:
            lo = classify_op(op, self.stage, self.num_stages)
            self.raise_stall(lo.link, lo.direction)
            group = self.groups.group(lo.link).group(lo.direction)
            try:
                work = group.send(op.tensor) if lo.is_send else group.recv(op.tensor)
            except Exception as e:  # gloo refuses at once on a pair it already knows is closed
                raise _failure(self.groups, group, lo.link, lo.direction, lo.is_send, 0.0, None, e) from e
            handles.append(_LinkHandle(self, work, op, lo.link, lo.direction, lo.is_send, group))
        return handles
