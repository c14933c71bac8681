"""What the planner's command lines share (``plan`` in :mod:`plan`, ``partition`` in
:mod:`partition`): one error type and the parsers of their common flags, so that a bad value
reads the same in both, one ``error:`` line naming the flag and its allowed range, exit code 2.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from titan_morph.pipelining.core.links import parse_delays
from titan_morph.pipelining.core.values import N, parse_list
from titan_morph.pipelining.search.builders import schedule_key

__all__ = ["UsageError", "Parser", "schedule_arg", "values_arg", "delays_arg", "transmit_arg"]


class UsageError(Exception):
    """A bad command-line setting: printed as one ``error:`` line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one :class:`UsageError` line instead of usage + error."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def schedule_arg(text: str) -> str:
    """``--schedule``'s type: any spelling :func:`builders.schedule_key` accepts, as its one name."""
    try:
        return schedule_key(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def values_arg(flag: str, text: str | None, kind: type[N], count: int | None, low: float | None) -> tuple[N, ...]:
    """A comma list of ``kind`` for ``flag``: one value (for all) or ``count``, each >= ``low``."""
    try:
        return parse_list(text, kind, name=flag, count=count, low=low)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def delays_arg(flag: str, text: str | None, links: int) -> tuple[float, ...]:
    """Per-link delays (ms) for ``flag``: one value or one per link, ``inf`` = down."""
    try:
        return parse_delays(text, links, name=flag)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def transmit_arg(flag: str, text: str | None, links: int) -> tuple[float, ...]:
    """Per-link transmit times (ms per message) for ``flag``: finite, one value or one per link."""
    try:
        return parse_delays(text, links, name=flag, allow_inf=False)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
