"""TorchTitan 0.2.2's trainer with titan_morph: ``python -m titan_morph.train`` runs :func:`main`.

1. without CUDA, the CPU adaptation (:mod:`.cpu`) runs before torchtitan loads;
2. the command line is prepared (:func:`~titan_morph.integration.titan022.jobconfig.prepare_args`): the
   ``[morph]`` config module named, the TOML's ``[morph]`` keys checked, ``--morph.no-<flag>``
   spelled with a value;
3. the dataset ``morph_text`` and the TrainSpec ``llama3_morph`` are registered;
4. :class:`MorphTrainer` resolves the configuration (the launcher's checks, run again for users
   who call torchrun directly) before initialising anything, expands ``{run_id}`` in ``[job]
   dump_folder`` (one folder per run) and writes the resolved config into that folder;
5. under torchrun, each rank asks to be sent SIGTERM when torchrun exits, so no rank outlives it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from titan_morph.integration.common import RUN_ID_PLACEHOLDER, MorphTrainerMethods, rank_main, run_id
from titan_morph.integration.cpu import adapt_torchtitan_to_cpu
from titan_morph.integration.titan022.jobconfig import prepare_args, settings_of

if TYPE_CHECKING:  # torchtitan loads after the CPU adaptation
    import logging

    from torchtitan.config import JobConfig

__all__ = ["main", "run_id"]


def _make_trainer_class() -> type:
    """The trainer class, made after the CPU adaptation so that torchtitan loads adapted."""
    from torchtitan.tools.logging import logger
    from torchtitan.train import Trainer

    class MorphTrainer(MorphTrainerMethods, Trainer):  # type: ignore[misc]
        """TorchTitan's Trainer; resolves [morph] first, makes the run folder self-describing and
        ends with the run's summary (step time before / during / after a straggler)."""

        def __init__(self, job_config: JobConfig) -> None:
            self.morph_settings = settings_of(job_config)
            self._trained = False  # set once training finished: transports then drain on close
            job = job_config.job
            if RUN_ID_PLACEHOLDER in job.dump_folder:
                job.dump_folder = job.dump_folder.replace(RUN_ID_PLACEHOLDER, run_id())
            if job.save_config_file is None:
                job.save_config_file = "config.json"  # TorchTitan writes the resolved config there
            super().__init__(job_config)
            if hasattr(self, "pp_schedule") and hasattr(self.metrics_processor, "schedule"):
                self.metrics_processor.schedule = self.pp_schedule  # its tensorboard_metrics(step)
            if int(os.environ.get("RANK", "0")) == 0:
                _write_run_info(job_config, logger)

    return MorphTrainer


def _write_run_info(job_config: JobConfig, logger: logging.Logger) -> None:
    """The TOML and how the run was started, next to TorchTitan's resolved config.json."""
    import torch

    import titan_morph

    folder = Path(job_config.job.dump_folder)
    folder.mkdir(parents=True, exist_ok=True)
    if job_config.job.config_file and os.path.isfile(job_config.job.config_file):
        shutil.copyfile(job_config.job.config_file, folder / "job.toml")
    info = {
        "argv": sys.argv,
        "run_id": run_id(),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "titan_morph": titan_morph.__version__,
        "torch": torch.__version__,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (folder / "run.json").write_text(json.dumps(info, indent=2) + "\n")
    logger.info(f"titan_morph: run folder {folder}")


def _start(args: list[str]) -> None:
    args = prepare_args(args)
    # TorchTitan's ConfigManager.parse_args reads sys.argv[1:] bound at import: set it first.
    sys.argv = [sys.argv[0], *args]
    from torchtitan.train import main as torchtitan_main

    from titan_morph.integration.titan022.register import register_all

    register_all()
    torchtitan_main(_make_trainer_class())


def main(argv: list[str] | None = None) -> None:
    rank_main(argv, adapt_torchtitan_to_cpu, _start)
