"""Data-parallel collectives through a registered c10d backend: real gloo collectives whose
completion is delayed by the host pairs their ring crosses, each one recorded for the monitor.

Why a backend. In DP x PP training (paper §6, Fig. 13) the data-parallel groups carry FSDP's
all-gathers and reduce-scatters, the gradient-norm and loss all-reduces, and these collectives are
what a slow link between two hosts of one DP group stalls (Fig. 3/19). Registering a backend
(``torch.distributed.Backend.register_backend``) puts the emulation under every one of them,
whoever issues it (FSDP2, DTensor, functional collectives, TorchTitan's own ``dist_sum``): a group
created with ``backend=BACKEND`` is a :class:`DelayedGroup`, which runs each collective on a real
``ProcessGroupGloo`` over the same store and ranks and hands back a :class:`dist.Work` that
completes later, as the slow link would make it.

Hosts and pairs. One rank runs per host (the paper's one-GPU-per-node runs); ``configure(hosts)``
names the host of every global rank (the identity unless the launcher started the ranks in another
order) and :class:`PairDelays` gives the delay of a host pair. A group's collective algorithm is
taken to be a ring over its members in rank order (NCCL's and gloo's default for large messages):
every ring step moves data across every ring pair at once, so a step lasts the slowest pair's
delay. A collective of ``h`` ring steps (:func:`ring_steps`: ``n - 1`` for an all-gather or a
reduce-scatter over ``n`` ranks, ``2 (n - 1)`` for an all-reduce) therefore completes
``h x max(ring pair delays)`` after the data itself would have.

Completion, per group and in issue order (collectives of one communicator run one after the other
on its stream): a completer thread waits for each collective's gloo work, then releases it at
``max(inner completion, previous release) + h x delay``. The completer stamps the times itself, so
the records are exact whatever the training thread is doing: ``issued`` (the call), ``start``
(the later of the call and the previous collective's release: when it could begin on the stream),
``done`` (gloo finished) and ``released`` (completed for the caller). Across the ranks of a group,
``min(released) - max(start)`` is the collective's time on the wire; divided by its ring steps it
is the per-hop delay the straggler monitor compares (:mod:`titan_morph.monitor.topology`).

Point-to-point ops on such a group (the monitor's pair probes) take one hop: a receive completes
the pair's delay after its data arrived. Other ops not listed in :class:`DelayedGroup` fall through
to the inner gloo backend, undelayed.
"""

from __future__ import annotations

import datetime
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist

from titan_morph.comm.records import CommTimeoutError

__all__ = [
    "BACKEND",
    "CollectiveRecord",
    "DelayedGroup",
    "PairDelays",
    "configure",
    "hosts",
    "register",
    "ring_pairs",
    "ring_steps",
    "set_step",
    "take_records",
]

BACKEND = "titan_morph_dp"
"""The backend name groups are created with (``new_group(..., backend=BACKEND)``)."""

MAX_RECORDS = 100_000


def pair(a: int, b: int) -> tuple[int, int]:
    """A host pair as (smaller, larger): links are symmetric."""
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class PairDelays:
    """Delay in ms of every message that crosses a host pair, during steps ``start_step`` to
    ``end_step`` (0 = to the end), the same in both directions; pairs not listed have none."""

    delays: Mapping[tuple[int, int], float]
    start_step: int = 1
    end_step: int = 0

    def __post_init__(self) -> None:
        normal = {}
        for (a, b), ms in self.delays.items():
            if a == b or a < 0 or b < 0:
                raise ValueError(f"a host pair joins two different hosts >= 0, got {a}-{b}")
            if not (ms >= 0 and ms != float("inf")):
                raise ValueError(f"the delay of host pair {a}-{b} must be a finite number of ms >= 0, got {ms}")
            normal[pair(a, b)] = float(ms)
        object.__setattr__(self, "delays", normal)

    def active(self, step: int) -> bool:
        return step >= self.start_step and (self.end_step == 0 or step <= self.end_step)

    def delay_ms(self, a: int, b: int, step: int) -> float:
        """Delay of a message between hosts ``a`` and ``b`` at training step ``step``."""
        if a == b or not self.active(step):
            return 0.0
        return self.delays.get(pair(a, b), 0.0)


def ring_pairs(members: Sequence[int]) -> list[tuple[int, int]]:
    """The pairs a ring over ``members`` (in this order) uses: each member and the next, cyclically."""
    n = len(members)
    if n < 2:
        return []
    if n == 2:
        return [pair(members[0], members[1])]
    return [pair(members[i], members[(i + 1) % n]) for i in range(n)]


