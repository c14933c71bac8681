"""The launcher behind ``./run_train.sh``: check the whole configuration, then start torchrun under
the supervisor (:mod:`.supervisor`), which leaves nothing behind.

``python -m titan_morph.launch run [--nproc N] [--log-rank R] CONFIG.toml [--section.key value ...]``
    Reads the TOML and the overrides exactly as the ranks will
    (:func:`~titan_morph.integration.titan022.jobconfig.load`: TorchTitan's ``ConfigManager`` with ``[morph]``,
    then every check of :func:`titan_morph.config.resolve`), checks ``NGPU`` and ``LOG_RANK``
    against the job and the host (with ``NNODES`` > 1 this node's ``NGPU`` ranks of a multi-node
    job, :mod:`.nodes`; the ``[morph]`` network interfaces), and only then starts ``torchrun``. A bad input is one line
    ``error: <key>: <what is wrong and what is allowed>`` on stderr and exit code 2, before any
    rank starts.
``python -m titan_morph.launch check CONFIG.toml [overrides ...]``
    The checks alone (exit 0 or 2).
``python -m titan_morph.launch ngpu CONFIG.toml [overrides ...]``
    Prints the number of ranks the config needs.
``python -m titan_morph.launch supervise -- COMMAND ...``
    Runs a torchrun command so that nothing outlives it (:func:`.supervisor.supervise`).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from titan_morph.config import Settings
from titan_morph.integration.launching import (
    EXIT_BAD_CONFIG,
    checked_ranks,
    command_main,
    exec_torchrun,
    loss_rank,
    ranks_option,
)
from titan_morph.integration.nodes import load_for_nodes, nodes_from_env
from titan_morph.integration.supervisor import TRAIN_MODULE
from titan_morph.integration.titan022.jobconfig import check_early, config_file_of, load, without_config_file

if TYPE_CHECKING:  # torchtitan loads after the CPU adaptation (jobconfig.load runs it)
    from torchtitan.config import JobConfig

__all__ = ["USAGE", "main", "message_bytes", "run"]

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

USAGE = """usage:
  python -m titan_morph.launch run [--nproc N] [--log-rank R] CONFIG.toml [--section.key value ...]
  python -m titan_morph.launch check CONFIG.toml [--section.key value ...]
  python -m titan_morph.launch supervise -- COMMAND ...
  python -m titan_morph.launch ngpu CONFIG.toml [--section.key value ...]"""


def message_bytes(job_config: JobConfig, settings: Settings) -> int | None:
    """Bytes of one pipeline message (a microbatch's activations: microbatch x seq_len x dim), in the
    dtype the stages exchange (FSDP's ``mixed_precision_param`` when it shards, else float32);
    None when the model's width cannot be found (a model titan_morph does not know)."""
    try:
        from torchtitan.models.llama3 import TransformerModelArgs
        from torchtitan.protocols.train_spec import get_train_spec

        from titan_morph.integration.titan022.train_spec import register

        register()
        args = get_train_spec(job_config.model.name).model_args[job_config.model.flavor]
        seq_len = int(job_config.training.seq_len)
    except Exception:
        return None
    if not isinstance(args, TransformerModelArgs):  # llama3's and the synthetic testbed's (its subclass)
        return None
    dim = args.dim
    shards = settings.job.data_parallel_shard_degree != 1
    dtype = str(job_config.training.mixed_precision_param) if shards else "float32"
    return settings.job.microbatch_size * seq_len * dim * _DTYPE_BYTES.get(dtype, 4)


def run(config_file: str, overrides: list[str], *, nproc: int | None = None, log_rank: str = "") -> int:
    """``./run_train.sh``: check, then replace this process by the supervisor of torchrun (so the
    memory of the check's imports is not held during training). Returns only on a bad config."""
    from titan_morph.integration.shm_space import check_ring_space  # torch: after the early checks

    nodes = nodes_from_env(os.environ)
    job_config, settings = load_for_nodes(lambda ranks: load(config_file, overrides, ranks=ranks), nodes, nproc)
    n, shown = checked_ranks(
        settings,
        log_rank,
        lambda: check_ring_space(
            settings, message_bytes(job_config, settings), ranks_here=nodes.ranks_per_node(settings.world_size)
        ),
        nodes,
    )
    if nodes.multi:  # the job's ranks shown, where TorchTitan looks for the loss rank (else it warns)
        os.environ["LOG_RANK"] = log_rank or str(loss_rank(settings, settings.world_size))
    return exec_torchrun(
        n,
        shown,
        lambda run_id: f"run_train.sh: {n} ranks, config {config_file}, run id {run_id}, {nodes.shown_text(shown, n)}",
        ["-m", TRAIN_MODULE, "--job.config_file", config_file, *overrides],
        nodes,
    )


def _dispatch(command: str, args: list[str], options: dict[str, str]) -> int:
    if not args:
        print(USAGE, file=sys.stderr)
        return EXIT_BAD_CONFIG
    config_file, overrides = args[0], args[1:]
    named = config_file_of(overrides)  # --job.config_file among the overrides wins, as in TorchTitan's CLI
    if named:
        config_file, overrides = named, without_config_file(overrides)
    check_early(config_file, overrides)  # a typo in about a second, before TorchTitan loads
    if command == "ngpu":
        print(load(config_file, overrides)[1].world_size)
    elif command == "check":
        load(config_file, overrides)
    else:
        nproc = ranks_option(options.get("--nproc"))
        return run(config_file, overrides, nproc=nproc, log_rank=options.get("--log-rank", ""))
    return 0


def main(argv: list[str]) -> int:
    return command_main(argv, USAGE, _dispatch)
