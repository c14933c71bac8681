"""What ``netlab run`` needs to know about a job, from the same check ``./run_train.sh`` runs.

``python -m titan_morph.netlab.jobinfo RANKS CONFIG.toml [overrides ...]`` loads the configuration
as the ranks will, for ``RANKS`` ranks (:func:`titan_morph.integration.titan022.jobconfig.load`, as
``titan_morph.launch run --nproc RANKS``), and prints one JSON line: the config file and overrides
to start the ranks with, the dump folder (``{run_id}`` not yet expanded) and the rank that logs the
loss. A bad configuration is one line ``error: ...`` on stderr and exit code 2. It runs in its own
process so that the netlab controller does not hold TorchTitan's imports while the job trains.
"""

from __future__ import annotations

import json
import sys

from titan_morph.config import ConfigError
from titan_morph.integration.launching import EXIT_BAD_CONFIG, loss_rank
from titan_morph.integration.titan022.jobconfig import config_file_of, load, without_config_file

__all__ = ["main"]


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m titan_morph.netlab.jobinfo RANKS CONFIG.toml [overrides ...]", file=sys.stderr)
        return EXIT_BAD_CONFIG
    ranks, config_file, overrides = int(argv[0]), argv[1], argv[2:]
    named = config_file_of(overrides)
    if named:
        config_file, overrides = named, without_config_file(overrides)
    try:
        job_config, settings = load(config_file, overrides, ranks=ranks)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
    info = {
        "config_file": config_file,
        "overrides": overrides,
        "world_size": settings.world_size,
        "loss_rank": loss_rank(settings, settings.world_size),
        "dump_folder": str(job_config.job.dump_folder),
    }
    print(json.dumps(info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
