"""The one parser for list-valued settings: ``"0,0,60"`` on a command line, ``[0, 0, 60]`` in TOML.

Per-link delays, per-stage times, link ids and memory budgets are all lists of numbers that users
write either as a comma-separated string or as a list; a single value stands for every element.
Every caller (the planning CLI, the ``[morph]`` config, the comparison harness) parses them here, so
the accepted forms and the error messages are the same everywhere. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import SupportsFloat, SupportsIndex, TypeVar

__all__ = ["parse_list"]

N = TypeVar("N", int, float)


def _item(raw: object, kind: type[N], name: str) -> N:
    """One value as ``kind``; an integer may be written ``2`` or ``2.0``, never ``2.5`` or ``True``."""
    what = "an integer" if kind is int else "a number"
    shown = raw.strip() if isinstance(raw, str) else raw
    if isinstance(raw, bool) or not isinstance(raw, (str, SupportsFloat)):
        raise ValueError(f"{name}: {shown!r} is not {what}")
    try:
        if isinstance(raw, str):
            return kind(raw.strip())
        if isinstance(raw, SupportsIndex):  # an integer type: exact, however large
            return kind(raw)
        value = float(raw)
        if kind is int and not value.is_integer():
            raise ValueError
        return kind(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name}: {shown!r} is not {what}") from None


def parse_list(
    spec: str | Sequence[object] | float | int | None,
    kind: type[N] = float,  # type: ignore[assignment]  # mypy cannot type a TypeVar default (python/mypy#3737)
    *,
    name: str,
    count: int | None = None,
    low: float | None = None,
    high: float | None = None,
    allow_inf: bool = False,
    sep: str = ",",
) -> tuple[N, ...]:
    """Parse ``spec`` into a tuple of ``kind`` values.

    ``spec`` is a ``sep``-separated string (``"0,0,60"``), a sequence (``[0, 0, 60]``) or a scalar;
    ``""``, ``None`` and ``[]`` give ``()``. With ``count``, one value is repeated ``count`` times and
    any other length but ``count`` is an error. Values must lie in ``[low, high]`` (each bound
    optional) and be finite unless ``allow_inf``. Errors are ``ValueError`` naming ``name``, the value
    and what is allowed.
    """
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        raw: list[object] = []
    elif isinstance(spec, str):
        raw = list(spec.split(sep))
    elif isinstance(spec, (int, float)) and not isinstance(spec, bool):
        raw = [spec]
    elif isinstance(spec, Sequence):
        raw = list(spec)
    else:
        raise ValueError(f"{name}: expected a list or a {sep!r}-separated string, got {type(spec).__name__}")
    values = [_item(r, kind, name) for r in raw]
    if count is not None and values:
        if len(values) == 1:
            values *= count
        if len(values) != count:
            raise ValueError(f"{name} needs 1 or {count} values, got {len(values)}: {spec!r}")
    for v in values:
        if math.isnan(v) or (math.isinf(v) and not allow_inf):
            raise ValueError(f"{name}: {v!r} is not allowed (values must be finite numbers)")
        if (low is not None and v < low) or (high is not None and v > high):
            bounds = (
                f"in [{low:g}, {high:g}]"
                if low is not None and high is not None
                else (f">= {low:g}" if low is not None else f"<= {high:g}")
            )
            raise ValueError(f"{name}: {v:g} is out of range: values must be {bounds}")
    return tuple(values)
