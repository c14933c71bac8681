"""The launcher behind ``TORCHTITAN=0.3.0 ./run_train.sh``: check the whole configuration, then start
torchrun under the same supervisor as 0.2.2 (:mod:`titan_morph.integration.supervisor`).

``python -m titan_morph.integration.titan03.launcher run [--nproc N] [--log-rank R] FN [--section.key value ...]``
    Builds the config of function ``FN`` (``titan_morph.configs``; ``--module M`` picks another
    module) with the overrides exactly as the ranks will, runs every check of
    :func:`titan_morph.config.resolve`, checks ``NGPU``, ``LOG_RANK`` and /dev/shm against the job
    and the host, and only then starts torchrun. A bad input is one line ``error: <key>: ...`` on
    stderr and exit code 2, before any rank starts.
``... check FN [overrides]``: the checks alone (exit 0 or 2). ``... ngpu FN [overrides]``: the ranks.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from titan_morph.config import ConfigError, Settings
from titan_morph.integration.launcher import (
    EXIT_BAD_CONFIG,
    checked_ranks,
    command_main,
    exec_torchrun,
    ranks_option,
)
from titan_morph.integration.titan03.jobconfig import CONFIG_MODULE, load, module_and_function

__all__ = ["TRAIN_MODULE", "main", "run"]

TRAIN_MODULE = "titan_morph.integration.titan03.train"
USAGE = """usage (TorchTitan 0.3.0):
  python -m titan_morph.integration.titan03.launcher run [--nproc N] [--log-rank R] FN [--section.key value ...]
  python -m titan_morph.integration.titan03.launcher check FN [--section.key value ...]
  python -m titan_morph.integration.titan03.launcher ngpu FN [--section.key value ...]
FN: a config function of titan_morph.configs (debug_cpu, straggler_demo_cpu, synthetic_cpu, adapt_cpu,
hybrid_cpu); --module M picks another module."""


def _check_shm(config: Any, settings: Settings) -> None:
    """The delegates' shared-memory rings fit in /dev/shm (0.2.2's launcher check, with 0.3.0's model
    width); skipped where this titan_morph has no such check."""
    try:
        from titan_morph.integration.shm_space import _size, delegate_shm_bytes, shm_free_bytes
    except ImportError:
        return
    try:
        dim = int(config.model_spec.model.dim)
        if config.model_spec.flavor == "synthetic":
            dim = settings.morph.synthetic.hidden
    except AttributeError:
        return
    shards = settings.job.data_parallel_shard_degree != 1
    width = 2 if shards and str(config.training.mixed_precision_param) == "bfloat16" else 4
    message = settings.job.microbatch_size * int(config.training.seq_len) * dim * width
    needed, free = delegate_shm_bytes(settings, message), shm_free_bytes()
    if needed == 0 or free is None or needed <= free:
        return
    raise ConfigError(
        f"morph.transport: {settings.morph.transport!r}: the delegates' shared-memory rings need {_size(needed)} in"
        f" /dev/shm (rings of {_size(message)} messages) but only {_size(free)} is free: raise it"
        " or use --morph.transport default"
    )


def run(
    function: str, overrides: list[str], *, module: str = CONFIG_MODULE, nproc: int | None = None, log_rank: str = ""
) -> int:
    """Check, then replace this process by the supervisor of torchrun. Returns only on a bad config."""
    config, settings = load(function, overrides, ranks=nproc, module=module)
    n, shown = checked_ranks(settings, log_rank, lambda: _check_shm(config, settings))
    os.environ["LOG_RANK"] = shown  # TorchTitan 0.3.0 warns unless the loss rank is listed there
    return exec_torchrun(
        n,
        shown,
        lambda run_id: (
            f"run_train.sh: TorchTitan 0.3.0, {n} ranks, config {module}:{function}, run id {run_id}, showing rank(s)"
            f" {shown}"
        ),
        ["-m", TRAIN_MODULE, "--module", module, "--config", function, *overrides],
    )


def _dispatch(command: str, args: list[str], options: dict[str, str]) -> int:
    module, named, rest = module_and_function(args)
    if named is None:  # the function is the first argument unless --config names it
        if not rest or rest[0].startswith("--"):
            print(USAGE, file=sys.stderr)
            return EXIT_BAD_CONFIG
        named, rest = rest[0], rest[1:]
    module = module or CONFIG_MODULE
    if command == "ngpu":
        print(load(named, rest, module=module)[1].world_size)
    elif command == "check":
        load(named, rest, module=module)
    else:
        nproc = ranks_option(options.get("--nproc"))
        return run(named, rest, module=module, nproc=nproc, log_rank=options.get("--log-rank", ""))
    return 0


def main(argv: list[str]) -> int:
    return command_main(argv, USAGE, _dispatch)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
