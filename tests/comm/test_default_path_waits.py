"""``auto``'s waits on the default path (``DefaultPathWaits``): the waiter thread settles a message
from the moment it is issued, without stamps; the consumer's wait takes its verdict and then waits
the handles itself (at once), so the consumer's stamps stay the consumer's.

The real paths (gloo pairs torn down mid-write, delegates killed) are in ``test_link_failover.py``;
these pin the hand-over with handles whose state the test sets, and that a recorded message the
waiter settled is not waited again (a gloo send or receive work takes exactly one wait).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from titan_morph.comm.failover.resend import DefaultPathWaits
from titan_morph.comm.recorded import _Handle
from titan_morph.comm.records import MessageRecord
from titan_morph.comm.transport import Settles

WAITER = "titan_morph-wait-0fwd"


class _Op:
    """A handle whose op completes when ``finished`` is set; who settled and who waited it."""

    record = None
    due_s = None
    ops = ()

    def __init__(self, done: bool = False, error: BaseException | None = None) -> None:
        self.finished = threading.Event()
        if done:
            self.finished.set()
        self.error = error
        self.settled_on: list[str] = []
        self.waited_on: list[str] = []

    def is_completed(self) -> bool:
        return self.finished.is_set()

    def _block(self, timeout: float | None) -> None:
        if not self.finished.wait(timeout):
            raise TimeoutError("bound passed")
        if self.error is not None:
            raise self.error

    def settle(self, timeout: float) -> None:
        self.settled_on.append(threading.current_thread().name)
        self._block(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        self.waited_on.append(threading.current_thread().name)
        self._block(timeout)
        return True


class _Router:
    """What ``DefaultPathWaits`` uses of the failover router: its lock, the path generation per link,
    the move callbacks, the bound and the threads it starts."""

    timeout_s = 5.0

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.gen = {0: 0}
        self.on_move: list[Any] = []
        self.closed = False
        self.started: list[str] = []

    def thread(self, target: Any, name: str) -> threading.Thread:
        self.started.append(name)
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        return t

    def where(self) -> str:
        return "rank 0"

    def move(self, link: int) -> None:
        with self.lock:
            self.gen[link] += 1
            for hook in self.on_move:
                hook(link)


def _msg() -> Any:
    return SimpleNamespace(key=(0, "fwd"), step=1, job=None)


def _waits() -> tuple[_Router, DefaultPathWaits]:
    router = _Router()
    return router, DefaultPathWaits(router)  # type: ignore[arg-type]


def test_the_waiter_settles_from_issue_and_the_consumer_stamps_its_own_wait() -> None:
    router, waits = _waits()
    msg, ops = _msg(), [_Op(), _Op()]
    waits.submit(msg, ops, 0)  # type: ignore[arg-type]
    assert router.started == [WAITER]
    for op in ops:
        op.finished.set()
    deadline = time.monotonic() + 5
    while not msg.job.done:  # settled before anyone waits
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert all(op.settled_on == [WAITER] and op.waited_on == [] for op in ops)
    assert waits.wait(msg, ops, 0, time.monotonic() + 5) is True  # type: ignore[arg-type]
    me = threading.current_thread().name
    assert [op.waited_on for op in ops] == [[me], [me]]


def test_a_consumer_that_waits_first_takes_the_verdict_when_it_comes() -> None:
    _, waits = _waits()
    msg, op = _msg(), _Op()
    handles = [op]  # the message's own list, as it carries it
    waits.submit(msg, handles, 0)  # type: ignore[arg-type]
    threading.Timer(0.05, op.finished.set).start()
    assert waits.wait(msg, handles, 0, time.monotonic() + 5) is True  # type: ignore[arg-type]
    assert op.settled_on == [WAITER] and op.waited_on == [threading.current_thread().name]


def test_a_failed_op_raises_its_error_on_the_consumer() -> None:
    _, waits = _waits()
    msg, op = _msg(), _Op(done=True, error=RuntimeError("pair closed"))
    handles = [op]
    waits.submit(msg, handles, 0)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="pair closed"):
        waits.wait(msg, handles, 0, time.monotonic() + 5)  # type: ignore[arg-type]
    assert op.settled_on == [WAITER]


def test_a_move_ends_the_wait_of_an_op_stuck_mid_write() -> None:
    router, waits = _waits()
    msg, op = _msg(), _Op()  # never completes (a send cut mid-write ends only at its bound)
    handles = [op]
    waits.submit(msg, handles, 0)  # type: ignore[arg-type]
    threading.Timer(0.05, router.move, args=(0,)).start()
    t0 = time.monotonic()
    assert waits.wait(msg, handles, 0, time.monotonic() + 5) is False  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 2.0 and op.waited_on == []


def test_a_moved_link_is_neither_submitted_nor_waited() -> None:
    router, waits = _waits()
    router.gen[0] = 1
    msg, op = _msg(), _Op(done=True)
    waits.submit(msg, [op], 0)  # type: ignore[arg-type]
    assert router.started == [] and msg.job is None
    assert waits.wait(msg, [op], 0, time.monotonic() + 5) is False  # type: ignore[arg-type]
    assert op.waited_on == [] and op.settled_on == []


class _OnceWork:
    """A gloo point-to-point work: its first wait consumes the completion, a second blocks to its bound."""

    def __init__(self) -> None:
        self.waits = 0

    def is_completed(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        if self.waits > 1:
            raise TimeoutError("a second wait on a gloo send/recv work blocks until its bound")
        return True


def test_a_recorded_message_settled_by_the_waiter_is_not_waited_again() -> None:
    clock = iter([5.0, 9.0])
    owner = SimpleNamespace(now_ms=lambda: next(clock), where=lambda: "rank 1", epoch=0.0)
    record = MessageRecord("recv", 0, "fwd", 0, 64, 1, 0, issued=1.0)
    work = _OnceWork()
    handle = _Handle(owner, [], record, [work])  # type: ignore[arg-type]
    handle.settle(5.0)  # the waiter thread, ahead of the consumer: no stamps
    assert record.waited is None and record.completed is None and handle.is_completed()
    assert handle.wait(5.0) is True  # the consumer: its own stamps, no second wait of the work
    assert work.waits == 1 and (record.waited, record.completed) == (5.0, 9.0)


class _Plain:
    """A handle that cannot settle without stamping (the link emulator's): its one wait is the waiter's."""

    record = None
    due_s = None
    ops = ()

    def __init__(self) -> None:
        self.waited_on: list[str] = []

    def is_completed(self) -> bool:
        return False

    def wait(self, timeout: float | None = None) -> bool:
        self.waited_on.append(threading.current_thread().name)
        return True


def test_a_handle_that_cannot_settle_is_waited_once_by_the_waiter_when_the_consumer_waits() -> None:
    router, waits = _waits()
    msg, plain = _msg(), _Plain()
    handles = [plain]
    assert not isinstance(plain, Settles)
    assert waits.wait(msg, handles, 0, time.monotonic() + 5) is True  # type: ignore[arg-type]
    assert router.started == [WAITER] and plain.waited_on == [WAITER]
