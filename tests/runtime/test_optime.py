"""The op timing interface with a fake device clock: CUDA-event op times are device times, read
back at their step's end by polling (never synchronising the device), and feed that step's record,
which the monitor reads."""

from __future__ import annotations

import pytest

from tests.launch import run_ranks
from titan_morph.comm.machine.devices import StreamMarks
from titan_morph.runtime.optime import CLOCK_CODES, DeviceClockTimer, EventTimer, HostTimer, op_timer
from titan_morph.runtime.testbed import DeviceClock

TARGETS_MS = {"F": 4.0, "I": 3.0, "W": 2.0, "B": 5.0}


class FakeStream:
    """A device queue: ``tail`` is when the work enqueued so far ends (device seconds), ``done`` how
    far the device has run. Events complete once the device has passed them; nothing blocks."""

    def __init__(self, t0: float = 100.0) -> None:
        self.tail = self.done = t0

    def launch(self, ms: float) -> None:
        self.tail += ms / 1e3


class FakeEvent:
    def __init__(self, stream: FakeStream) -> None:
        self.stream, self.t = stream, None

    def record(self, stream=None) -> None:
        self.t = self.stream.tail

    def query(self) -> bool:
        return self.t is not None and self.t <= self.stream.done

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) * 1e3

    def synchronize(self) -> None:
        raise AssertionError("the op timer must never synchronise with the device")


def _timer(stream: FakeStream, host: list[float]) -> EventTimer:
    return EventTimer(marks=StreamMarks(lambda: FakeEvent(stream), lambda: None, lambda: host[0]))


def test_event_times_are_device_times_known_only_once_the_device_ran_them() -> None:
    stream, host = FakeStream(100.0), [100.0]
    timer = _timer(stream, host)
    timer.start_step()
    for kind, mb in (("F", 0), ("F", 1), ("W", 0)):
        token = timer.begin()
        stream.launch(TARGETS_MS[kind])  # the launch returns at once: the host clock does not move
        assert timer.end(token, kind, mb, 3) is None
    assert timer.collect() == [] and timer.pending() == 3  # the device has not run them yet
    stream.done = 100.0045  # the first op ran, the second not yet
    (first,) = timer.collect()
    assert (first.kind, first.mb, first.stage) == ("F", 0, 3)
    assert first.ms == pytest.approx(4.0) and first.start_s == pytest.approx(100.0)
    stream.done = stream.tail
    spans = timer.collect()
    assert [(s.kind, round(s.ms, 6)) for s in spans] == [("F", 4.0), ("W", 2.0)]
    assert spans[0].start_s == pytest.approx(first.end_s) and timer.pending() == 0


def test_a_steps_end_waits_for_its_own_ops_by_polling_and_within_its_bound() -> None:
    import threading
    import time

    stream, host = FakeStream(100.0), [100.0]
    timer = _timer(stream, host)
    timer.start_step()
    for kind, mb in (("F", 0), ("I", 0), ("W", 0)):
        token = timer.begin()
        stream.launch(TARGETS_MS[kind])
        timer.end(token, kind, mb, 1)
    runs = threading.Timer(0.05, lambda: setattr(stream, "done", stream.tail))  # the device finishes later
    runs.start()
    t0 = time.monotonic()
    spans = timer.settle(5.0)  # FakeEvent.synchronize would raise: only query() is used
    runs.join()
    assert 0.04 <= time.monotonic() - t0 < 2.0
    assert [(s.kind, round(s.ms, 6)) for s in spans] == [("F", 4.0), ("I", 3.0), ("W", 2.0)]
    assert timer.pending() == 0  # this step's own ops, in this step's record: nothing left for the next
    token = timer.begin()
    stream.launch(10.0)
    timer.end(token, "F", 1, 1)
    assert timer.settle(0.05) == [] and timer.pending() == 1  # the bound holds; the span comes later
    stream.done = stream.tail
    assert [s.mb for s in timer.collect()] == [1]


