"""The NCCL-safe default path, on fakes (no GPU, and NCCL's two-rank paths cannot run on one GPU):
a backend with one FIFO stream per peer pair, stream-ordered waits watched off the host, the pair
groups' NCCL options, probes on the group's device."""

from __future__ import annotations

import os
import threading
from collections import deque
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from titan_morph.comm import pairs, waits
from titan_morph.comm.pairs import LinkFailedError, LinkGroups, LinkTransport, PairGroup
from titan_morph.comm.waits import DeviceWatch, poll_until


class Fabric:
    """NCCL's point-to-point model: each group end has one stream; an op runs only when it is at the
    head of its stream and its partner (the opposite op) is at the head of the peer's stream."""

    def __init__(self) -> None:
        self.streams: dict[tuple[object, int], deque[FakeWork]] = {}
        self.lock = threading.RLock()

    def post(self, gid: object, end: int, send: bool, tensor: torch.Tensor) -> FakeWork:
        work = FakeWork(self, send, tensor)
        with self.lock:
            self.streams.setdefault((gid, end), deque()).append(work)
            self.progress()
        return work

    def progress(self) -> None:
        with self.lock:
            moved = True
            while moved:
                moved = False
                for (gid, end), stream in list(self.streams.items()):
                    other = self.streams.get((gid, 1 - end))
                    if not stream or not other:
                        continue
                    a, b = stream[0], other[0]
                    if a.send and not b.send:
                        b.tensor.copy_(a.tensor)
                        a.done = b.done = True
                        stream.popleft()
                        other.popleft()
                        moved = True

    def stuck(self) -> int:
        return sum(len(s) for s in self.streams.values())


class FakeWork:
    def __init__(self, fabric: Fabric, send: bool, tensor: torch.Tensor) -> None:
        self.fabric, self.send, self.tensor, self.done = fabric, send, tensor, False
        self.waits: list[tuple] = []

    def is_completed(self) -> bool:
        self.fabric.progress()
        return self.done

    def wait(self, *args: object) -> bool:
        """``wait()``: the current stream waits for the op (the host does not); a timeout would make
        NCCL block the host and abort the communicator itself."""
        self.waits.append(args)
        if args:
            raise AssertionError("an NCCL wait must never pass NCCL a timeout (it would block the host)")
        return True


class FakePair:
    """A pair group end on the fabric (what :class:`PairGroup` offers the link path)."""

    backend, polls, device = "nccl", True, None

    def __init__(self, fabric: Fabric, link: int, tag: str, index: int) -> None:
        self.fabric, self.link, self.tag, self.index, self.peer = fabric, link, tag, index, 1 - index
        self.broken = ""
        self.moved: list[torch.Tensor] = []

    def send(self, tensor: torch.Tensor) -> FakeWork:
        return self.fabric.post((self.link, self.tag), self.index, True, tensor)

    def recv(self, tensor: torch.Tensor) -> FakeWork:
        return self.fabric.post((self.link, self.tag), self.index, False, tensor)

    def set_timeout(self, seconds: float) -> None:
        pass

    def break_(self, why: str) -> None:
        self.broken = self.broken or why

    def tensor(self, values: torch.Tensor) -> torch.Tensor:
        self.moved.append(values)
        return values


def _groups(fabric: Fabric, stage: int, split: bool | None = None, made: list | None = None) -> LinkGroups:
    def make(link: int, tag: str, index: int, timeout_s: float) -> FakePair:
        pair = FakePair(fabric, link, tag, index)
        if made is not None:
            made.append(pair)
        return pair

    return LinkGroups(stage=stage, num_stages=2, namespace="t", backend="nccl", split_directions=split, make_group=make)


PP = SimpleNamespace(group_name="pp")


def _op(send: bool, tensor: torch.Tensor, peer: int) -> SimpleNamespace:
    return SimpleNamespace(op=dist.isend if send else dist.irecv, tensor=tensor, group_peer=peer, group=PP)


def _emulator_order(split: bool | None) -> tuple[Fabric, list, torch.Tensor, torch.Tensor]:
    """The link emulator's posting order on link 0: both receives post at once, then the delayed sends
    are released (stage 0's activation first; stage 1's gradient only once the activation is in)."""
    fabric = Fabric()
    t0 = LinkTransport(_groups(fabric, 0, split), group=PP, epoch=0.0)  # type: ignore[arg-type]
    t1 = LinkTransport(_groups(fabric, 1, split), group=PP, epoch=0.0)  # type: ignore[arg-type]
    act, grad = torch.zeros(3), torch.zeros(3)
    handles = t1.batch_p2p([_op(False, act, 0)])  # stage 1: receive activation mb0 (posted at once)
    handles += t0.batch_p2p([_op(False, grad, 1)])  # stage 0: receive gradient mb0 (posted at once)
    handles += t0.batch_p2p([_op(True, torch.full((3,), 7.0), 1)])  # activation mb0, released late
    if handles[0].is_completed():  # stage 1 has the activation: it computes and sends the gradient
        handles += t1.batch_p2p([_op(True, torch.full((3,), 5.0), 0)])
    return fabric, handles, act, grad


