"""The job configuration each run will see, resolved before anything is launched.

Resolving every run's arguments with TorchTitan's own ``ConfigManager`` (plus titan_morph's
``[morph]`` validation) up front turns a typo in an override into one clear error instead of a
failed job minutes later, and gives the simulator the exact cost model and link model of the run.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ComparisonError", "resolve_job_config", "pp_degree", "world_size", "microbatches"]


class ComparisonError(ValueError):
    """Bad harness input (config, overrides, steps); the message says which and why."""


def world_size(config: Path, overrides: Sequence[str]) -> int:
    """Ranks a run needs (product of the parallel degrees, overrides applied)."""
    from titan_morph.launch import world_size as _world_size

    return _world_size(str(config), list(overrides))


def resolve_job_config(config: Path, overrides: Sequence[str]) -> Any:
    """TorchTitan's JobConfig for ``--job.config_file config *overrides``, ``[morph]`` validated."""
    from titan_morph.integration.cpu import adapt_torchtitan_to_cpu

    if "torchtitan.tools.utils" not in sys.modules:  # parsing needs no device; an importer came first
        adapt_torchtitan_to_cpu()  # before torchtitan loads, as titan_morph.train does
    from torchtitan.config import ConfigManager

    from titan_morph.integration.config import MorphConfigError, validate_job_config
    from titan_morph.train import prepare_args

    try:
        args = prepare_args(["--job.config_file", str(config), *overrides])
    except MorphConfigError as err:
        raise ComparisonError(f"{config}: {err}") from None
    err_out = io.StringIO()
    try:
        with contextlib.redirect_stderr(err_out), contextlib.redirect_stdout(io.StringIO()):
            job_config = ConfigManager().parse_args(args)
    except SystemExit:
        detail = " ".join(err_out.getvalue().split())[-600:]
        raise ComparisonError(f"TorchTitan rejected the arguments {' '.join(overrides)}: {detail}") from None
    try:
        validate_job_config(job_config)
    except MorphConfigError as err:
        raise ComparisonError(str(err)) from None
    return job_config


def pp_degree(job_config: Any) -> int:
    return int(job_config.parallelism.pipeline_parallel_degree)


def microbatches(job_config: Any) -> int:
    """N = local_batch_size / pipeline_parallel_microbatch_size (TorchTitan's rule)."""
    par = job_config.parallelism
    return int(job_config.training.local_batch_size) // int(par.pipeline_parallel_microbatch_size)
