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
import time
from typing import Any

from titan_morph.config import ConfigError, Settings
from titan_morph.integration.launcher import EXIT_BAD_CONFIG, check_devices, check_log_ranks, loss_rank
from titan_morph.integration.supervisor import supervise_main, torchrun_args
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
    n = settings.world_size
    import torch

    check_devices(n, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    _check_shm(config, settings)
    if log_rank:
        check_log_ranks(log_rank, n)
    shown = log_rank or str(loss_rank(settings, n))
    os.environ["LOG_RANK"] = shown  # TorchTitan 0.3.0 warns unless the loss rank is listed there
    run_id = os.environ.setdefault("TITAN_MORPH_RUN_ID", time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    print(
        f"run_train.sh: TorchTitan 0.3.0, {n} ranks, config {module}:{function}, run id {run_id}, showing rank(s)"
        f" {shown}",
        file=sys.stderr,
        flush=True,
    )
    torchrun = [
        *torchrun_args(sys.executable, n, shown),
        "-m",
        TRAIN_MODULE,
        "--module",
        module,
        "--config",
        function,
        *overrides,
    ]
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "titan_morph.launch", "supervise", "--", *torchrun])
    return 0  # not reached


def _ranks_option(nproc: str | None) -> int | None:
    if nproc is None:
        return None
    if not (nproc.isdigit() and int(nproc) >= 1):
        raise ConfigError(f"NGPU: {nproc!r} is not a number of ranks (>= 1)")
    return int(nproc)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("run", "check", "supervise", "ngpu"):
        print(USAGE, file=sys.stderr)
        return EXIT_BAD_CONFIG
    command, args = argv[0], argv[1:]
    if command == "supervise":
        return supervise_main(args)
    options: dict[str, str] = {}
    while command == "run" and args[:1] and args[0] in ("--nproc", "--log-rank") and len(args) > 1:
        options[args[0]], args = args[1], args[2:]
    try:
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
            nproc = _ranks_option(options.get("--nproc"))
            return run(named, rest, module=module, nproc=nproc, log_rank=options.get("--log-rank", ""))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