def test_one_group_per_direction_cannot_deadlock_on_one_stream_per_pair() -> None:
    fabric, handles, act, grad = _emulator_order(split=None)  # NCCL: split by default
    assert len(handles) == 4 and all(h.is_completed() for h in handles)
    assert torch.equal(act, torch.full((3,), 7.0)) and torch.equal(grad, torch.full((3,), 5.0))
    assert fabric.stuck() == 0
    for h in handles:
        assert h.wait(0.5)


def test_one_shared_group_deadlocks_on_one_stream_per_pair() -> None:
    """The fake is faithful: with both directions on one stream the same order hangs."""
    fabric, handles, act, _ = _emulator_order(split=False)
    assert len(handles) == 3 and not any(h.is_completed() for h in handles)
    assert fabric.stuck() == 3 and not act.any()


@pytest.fixture
def watch(monkeypatch):
    """The process's device watch, polled by the test on a clock it moves."""
    now = [0.0]
    fake = DeviceWatch(thread=False, clock=lambda: now[0])
    fake.now = now  # type: ignore[attr-defined]
    monkeypatch.setattr(waits, "_watch", fake)
    return fake


def test_an_nccl_wait_is_stream_ordered_and_a_stall_found_off_the_host_fails_the_link(watch) -> None:
    fabric = Fabric()
    t1 = LinkTransport(_groups(fabric, 1), group=PP, epoch=0.0)  # type: ignore[arg-type]
    (handle,) = t1.batch_p2p([_op(False, torch.zeros(2), 0)])
    assert handle.wait(0.05)  # at once: the stream waits for the receive, the host goes on
    assert handle.work.waits == [()]  # type: ignore[attr-defined]  # never NCCL's own (blocking) bounded wait
    assert watch.poll() == 1 and handle.device_ops()[0].landed() is None  # type: ignore[attr-defined]
    watch.now[0] = 0.06
    assert watch.poll() == 0 and handle.device_ops()[0].landed() is False  # type: ignore[attr-defined]
    group = t1.groups.group(0).group("fwd")
    assert group.broken.startswith("stalled: not completed on the device within 0.06 s")  # type: ignore[attr-defined]
    stalled = r"stage 1 \(rank 1\): receive from stage 0 on link 0 \(fwd\) stalled on the link's default path"
    with pytest.raises(LinkFailedError, match=stalled) as err:
        t1.batch_p2p([_op(False, torch.zeros(2), 0)])
    assert (err.value.link, err.value.direction) == (0, "fwd")
    assert t1.batch_p2p([_op(True, torch.zeros(2), 0)])  # the other direction is not this stall's


def test_an_nccl_op_that_completes_lands_with_its_time(watch) -> None:
    fabric = Fabric()
    t0 = LinkTransport(_groups(fabric, 0), group=PP, epoch=0.0)  # type: ignore[arg-type]
    t1 = LinkTransport(_groups(fabric, 1), group=PP, epoch=0.0)  # type: ignore[arg-type]
    got = torch.zeros(2)
    (recv,) = t1.batch_p2p([_op(False, got, 0)])
    recv.wait(5.0)
    stamps: list[float] = []
    op = recv.device_ops()[0]  # type: ignore[attr-defined]
    op.when_landed(stamps.append)
    watch.now[0] = 1.5
    assert watch.poll() == 1 and stamps == []
    t0.batch_p2p([_op(True, torch.full((2,), 3.0), 1)])
    watch.now[0] = 2.0
    assert watch.poll() == 0 and stamps == [2.0] and op.landed() is True and torch.equal(got, torch.full((2,), 3.0))


def test_poll_until_backs_off_and_stops_at_the_deadline() -> None:
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    assert not poll_until(lambda: False, 0.01, clock=lambda: now[0], sleep=sleep, first_s=1e-3, max_s=4e-3)
    assert sleeps[:3] == [1e-3, 2e-3, 4e-3] and max(sleeps) <= 4e-3 and now[0] == pytest.approx(0.01)
    calls = iter([False, False, True])
    assert poll_until(lambda: next(calls), 1.0, clock=lambda: now[0], sleep=sleep)


