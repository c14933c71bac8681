"""The configuration each run will see, resolved before anything is launched.

Every run's arguments go through the launcher's own reading (TorchTitan's ``ConfigManager`` with
``[morph]``, then :func:`titan_morph.config.resolve`), so a typo in an override is one clear error
instead of a failed job minutes later, and the simulator gets the exact cost model and link model
of the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from titan_morph.config import ConfigError, Settings

__all__ = ["ComparisonError", "resolve_settings"]


class ComparisonError(ValueError):
    """Bad harness input (config, overrides, steps); the message says which and why."""


def resolve_settings(config: Path, overrides: Sequence[str]) -> Settings:
    """The resolved settings of ``--job.config_file config *overrides``; one error line when bad."""
    from titan_morph.integration.release import current

    try:
        return current().load(config, overrides)[1]
    except ConfigError as err:
        raise ComparisonError(f"{config}: {err}") from None
