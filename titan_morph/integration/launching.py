"""What both releases' launchers do alike before torchrun starts: the host's checks (devices,
/dev/shm, network interfaces, the nodes of a multi-node job, ``LOG_RANK``), the launcher's command
line, and the hand-over to torchrun under the supervisor (:mod:`.supervisor`). Each release's
launcher (:mod:`.titan022.launcher`, :mod:`.titan03.launcher`) reads its own config and calls these.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from titan_morph.config import ConfigError, Settings
from titan_morph.config.rules import check_dp_backend
from titan_morph.integration.nodes import Nodes, check_interfaces, nodes_from_env
from titan_morph.integration.supervisor import supervise_main, torchrun_args

__all__ = [
    "EXIT_BAD_CONFIG",
    "check_devices",
    "check_log_ranks",
    "checked_ranks",
    "command_main",
    "exec_torchrun",
    "loss_rank",
    "ranks_option",
]

EXIT_BAD_CONFIG = 2


def loss_rank(settings: Settings, ranks: int) -> int:
    """The rank that logs the loss: the last one, or rank 0 for a V schedule (ZBVZeroBubble,
    DualPipeV, PipeMorphV), whose last stage runs there."""
    if settings.stages > 1:
        from titan_morph.integration.schedules import schedule_placement

        try:
            if schedule_placement(settings.job.schedule) == "v":
                return 0
        except ValueError:  # not a schedule titan_morph knows: TorchTitan's own rule below
            pass
    return ranks - 1


def check_devices(ranks: int, cuda_devices: int, settings: Settings | None = None) -> None:
    """More ranks than GPUs on a node: the ranks share the GPUs (:mod:`.cpu`: Gloo, the delegated
    pipeline), which holds for pipeline parallelism alone; a job that also shards, replicates or
    splits tensors across those ranks is one error line. Without CUDA (``cuda_devices == 0``) ranks
    run on CPU."""
    from titan_morph.integration.cpu import ranks_share_gpus

    if settings is None or not ranks_share_gpus(ranks, cuda_devices):
        return
    if settings.world_size != settings.stages:
        others = {k: v for k, v in settings.job.degrees.items() if k != "pipeline_parallel_degree" and v != 1}
        named = ", ".join(f"{k} {v}" for k, v in others.items()) or f"a world of {settings.world_size} ranks"
        raise ConfigError(
            f"NGPU: {ranks} ranks on {cuda_devices} CUDA device(s): ranks share a GPU only for pipeline parallelism "
            f"(Gloo and the delegated transport), not {named}: set NGPU <= {cuda_devices} with one GPU per rank, "
            "or use pipeline_parallel_degree alone"
        )


def check_log_ranks(spec: str, ranks: int) -> None:
    """``LOG_RANK``: comma-separated ranks of this job (torchrun's ``--local-ranks-filter``)."""
    for part in spec.split(","):
        if not (part.strip().isdigit() and int(part) < ranks):
            raise ConfigError(f"LOG_RANK: {spec!r} must name ranks of this job, 0..{ranks - 1}, separated by commas")


def checked_ranks(
    settings: Settings, log_rank: str, check_shm: Callable[[], None], nodes: Nodes | None = None
) -> tuple[int, str]:
    """The launch's checks against the host, in the order both releases run them (devices, what DP x
    PP cannot do on NCCL, ``check_shm``: /dev/shm for the delegates, the network interfaces, what one node of several
    cannot do, ``LOG_RANK``); returns this node's ranks and the local ranks shown (``nodes``:
    default from the environment)."""
    nodes = nodes_from_env(os.environ) if nodes is None else nodes
    world = settings.world_size
    n = nodes.ranks_per_node(world)
    import torch

    from titan_morph.integration.cpu import ranks_share_gpus

    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    check_devices(n, cuda, settings)
    if cuda and not ranks_share_gpus(n, cuda):  # a GPU per rank: the job's groups are NCCL
        check_dp_backend(settings, "nccl")
    check_shm()
    check_interfaces(settings.morph)
    nodes.check_job(settings)
    if log_rank:
        check_log_ranks(log_rank, world)
    return n, nodes.shown_ranks(log_rank or str(loss_rank(settings, world)), n)


def ranks_option(nproc: str | None) -> int | None:
    """``--nproc``: a number of ranks (None when absent)."""
    if nproc is None:
        return None
    if not (nproc.isdigit() and int(nproc) >= 1):
        raise ConfigError(f"NGPU: {nproc!r} is not a number of ranks (>= 1)")
    return int(nproc)


def exec_torchrun(
    n: int, shown: str, banner: Callable[[str], str], train_args: Sequence[str], nodes: Nodes | None = None
) -> int:
    """Replace this process by the supervisor of torchrun over ``train_args`` (so the memory of the
    check's imports is not held during training) on ``n`` ranks of this node; ``banner``: the line
    announcing it, of the run id; ``nodes``: the job's nodes (default from the environment)."""
    nodes = nodes_from_env(os.environ) if nodes is None else nodes
    rid = os.environ.setdefault("TITAN_MORPH_RUN_ID", nodes.run_id(os.environ))
    print(banner(rid) + (f"; {nodes.describe()}" if nodes.multi else ""), file=sys.stderr, flush=True)
    torchrun = [*torchrun_args(sys.executable, n, shown, nodes.rendezvous_args()), *train_args]
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "titan_morph.launch", "supervise", "--", *torchrun])
    return 0  # not reached


def command_main(argv: list[str], usage: str, dispatch: Callable[[str, list[str], dict[str, str]], int]) -> int:
    """The launcher's command line, as both releases read it: ``supervise`` runs here; ``run``'s
    ``--nproc``/``--log-rank`` are taken off, then ``dispatch(command, args, options)`` runs with a
    :class:`ConfigError` printed as one line and exit code 2."""
    if not argv or argv[0] not in ("run", "check", "supervise", "ngpu"):
        print(usage, file=sys.stderr)
        return EXIT_BAD_CONFIG
    command, args = argv[0], argv[1:]
    if command == "supervise":
        return supervise_main(args)
    options: dict[str, str] = {}
    while command == "run" and args[:1] and args[0] in ("--nproc", "--log-rank") and len(args) > 1:
        options[args[0]], args = args[1], args[2:]
    try:
        return dispatch(command, args, options)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
