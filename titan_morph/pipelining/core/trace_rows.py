"""One trace file for links and ranks: which of its rows set a link and which a rank.

A trace is a CSV file whose rows each change one thing from a step (or a time) on: a row with a
``link`` sets that link's ``delay_ms`` [, ``direction``] [, ``bandwidth_mbit``] (:class:`~.stragglers.TraceDelays`),
a row with a ``rank`` sets that rank's ``compute_factor`` (:class:`~.speeds.TraceFactors`). A file
may hold either kind or both; a row naming both, or neither, is an error. For example, link 2
congested from step 5, then rate-limited, while rank 1 computes 1.5x slower for a while::

    step,link,delay_ms,bandwidth_mbit,rank,compute_factor
    5,2,40,,,
    17,2,0,20,,
    29,2,0,0,,
    9,,,,1,1.5
    21,,,,1,1

Pure Python, no torch.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TraceRows", "read_trace_rows"]


@dataclass(frozen=True)
class TraceRows:
    """A trace file's rows by kind, each with its line number; ``columns``: the header."""

    columns: frozenset[str]
    links: tuple[tuple[int, dict[str, str]], ...]
    ranks: tuple[tuple[int, dict[str, str]], ...]


def _filled(row: dict[str, str], column: str) -> bool:
    return bool((row.get(column) or "").strip())


def read_trace_rows(path: str | Path) -> TraceRows:
    """Split the rows of the trace at ``path`` by what they set (module docstring)."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        columns = frozenset(h.strip() for h in reader.fieldnames or ())
    links: list[tuple[int, dict[str, str]]] = []
    ranks: list[tuple[int, dict[str, str]]] = []
    for line, raw in enumerate(rows, 2):
        short = [k for k, v in raw.items() if v is None]
        if short:
            width = len(reader.fieldnames or ())
            raise ValueError(f"trace {path}: line {line} has {width - len(short)} fields, the header has {width}")
        row = {k.strip(): v.strip() for k, v in raw.items() if k is not None and isinstance(v, str)}
        link, rank = _filled(row, "link"), _filled(row, "rank")
        if link and rank:
            raise ValueError(f"trace {path}: line {line} names a link and a rank; a row sets one of them")
        if link or "rank" not in columns:
            links.append((line, row))
        elif rank:
            ranks.append((line, row))
        else:
            raise ValueError(f"trace {path}: line {line} names neither a link nor a rank")
    return TraceRows(columns, tuple(links), tuple(ranks))