_RING_STEPS: dict[str, Callable[[int], int]] = {
    "allreduce": lambda n: 2 * (n - 1),  # reduce-scatter then all-gather
    "barrier": lambda n: 2 * (n - 1),  # an all-reduce of one element
    "allgather": lambda n: n - 1,
    "reduce_scatter": lambda n: n - 1,
    "alltoall": lambda n: n - 1,
    "broadcast": lambda n: n - 1,  # pipelined along the ring
    "reduce": lambda n: n - 1,
    "gather": lambda n: n - 1,
    "scatter": lambda n: n - 1,
    "send": lambda n: 0,  # completes when handed over; its receive carries the hop
    "recv": lambda n: 1,
}


def ring_steps(op: str, n: int) -> int:
    """Ring steps of collective ``op`` over ``n`` ranks (each step crosses every ring pair once)."""
    if op not in _RING_STEPS:
        raise ValueError(f"unknown collective {op!r}: one of {', '.join(_RING_STEPS)}")
    return _RING_STEPS[op](n) if n > 1 else 0


@dataclass
class CollectiveRecord:
    """One collective (or probe message) on one rank; times are ``time.monotonic()`` seconds."""

    ranks: tuple[int, ...]  # global ranks of the group, in group-rank order
    ordinal: int  # among this process's groups over the same ranks, in creation order
    seq: int  # collectives: per group, in issue order (the same on every member); send/recv: per peer
    op: str
    steps: int  # ring steps (hops) it takes
    step: int  # training step it was issued in
    issued_s: float
    delay_ms: float  # the emulated per-hop delay applied (0 without emulation)
    peer: int = -1  # point-to-point: the other global rank
    start_s: float | None = None
    done_s: float | None = None
    released_s: float | None = None
    status: str = "pending"  # pending | done | error


@dataclass
class _Config:
    hosts: tuple[int, ...] | None = None
    delays: PairDelays | None = None
    step: int = 0
    records: deque[CollectiveRecord] = field(default_factory=lambda: deque(maxlen=MAX_RECORDS))
    lock: threading.Lock = field(default_factory=threading.Lock)
    ordinals: dict[tuple[int, ...], itertools.count[int]] = field(default_factory=dict)


# Module-level: c10d builds each DelayedGroup through the registered backend factory, which takes no
# arguments of ours, so the hosts, delays and step it reads are the process's.
_config = _Config()


def configure(host_of_rank: Sequence[int] | None = None, delays: PairDelays | None = None) -> None:
    """Set the host of every global rank (None: rank r runs on host r) and the emulated pair delays
    (None: no delay, collectives are only recorded). Call before the groups are created."""
    if host_of_rank is not None and len(set(host_of_rank)) != len(host_of_rank):
        raise ValueError(f"every rank runs on its own host: got hosts {list(host_of_rank)}")
    _config.hosts = None if host_of_rank is None else tuple(int(h) for h in host_of_rank)
    _config.delays = delays


def hosts(ranks: Iterable[int]) -> list[int]:
    """The hosts of global ``ranks`` under the current configuration."""
    table = _config.hosts
    return [r if table is None else table[r] for r in ranks]


def set_step(step: int) -> None:
    """The training step now running (the pair delays' step window); call before each step."""
    _config.step = int(step)


def take_records() -> list[CollectiveRecord]:
    """This process's collective records since the last call (finished or not)."""
    with _config.lock:
        out = list(_config.records)
        _config.records.clear()
    return out


class _Item:
    __slots__ = ("works", "record", "outputs", "event", "error", "futures", "lock")

    def __init__(self, works: list[Any], record: CollectiveRecord, outputs: Any) -> None:
        self.works, self.record, self.outputs = works, record, outputs
        self.event = threading.Event()
        self.error: BaseException | None = None
        self.futures: list[torch.futures.Future[Any]] = []
        self.lock = threading.Lock()

    def finish(self) -> None:
        with self.lock:
            self.event.set()
            futures, self.futures = self.futures, []
        for fut in futures:
            self._settle(fut)

    def _settle(self, fut: torch.futures.Future[Any]) -> None:
        if self.error is not None:
            fut.set_exception(self.error)
        else:
            fut.set_result(self.outputs)

    def future(self) -> torch.futures.Future[Any]:
        fut: torch.futures.Future[Any] = torch.futures.Future()
        with self.lock:
            if not self.event.is_set():
                self.futures.append(fut)
                return fut
        self._settle(fut)
        return fut


