"""Launcher helpers for ``run_train.sh``: ``python -m titan_morph.launch ngpu CONFIG [overrides...]``.

Prints the number of ranks a config needs: the product of its parallel degrees (PP x TP x CP x
DP), with ``--parallelism.<key> value`` overrides from the command line applied. A negative
``data_parallel_shard_degree`` (TorchTitan's "leftover ranks") counts as 1.
"""

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEGREES = (
    "pipeline_parallel_degree",
    "tensor_parallel_degree",
    "context_parallel_degree",
    "data_parallel_replicate_degree",
    "data_parallel_shard_degree",
)


def _load_toml(path: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def world_size(config_file: str, overrides: list[str]) -> int:
    """Ranks needed by ``config_file`` with ``--parallelism.*`` overrides applied."""
    par = dict(_load_toml(config_file).get("parallelism", {}))
    for i, arg in enumerate(overrides):
        key, eq, value = arg.partition("=")
        name = key.removeprefix("--parallelism.").replace("-", "_")
        if key.startswith("--parallelism.") and name in DEGREES:
            par[name] = int(value if eq else overrides[i + 1])
    size = 1
    for name in DEGREES:
        size *= max(int(par.get(name, 1)), 1)
    return size


def torchrun_command(
    config_file: str | Path, dump_folder: str | Path, nproc: int, overrides: Sequence[str] = (), python: str = ""
) -> list[str]:
    """``torchrun --standalone`` (a free rendezvous port per job) of ``python -m titan_morph.train`` on
    ``nproc`` ranks, with TorchTitan's conventions: ``--job.config_file``, ``--job.dump_folder``, overrides."""
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--role",
        "rank",
        "--tee",
        "3",
        "-m",
        "titan_morph.train",
        "--job.config_file",
        str(config_file),
        "--job.dump_folder",
        str(dump_folder),
        *overrides,
    ]


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "ngpu":
        print("usage: python -m titan_morph.launch ngpu CONFIG.toml [--section.key value ...]", file=sys.stderr)
        return 2
    print(world_size(argv[1], argv[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
