"""The lab benchmarks' common ending: run into a log folder (a temporary one unless given), or only
re-read it, then print the report and keep it as markdown."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["run_then_report"]


def run_then_report(
    prefix: str,
    logdir: Path | None,
    report_only: bool,
    run: Callable[[Path], None],
    report: Callable[[Path], str],
    out: Path | None,
) -> str:
    """``run(folder)`` unless ``report_only``, then ``report(folder)``: printed, and written to ``out``."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        folder = (logdir or Path(tmp)).resolve()
        if not report_only:
            run(folder)
        text = report(folder)
    print()
    print(text)
    if out:
        out.write_text(text + "\n")
    return text
