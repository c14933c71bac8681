"""On one GPU (``pytest -m gpu tests/gpu``; skipped without CUDA): the premises of the NCCL waits
and of several pipeline ranks sharing the device.

* the device watch (:mod:`titan_morph.comm.waits`) on a real CUDA queue: a stream-ordered wait
  returns on the host at once behind ~100 ms of queued matmuls, and the watch stamps the operation
  once the device has run it (NCCL's own two-rank paths cannot run on one GPU: the event of a
  queued copy stands in for its work);
* ``./run_train.sh`` trains the llama3 debug model with PP = 4 on one GPU: the four ranks share it
  over Gloo and the delegated pipeline, say so, and time their ops with CUDA events.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from tests.launch import launch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class _EventWork:
    """A ``dist.Work`` of the device's queue, as NCCL's: ``wait()`` orders the current stream after
    it, ``is_completed()`` queries its end event."""

    def __init__(self, event: torch.cuda.Event) -> None:
        self.event = event

    def wait(self) -> bool:
        torch.cuda.current_stream().wait_event(self.event)
        return True

    def is_completed(self) -> bool:
        return bool(self.event.query())


def test_a_stream_ordered_wait_leaves_the_host_free_and_the_watch_stamps_the_landing() -> None:
    from titan_morph.comm.waits import DeviceOp, DeviceWatch, stream_wait

    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    for _ in range(40):  # ~100 ms or more of matmuls queued ahead of the "receive"
        a = (a @ a).tanh_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    done = torch.cuda.Event()
    with torch.cuda.stream(side):
        buf = torch.empty(1 << 20, device="cuda").fill_(1.0)
        done.record(side)
    op = DeviceOp(_EventWork(done))
    watch = DeviceWatch()
    t0 = time.monotonic()
    stream_wait(op, 60.0, lambda s: pytest.fail(f"stalled after {s} s"), watch)
    host_ms = (time.monotonic() - t0) * 1e3
    assert op.landed() is None, "the device had not run it yet: the queue was too short to tell"
    consumer = buf.sum()  # queued behind the wait
    torch.cuda.synchronize()
    deadline = time.monotonic() + 5.0
    while op.landed() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert host_ms < 5.0, f"the host waited {host_ms:.2f} ms"
    assert op.landed() is True and op.landed_at is not None and op.landed_at >= t0
    assert consumer.item() == float(1 << 20)


def test_run_train_trains_pp4_on_one_gpu(tmp_path: Path) -> None:
    dump = tmp_path / "run"
    env = {"NGPU": "4", "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    cmd = ["./run_train.sh", "--training.steps", "3", "--training.seq_len", "64", "--job.dump_folder", str(dump)]
    result = launch(cmd, dump, timeout_s=100, env=env)
    assert result.returncode == 0, result.tail()
    assert "4 ranks share 1 GPU(s)" in result.output or "ranks share a GPU" in result.output, result.tail()
    assert sorted(result.losses()) == [1, 2, 3], result.tail()
    assert set(result.scalars("morph/op_clock").values()) == {2.0}  # CUDA events