class _DelayedWork(dist.Work):
    """The handle a :class:`DelayedGroup` returns: done when the group's completer releases it."""

    def __init__(self, item: _Item, bound_s: float) -> None:
        super().__init__()
        self._item, self._bound_s = item, bound_s

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        bound = self._bound_s
        if timeout is not None and timeout.total_seconds() > 0:
            bound = timeout.total_seconds()
        item = self._item
        if not item.event.wait(bound):
            rec = item.record
            raise CommTimeoutError(
                f"collective {rec.op} #{rec.seq} over ranks {list(rec.ranks)} (step {rec.step}) did not complete "
                f"within {bound:.3g} s"
            )
        if item.error is not None:
            raise item.error
        return True

    def is_completed(self) -> bool:
        return self._item.event.is_set()

    def is_success(self) -> bool:
        return self._item.event.is_set() and self._item.error is None

    def exception(self) -> Any:
        return self._item.error

    def result(self) -> Any:
        return self._item.outputs

    def get_future(self) -> torch.futures.Future[Any]:
        return self._item.future()


class _Completer(threading.Thread):
    """Releases one group's collectives in issue order at their emulated completion times."""

    def __init__(self, name: str) -> None:
        super().__init__(name=f"titan_morph-dp-{name}", daemon=True)
        self.items: deque[_Item] = deque()
        self.cond = threading.Condition()
        self.last_release = 0.0

    def put(self, item: _Item) -> None:
        with self.cond:
            self.items.append(item)
            self.cond.notify()

    def run(self) -> None:
        while True:
            with self.cond:
                while not self.items:
                    self.cond.wait()
                item = self.items.popleft()
            rec = item.record
            try:
                for work in item.works:
                    work.wait()
            except BaseException as e:  # re-raised by the caller's wait()
                item.error = e
            now = time.monotonic()
            rec.done_s = now
            rec.start_s = max(rec.issued_s, self.last_release)
            due = max(now, self.last_release) + rec.steps * rec.delay_ms / 1e3
            rest = due - time.monotonic()
            if rest > 0 and item.error is None:
                time.sleep(rest)
            rec.released_s = time.monotonic()
            rec.status = "error" if item.error is not None else "done"
            self.last_release = rec.released_s
            item.finish()


class _GlooOps(Protocol):
    """The backend calls of ``ProcessGroupGloo`` used here (torch's stub of it lists none of them)."""

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work: ...
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work: ...
    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> dist.Work: ...
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> dist.Work: ...
    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> dist.Work: ...
    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> dist.Work: ...
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work: ...
    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work: ...
    def barrier(self, opts: Any) -> dist.Work: ...
    def alltoall_base(
        self, output: torch.Tensor, input: torch.Tensor, out_splits: list[int], in_splits: list[int], opts: Any
    ) -> dist.Work: ...
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work: ...
    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work: ...


