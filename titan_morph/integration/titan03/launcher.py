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
from titan_morph.integration.shm_space import check_ring_space
from titan_morph.integration.titan03.jobconfig import CONFIG_MODULE, load, module_and_function

if TYPE_CHECKING:  # torchtitan loads after the CPU adaptation (jobconfig.load runs it)
    from torchtitan.trainer import Trainer

__all__ = ["TRAIN_MODULE", "main", "run"]

TRAIN_MODULE = "titan_morph.integration.titan03.train"
USAGE = """usage (TorchTitan 0.3.0):
  python -m titan_morph.integration.titan03.launcher run [--nproc N] [--log-rank R] FN [--section.key value ...]
  python -m titan_morph.integration.titan03.launcher check FN [--section.key value ...]
  python -m titan_morph.integration.titan03.launcher ngpu FN [--section.key value ...]
FN: a config function of titan_morph.configs (debug_cpu, straggler_demo_cpu, synthetic_cpu, adapt_cpu,
hybrid_cpu); --module M picks another module."""


def _message_bytes(config: Trainer.Config, settings: Settings) -> int | None:
    """Bytes of one pipeline message in a 0.3.0 config (microbatch x seq_len x width, in the dtype
    the stages exchange); None when the model's width cannot be found."""
    from torchtitan.models.llama3 import Llama3Model

    spec = config.model_spec
    if spec is None:
        return None
    if spec.flavor == "synthetic":
        dim = settings.morph.synthetic.hidden
    elif isinstance(spec.model, Llama3Model.Config):
        dim = spec.model.dim
    else:  # a model titan_morph does not know
        return None
    shards = settings.job.data_parallel_shard_degree != 1
    width = 2 if shards and str(config.training.mixed_precision_param) == "bfloat16" else 4
    return settings.job.microbatch_size * int(config.training.seq_len) * dim * width


def run(
    function: str, overrides: list[str], *, module: str = CONFIG_MODULE, nproc: int | None = None, log_rank: str = ""
) -> int:
    """Check, then replace this process by the supervisor of torchrun. Returns only on a bad config."""
    nodes = nodes_from_env(os.environ)
    config, settings = load_for_nodes(lambda r: load(function, overrides, ranks=r, module=module), nodes, nproc)
    here = nodes.ranks_per_node(settings.world_size)
    message = _message_bytes(config, settings)
    n, shown = checked_ranks(settings, log_rank, lambda: check_ring_space(settings, message, ranks_here=here), nodes)
    # TorchTitan 0.3.0 warns unless the loss rank is listed there (the job's rank with several nodes)
    os.environ["LOG_RANK"] = (log_rank or str(loss_rank(settings, settings.world_size))) if nodes.multi else shown
    return exec_torchrun(
        n,
        shown,
        lambda run_id: (
            f"run_train.sh: TorchTitan 0.3.0, {n} ranks, config {module}:{function}, run id {run_id},"
            f" {nodes.shown_text(shown, n)}"
        ),
        ["-m", TRAIN_MODULE, "--module", module, "--config", function, *overrides],
        nodes,
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
