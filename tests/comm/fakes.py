"""Stand-ins shared by the comm tests."""

from __future__ import annotations


class PollingEvent:
    """A CUDA event stand-in: completes after ``polls`` queries (and never blocks)."""

    def __init__(self, polls: int) -> None:
        self.polls = polls

    def query(self) -> bool:
        self.polls -= 1
        return self.polls < 0