class DelayedGroup(dist.ProcessGroup):
    """A process group whose collectives run on gloo and complete as the emulated links say.

    Created by torch through the registered backend (:func:`register`): ``opts`` carries the c10d
    store prefixed for this group, the group rank and size, the timeout and the global ranks.
    """

    def __init__(self, opts: Any) -> None:
        super().__init__(opts.group_rank, opts.group_size)  # type: ignore[call-arg, unused-ignore]  # in torch's stub from 2.15 only
        from torch._C._distributed_c10d import ProcessGroupGloo

        gloo = ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
        self.inner = cast(_GlooOps, gloo)
        # Ops not overridden below reach the inner gloo backend through the C++ ProcessGroup.
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, gloo)
        self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)  # torch 2.15's flight recorder reads it
        ranks = list(opts.global_ranks_in_group) or list(range(dist.get_world_size()))
        self.ranks = tuple(int(r) for r in ranks)
        with _config.lock:
            self.ordinal = next(_config.ordinals.setdefault(self.ranks, itertools.count()))
        self.timeout_s = opts.timeout.total_seconds()
        self._seq = itertools.count()
        self._p2p_seq: dict[tuple[str, int], itertools.count[int]] = {}
        self._completer = _Completer(f"{'-'.join(map(str, self.ranks))}.{self.ordinal}")
        self._completer.start()

    def getBackendName(self) -> str:  # noqa: N802 (c10d's spelling)
        return BACKEND

    # -------------------------------------------------------------- the emulated completion
    def _hop_delay_ms(self, peer: int = -1) -> float:
        model = _config.delays
        if model is None:
            return 0.0
        step = _config.step
        if peer >= 0:
            me = self.ranks[self.rank()] if self.ranks else dist.get_rank()
            a, b = hosts((me, peer))
            return model.delay_ms(a, b, step)
        return max((model.delay_ms(a, b, step) for a, b in ring_pairs(hosts(self.ranks))), default=0.0)

    def _issue(self, op: str, run: Callable[[], Any], outputs: Any, peer: int = -1) -> _DelayedWork:
        issued = time.monotonic()
        delay = self._hop_delay_ms(peer)
        works = run()
        works = [w for w in (works if isinstance(works, list) else [works]) if w is not None]
        steps = ring_steps(op, self.size())
        # a send to j and the receive from i on j count alike, so send #q matches receive #q
        seq = next(self._seq if peer < 0 else self._p2p_seq.setdefault((op, peer), itertools.count()))
        record = CollectiveRecord(self.ranks, self.ordinal, seq, op, steps, _config.step, issued, delay, peer)
        with _config.lock:
            _config.records.append(record)
        item = _Item(works, record, outputs)
        self._completer.put(item)
        return _DelayedWork(item, self.timeout_s + steps * delay / 1e3 + 5.0)

    # -------------------------------------------------------------- collectives
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]  # torch's stub has only the Python API's form
        opts = opts if opts is not None else dist.AllreduceOptions()
        return self._issue("allreduce", lambda: self.inner.allreduce(tensors, opts), tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self._issue("allreduce", lambda: self.inner.allreduce_coalesced(tensors, opts), tensors)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]  # torch's stub has only the Python API's form
        opts = opts if opts is not None else dist.AllgatherOptions()  # type: ignore[attr-defined]  # not in torch's stub
        return self._issue("allgather", lambda: self.inner.allgather(outputs, inputs, opts), outputs)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllgatherOptions()  # type: ignore[attr-defined]  # not in torch's stub
        return self._issue("allgather", lambda: self.inner._allgather_base(output, input, opts), [output])

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._allgather_base(output, input, opts)

    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        opts = opts if opts is not None else dist.AllgatherOptions()  # type: ignore[attr-defined]  # not in torch's stub
        return self._per_pair("allgather", self.inner._allgather_base, outputs, inputs, opts)

    def reduce_scatter(  # type: ignore[override]  # torch's stub has only the Python API's form
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None
    ) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._issue("reduce_scatter", lambda: self.inner.reduce_scatter(outputs, inputs, opts), outputs)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._issue("reduce_scatter", lambda: self.inner._reduce_scatter_base(output, input, opts), [output])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> dist.Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._per_pair("reduce_scatter", self.inner._reduce_scatter_base, outputs, inputs, opts)

    def _per_pair(
        self,
        op: str,
        base: Callable[[torch.Tensor, torch.Tensor, Any], dist.Work],
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: Any,
    ) -> dist.Work:
        """A coalesced call as gloo's single-tensor ``base`` once per (output, input), issued and
        delayed as one collective ``op``: the all-gather and the reduce-scatter forms alike."""
        return self._issue(op, lambda: [base(o, i, opts) for o, i in zip(outputs, inputs)], outputs)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]  # torch's stub has only the Python API's form
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._issue("broadcast", lambda: self.inner.broadcast(tensors, opts), tensors)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:  # type: ignore[override]  # torch's stub has only the Python API's form
        opts = opts if opts is not None else dist.ReduceOptions()
        return self._issue("reduce", lambda: self.inner.reduce(tensors, opts), tensors)

    def barrier(self, opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.BarrierOptions()
        return self._issue("barrier", lambda: self.inner.barrier(opts), [])

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> dist.Work:
        opts = opts if opts is not None else dist.AllToAllOptions()
        run = lambda: self.inner.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)  # noqa: E731
        return self._issue("alltoall", run, [output])

    # -------------------------------------------------------------- point to point (probes)
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        return self._issue("send", lambda: self.inner.send(tensors, dst, tag), tensors, peer=self.ranks[dst])

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        return self._issue("recv", lambda: self.inner.recv(tensors, src, tag), tensors, peer=self.ranks[src])


def _create(opts: Any, backend_options: Any = None) -> DelayedGroup:
    return DelayedGroup(opts)


def register() -> str:
    """Register :data:`BACKEND` with torch.distributed (idempotent); returns its name."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    return BACKEND
