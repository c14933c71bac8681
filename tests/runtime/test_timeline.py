"""The plan timeline drawn in the background is finished before the process exits."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from titan_morph.pipelining.builders import build
from titan_morph.pipelining.model import CostModel
from titan_morph.runtime.metrics import TimelineRenderer


def _rendering() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "titan_morph-timeline" and t.is_alive()]


def test_close_waits_for_the_render_in_progress() -> None:
    """A daemon thread still inside matplotlib when the interpreter exits can abort the process and
    leaves its temporary folder: close() ends the render first."""
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob("titan_morph_tl*"))
    renderer = TimelineRenderer()
    plan = build("pipemorph", CostModel.uniform(4, 12, 10.0, 10.0, 10.0))
    assert renderer.image(plan, "plan") is None and _rendering()  # drawing in the background
    renderer.close(120.0)
    assert not _rendering()
    assert set(tmp.glob("titan_morph_tl*")) <= before
    assert renderer.image(plan, "plan") is None and not _rendering()  # this plan is drawn once
    renderer.close(120.0)  # nothing in progress: returns at once
