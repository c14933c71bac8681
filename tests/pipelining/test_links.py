"""Link models: the random stragglers' model stays deterministic and bounded over a long run."""

from __future__ import annotations

import pickle
import random
import tracemalloc

from titan_morph.pipelining.core.stragglers import RandomDelays


def _model(**kw) -> RandomDelays:
    return RandomDelays(3, mean=30.0, std=10.0, interval=(100.0, 200.0), seed=7, **kw)


def test_random_delays_same_value_whatever_the_query_order() -> None:
    """Every rank asks at its own times; a time already left behind (an old step the simulator
    replays) must read the same delay as on a rank that never went past it."""
    rng = random.Random(1)
    times = [rng.uniform(0.0, 600_000.0) for _ in range(300)]
    times += [t + d for t in times[:50] for d in (0.0, 0.5, 99.0)]
    forward, shuffled = _model(), _model()
    want = {(link, t): forward.delay_ms(link, "fwd", t) for t in sorted(times) for link in range(3)}
    order = list(want)
    random.Random(2).shuffle(order)
    for link, t in order:
        assert shuffled.delay_ms(link, "bwd", t) == want[(link, t)]
    assert len({round(v, 9) for v in want.values()}) > 100  # really redrawn over time
    assert forward.delay_ms(0, "fwd", -5.0) == forward.delay_ms(0, "fwd", 0.0)  # before the epoch: the first draw


def test_random_delays_memory_is_bounded_over_a_long_run() -> None:
    """Four hours, one question every 10 s: the model keeps two windows of change points, not the
    run (~1e5 of them here)."""
    model = _model()
    early = [model.delay_ms(0, "fwd", t) for t in (0.0, 1_000.0, 50_000.0)]
    model.delay_ms(0, "fwd", 600_000.0)  # fill the window once
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for t in range(600_000, 4 * 3_600_000, 10_000):
            model.delay_ms(0, "fwd", float(t))
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 200_000, f"the model grew {grown} bytes over the run"
    assert [model.delay_ms(0, "fwd", t) for t in (0.0, 1_000.0, 50_000.0)] == early  # drawn again from the seed


def test_random_delays_answer_an_old_time_with_one_window_of_draws() -> None:
    """A time ten hours back costs the draws of its window, not of the run before it; the newest
    window stays held for the transports while the old one is asked about."""
    model = _model()
    changes = model.window_ms / model.interval[0]  # the most a window can hold
    late = model.delay_ms(1, "fwd", 36_000_000.0)
    assert model.held(1) <= changes
    old = [model.delay_ms(1, "fwd", t) for t in (1_000.0, 1_500.0, 60_000.0)]
    assert model.held(1) <= 2 * changes
    assert model.delay_ms(1, "fwd", 36_000_000.0) == late and model.held(1) <= 2 * changes
    assert old == [_model().delay_ms(1, "fwd", t) for t in (1_000.0, 1_500.0, 60_000.0)]
    copy = pickle.loads(pickle.dumps(model))  # e.g. handed to a spawned rank
    assert copy.delay_ms(1, "fwd", 36_000_000.0) == late and copy.delay_ms(1, "fwd", 1_000.0) == old[0]


def test_random_delays_first_window_is_the_links_seed_stream() -> None:
    """Within the first window a link's changes are the draws of its (seed, link) stream in one
    order -- interval, then delay -- the stream a run shorter than a window has always seen."""
    model = _model()
    rng = random.Random("7:2")
    at, delay, expect = 0.0, max(0.0, rng.gauss(30.0, 10.0)), []
    while at < model.window_ms:
        expect.append((at, delay))
        at, delay = at + rng.uniform(100.0, 200.0), max(0.0, rng.gauss(30.0, 10.0))
    for (start, value), (end, _) in zip(expect, expect[1:]):
        assert model.delay_ms(2, "bwd", start) == value and model.delay_ms(2, "fwd", (start + end) / 2) == value
    assert model.delay_ms(2, "fwd", model.window_ms) != expect[-1][1]  # the next window draws afresh


def test_random_delays_inactive_links_have_no_delay() -> None:
    model = _model(links=(1,))
    assert {model.delay_ms(link, "fwd", t) for link in (0, 2) for t in (0.0, 5e5)} == {0.0}
    assert model.delay_ms(1, "fwd", 5e5) >= 0.0
