"""The bound of every titan_morph wait: TorchTitan's own ``[comm]`` timeouts.

TorchTitan starts its process groups with ``[comm] init_timeout_seconds`` and, once the first
training step has completed, shortens them to ``[comm] train_timeout_seconds`` (the first step
also compiles, warms caches and allocates). The transports follow the same rule, so a hung peer
ends the job within the time the job configured, whichever layer it hangs in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_TIMEOUTS", "CommTimeouts"]


@dataclass(frozen=True)
class CommTimeouts:
    """``init_s`` bounds waits during start-up and step 1, ``train_s`` every later wait (seconds)."""

    init_s: float = 300.0
    train_s: float = 100.0

    def __post_init__(self) -> None:
        for name in ("init_s", "train_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"CommTimeouts.{name} must be a finite number of seconds > 0, got {value!r}")

    def for_step(self, step: int) -> float:
        """The bound of a wait in training step ``step`` (TorchTitan counts from 1; 0 = start-up)."""
        return self.init_s if step <= 1 else self.train_s

    @classmethod
    def of(cls, comm: Any) -> CommTimeouts:
        """From TorchTitan's ``job_config.comm`` (``init_timeout_seconds``, ``train_timeout_seconds``)."""
        return cls(float(comm.init_timeout_seconds), float(comm.train_timeout_seconds))

    @classmethod
    def fixed(cls, seconds: float) -> CommTimeouts:
        """The same bound during start-up and training."""
        return cls(seconds, seconds)


DEFAULT_TIMEOUTS = CommTimeouts()
"""TorchTitan 0.2.2's defaults (300 s, 100 s), for transports built outside a training job."""