def test_probes_order_send_and_receive_so_one_stream_per_pair_completes() -> None:
    fabric = Fabric()
    made: list[FakePair] = []
    g0, g1 = _groups(fabric, 0, made=made), _groups(fabric, 1, made=made)
    out: dict[int, object] = {}
    threads = [
        threading.Thread(target=lambda g=g, i=i: out.__setitem__(i, g.probe(0, "1.1", 2.0)))
        for i, g in enumerate((g0, g1))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert out[0] is not None and out[1] is not None
    probed = [p for p in made if p.tag.startswith("probe")]
    assert len(probed) == 4 and all(p.moved for p in probed)  # both directions, tensors via the group's device
    assert not any(p.broken for p in probed)


def test_pair_group_tensors_go_to_the_group_device() -> None:
    group = PairGroup.__new__(PairGroup)
    group.device = torch.device("meta")
    assert group.tensor(torch.ones(2)).device.type == "meta"
    group.device = None
    assert group.tensor(torch.ones(2)).device.type == "cpu"


def test_nccl_pair_groups_time_out_after_titan_morph_and_only_clean_up(monkeypatch) -> None:
    seen: dict[str, object] = {}

    class FakeNCCL:
        class Options:
            _timeout = None

        def __init__(self, store, rank, size, opts) -> None:
            seen["env"] = {k: os.environ.get(k) for k in pairs.NCCL_PAIR_ENV}
            seen["timeout"] = opts._timeout.total_seconds()

        def eager_connect_single_device(self, device) -> None:
            seen["device"] = device

        def _set_default_timeout(self, td) -> None:
            seen["set"] = td.total_seconds()

    monkeypatch.setattr(dist, "ProcessGroupNCCL", FakeNCCL, raising=False)
    monkeypatch.setattr(pairs, "_env_applied", False)
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT", raising=False)
    pg = pairs._nccl_group(dist.HashStore(), 0, 100.0, torch.device("meta"))
    assert seen["env"] == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2", "TORCH_NCCL_BLOCKING_WAIT": "0"}
    assert seen["timeout"] > 100.0 + 30 and seen["device"] == torch.device("meta")
    group = PairGroup.__new__(PairGroup)
    group.pg, group.backend = pg, "nccl"
    group.set_timeout(10.0)
    assert seen["set"] > 10.0 + 30


def test_the_pair_env_is_written_once_by_the_builder_never_while_threads_make_groups(monkeypatch) -> None:
    """ProcessGroupNCCL reads its error handling from the environment only; writing the environment
    while another thread reads it is unsafe. The builder's thread writes it once and for good; groups
    made later (a prober thread's) find it set and write nothing."""
    writes: list[tuple[str, str]] = []

    class Environ(dict):
        def __setitem__(self, key, value) -> None:
            writes.append((key, value))
            super().__setitem__(key, value)

    environ = Environ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
    monkeypatch.setattr(pairs.os, "environ", environ)
    monkeypatch.setattr(pairs, "_env_applied", False)
    fabric = Fabric()
    LinkGroups(stage=0, num_stages=2, namespace="t", backend="nccl", make_group=lambda *a: FakePair(fabric, *a[:3]))
    assert writes == [("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"), ("TORCH_NCCL_BLOCKING_WAIT", "0")]
    made = threading.Thread(target=pairs.apply_pair_env)
    made.start()
    made.join(5)
    assert len(writes) == 2 and dict(environ) == pairs.NCCL_PAIR_ENV  # kept: later groups read the same


def test_torch_handles_on_nccl_wait_on_the_stream_and_raise_a_stall_at_the_next_wait(watch) -> None:
    from titan_morph.comm.records import CommTimeoutError
    from titan_morph.comm.transport import Stalls, TorchHandle

    fabric = Fabric()
    stalls = Stalls()
    pending = fabric.post("g", 0, False, torch.zeros(1))
    assert TorchHandle(pending, (), device=True, stalls=stalls).wait(0.05) and pending.waits == [()]
    watch.now[0] = 1.0
    watch.poll()
    later = fabric.post("g", 0, False, torch.zeros(1))
    with pytest.raises(CommTimeoutError, match="not completed on the device within 1 s"):
        TorchHandle(later, (), device=True, stalls=stalls).wait(0.05)
    assert later.waits == []


def test_later_probes_reuse_the_last_good_probe_groups() -> None:
    fabric = Fabric()
    made: list[FakePair] = []
    groups = (_groups(fabric, 0, made=made), _groups(fabric, 1, made=made))

    def probe_both(attempt: str, reuse: tuple) -> list:
        out: list = [None, None]

        def run(i: int) -> None:
            out[i] = groups[i].probe(0, attempt, 2.0, reuse=reuse[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        return out

    first = probe_both("1.1", (None, None))
    before = len(made)
    again = probe_both("1.2", tuple(first))
    assert again == first and len(made) == before  # the same groups, no new communicator
    assert not any(p.broken for p in made)
