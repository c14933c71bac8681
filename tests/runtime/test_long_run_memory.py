"""A long run's memory is flat: what a MorphSchedule keeps per step is bounded.

Two real gloo ranks run a tiny pipeline for hundreds of steps through the link emulator under
random stragglers (a time-keyed model whose windows the run crosses many times), with the per-step
exchange and the monitor, as a production run does.
Every rank's Python heap (``tracemalloc``) after the warm-up and at the end must be the same within
80 bytes a step, and each bounded structure must sit within its cap (the summary's samples get a
small one, so that they are full before the measurement).

The link model's own arrays are left out of the heap and checked by their count instead: a window
of change points fills as the run crosses it and the next one replaces it, a sawtooth of ~12 KB a
link that a two-point reading would catch at any phase. Measured (this heap, every 50 steps of
700): rank 0 +9.9 KB at step 200 over step 50, +19.6 KB at 500, +22.8 KB at 700; rank 1 +11.3,
+15.9, +14.5 KB. What still grows on rank 0 (~35 then ~16 bytes a step) was traced to torch's
``torch.tensor(list)`` in the per-step exchange and is not bounded here; the budget lets it pass
and fails a window left unbounded (the monitor's stage times without ``maxlen``: +66.5 KB over
the same 300 steps). ``python -m tests.runtime.test_long_run_memory STEPS EVERY`` prints the trace.
"""

from __future__ import annotations

import pytest

from tests.launch import run_ranks

MICROBATCHES, BATCH, WIDTH = 4, 8, 8
WARMUP, STEPS = 200, 500
BUDGET = 24_000  # bytes of heap growth over STEPS - WARMUP steps (80 a step); measured 11.7 KB
SAMPLE_CAP = 8


def _worker(rank: int, world: int, steps: int, marks: tuple[int, ...]) -> dict:
    import fnmatch
    import gc
    import tracemalloc

    import torch
    from torch import nn
    from torch.distributed.pipelining import PipelineStage

    from titan_morph.comm import EmulatedTransport, TorchTransport, sync_clock
    from titan_morph.monitor.adapt import AdaptPolicy, Monitor
    from titan_morph.pipelining.core import links as links_module
    from titan_morph.pipelining.core import stragglers as stragglers_module
    from titan_morph.pipelining.core.model import CostModel
    from titan_morph.pipelining.core.stragglers import RandomDelays
    from titan_morph.pipelining.search.builders import build
    from titan_morph.runtime.schedule import RECORDS_KEPT, MorphSchedule
    from titan_morph.runtime.summary import StepHistory

    torch.manual_seed(0)
    part = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
    stage = PipelineStage(part, rank, world, torch.device("cpu"))
    plan = build("zb-h2", CostModel.uniform(world, MICROBATCHES, 1.0, 1.0, 1.0))
    # a window of 512 x 3 ms: the run crosses a few dozen of them
    links = RandomDelays(world - 1, 1.0, 0.5, (2.0, 4.0), seed=3)
    clock = sync_clock()
    transport = EmulatedTransport(
        TorchTransport(clock.epoch), links, stage=rank, num_stages=world, depth=2, epoch=clock.epoch
    )
    monitor = Monitor(
        num_stages=world,
        microbatches=MICROBATCHES,
        initial_plan=plan,
        fallback_times=((1.0, 1.0, 1.0),) * world,
        policy=AdaptPolicy(enabled=False),
    )
    schedule = MorphSchedule([stage], MICROBATCHES, nn.MSELoss(), plan=plan, transport=transport, monitor=monitor)
    schedule.history = StepHistory(cap=SAMPLE_CAP)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    own = (links_module.__file__, stragglers_module.__file__)  # the link model's files

    def heap() -> int:
        gc.collect()
        traces = tracemalloc.take_snapshot().traces
        return sum(t.size for t in traces if not any(fnmatch.fnmatch(t.traceback[0].filename, f) for f in own))

    heaps = []
    tracemalloc.start()
    try:
        for step in range(1, steps + 1):
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=y, losses=[])
            if step in marks:
                heaps.append((step, heap()))
    finally:
        tracemalloc.stop()
        transport.close()
    phases = schedule.history.phases()
    return {
        "heaps": heaps,
        "records": len(schedule.records),
        "records_cap": RECORDS_KEPT,
        "sampled": max(len(s) for s in phases.values()),
        "steps": len(schedule.history),
        "held": max(links.held(link) for link in range(world - 1)),
        "window_max": 2 * links.window_ms / links.interval[0],
        "pending": len(transport.take_records()),
        "detector": max(len(s.recent) for s in monitor.detector.links),
        "detect_steps": monitor.detector.rule.detect_steps,
    }


def _heap_trace(steps: int = 1500, every: int = 50) -> None:
    """The heap of both ranks every ``every`` steps of a ``steps``-step run (where the warm-up ends)."""
    for rank, got in enumerate(run_ranks(_worker, 2, steps, tuple(range(every, steps + 1, every)), timeout=1800)):
        first = got["heaps"][0][1]
        print(f"rank {rank}:", " ".join(f"{s}:{(h - first) / 1024:+.1f}" for s, h in got["heaps"]), "KB")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_long_run_keeps_a_flat_heap_and_every_structure_within_its_cap() -> None:
    for rank, got in enumerate(run_ranks(_worker, 2, STEPS, (WARMUP, STEPS), timeout=240)):
        assert got["steps"] == STEPS, got
        assert got["records"] == got["records_cap"], got  # the schedule's step records: the newest few
        assert got["sampled"] <= SAMPLE_CAP, got
        assert got["held"] <= got["window_max"], got  # the link model: two windows of change points
        assert got["pending"] == 0, got  # the transport's records are taken every step
        assert got["detector"] <= got["detect_steps"], got  # the detector's window of recent steps
        (_, start), (_, end) = got["heaps"]
        grown = end - start
        assert grown < BUDGET, f"rank {rank}: the heap grew {grown} bytes over {STEPS - WARMUP} steps"


if __name__ == "__main__":
    import sys

    _heap_trace(*map(int, sys.argv[1:]))