def test_a_busy_queue_shifts_the_ops_but_not_their_device_times() -> None:
    stream, host = FakeStream(100.0), [100.0]
    stream.launch(50.0)  # the previous step's work still queued when this step starts
    timer = _timer(stream, host)
    timer.start_step()
    token = timer.begin()
    stream.launch(3.0)
    timer.end(token, "I", 0, 0)
    stream.done = stream.tail
    (span,) = timer.collect()
    assert span.ms == pytest.approx(3.0)  # not the 53 ms a host clock around the wait would show


def test_the_clock_follows_the_stage() -> None:
    import torch

    assert isinstance(op_timer(None, torch.device("cpu")), HostTimer)
    assert isinstance(op_timer(DeviceClock(), torch.device("cpu")), DeviceClockTimer)
    cuda = op_timer(None, torch.device("cuda", 1))
    assert isinstance(cuda, EventTimer) and cuda.clock == "cuda"
    assert set(CLOCK_CODES) == {"host", "testbed", "cuda"}


def _worker(rank: int, world: int, use_events: bool) -> dict:
    import threading

    import torch
    from torch.distributed.pipelining import PipelineStage

    from tests.runtime.test_morph_schedule import MICROBATCHES, _build_model, _data, _plans
    from titan_morph.runtime.schedule import MorphSchedule

    part = _build_model(world)[rank]
    stage = PipelineStage(part, rank, world, torch.device("cpu"))
    timer = None
    if use_events:
        stream, host = FakeStream(0.0), [0.0]
        timer = EventTimer(marks=StreamMarks(lambda: FakeEvent(stream), lambda: None, lambda: host[0]))
        start_step = timer.start_step

        def step_begins() -> None:  # the device catches up with everything queued before this step
            stream.done = stream.tail
            start_step()

        timer.start_step = step_begins  # type: ignore[method-assign]
        settle = timer.settle

        def step_ends(timeout_s: float) -> list:  # the device runs the queue while the host polls its end
            threading.Timer(0.01, lambda: setattr(stream, "done", stream.tail)).start()
            return settle(timeout_s)

        timer.settle = step_ends  # type: ignore[method-assign]
        for name, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "I"), ("backward_weight_one_chunk", "W")):
            inner = getattr(stage, name)

            def launched(*args, _inner=inner, _kind=kind, **kwargs):
                full = _kind == "I" and kwargs.get("full_backward", True)
                stream.launch(TARGETS_MS["B" if full else _kind])
                return _inner(*args, **kwargs)

            setattr(stage, name, launched)
    first, _ = _plans("zb-h2", world)
    schedule = MorphSchedule([stage], MICROBATCHES, torch.nn.MSELoss(), plan=first, op_timer=timer)
    out: dict = {"losses": [], "records": []}
    opt = torch.optim.SGD(part.parameters(), lr=0.05)
    for it in range(3):
        x, y = _data(it)
        opt.zero_grad()
        losses: list = []
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
            out["losses"].append([loss.item() for loss in losses])
        opt.step()
        rec = schedule.records[-1]
        out["records"].append((rec.op_clock, dict(rec.compute_ms), len(rec.op_ms)))
        out["clock"] = schedule.tensorboard_metrics(it + 1)["morph/op_clock"]
    return out


@pytest.mark.timeout(300)
def test_cuda_event_op_times_feed_their_own_steps_record_and_losses_stay() -> None:
    from tests.runtime.test_morph_schedule import MICROBATCHES

    host = run_ranks(_worker, 2, False, timeout=180, pg_timeout_s=60)
    events = run_ranks(_worker, 2, True, timeout=180, pg_timeout_s=60)
    assert events[-1]["losses"] == host[-1]["losses"]
    for r in range(2):
        assert host[r]["clock"] == CLOCK_CODES["host"] and events[r]["clock"] == CLOCK_CODES["cuda"]
        for clock, compute, ops in events[r]["records"]:  # step 1 included: no step's times lag
            assert clock == "cuda" and ops == 3 * MICROBATCHES
            assert compute == pytest.approx({k: MICROBATCHES * TARGETS_MS[k] for k in ("F", "I", "W")})
