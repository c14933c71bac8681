"""The plan timeline is drawn in a child process, returned once per plan, and nothing is left behind."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.search.builders import build
from titan_morph.runtime.metrics import TimelineRenderer


def _folders() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("titan_morph_tl*"))


def _child(renderer: TimelineRenderer) -> int | None:
    job = renderer._job
    return None if job is None else job[0].pid


def test_the_timeline_is_drawn_by_a_child_and_returned_once_per_plan() -> None:
    before = _folders()
    renderer = TimelineRenderer()
    plan = build("pipemorph", CostModel.uniform(4, 8, 10.0, 10.0, 10.0))
    assert renderer.image(plan, "plan") is None
    pid = _child(renderer)
    assert pid is not None and pid != os.getpid()  # drawing in another process
    deadline = time.monotonic() + 120.0
    while (img := renderer.image(plan, "plan")) is None:
        assert time.monotonic() < deadline, "no picture within 120 s"
        time.sleep(0.05)
    assert img.ndim == 3 and img.shape[2] == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert 0.0 <= float(img.min()) and float(img.max()) <= 1.0 and float(img.min()) < float(img.max())
    assert renderer.image(plan, "plan") is None and _child(renderer) is None  # this plan is drawn once
    assert _folders() <= before


def test_close_stops_the_render_in_progress_and_leaves_nothing() -> None:
    before = _folders()
    renderer = TimelineRenderer()
    plan = build("pipemorph", CostModel.uniform(4, 12, 10.0, 10.0, 10.0))
    assert renderer.image(plan, "plan") is None
    pid = _child(renderer)
    assert pid is not None
    renderer.close(30.0)
    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped
    assert _folders() <= before
    assert renderer.image(plan, "plan") is None and _child(renderer) is None  # asked for once
    renderer.close(30.0)  # nothing in progress: returns at once
