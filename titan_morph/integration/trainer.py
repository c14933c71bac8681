"""TorchTitan 0.2.2's trainer with titan_morph: ``python -m titan_morph.train`` runs :func:`main`.

1. without CUDA, the CPU adaptation (:mod:`.cpu`) runs before torchtitan loads;
2. the command line is prepared (:func:`~titan_morph.integration.jobconfig.prepare_args`): the
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
from typing import Any

from titan_morph.comm.system import die_with_parent
from titan_morph.config import ConfigError
from titan_morph.integration.cpu import adapt_torchtitan_to_cpu
from titan_morph.integration.jobconfig import prepare_args, settings_of

__all__ = ["main", "run_id"]

RUN_ID_PLACEHOLDER = "{run_id}"


def run_id() -> str:
    """One id per launch, equal on every rank: $TITAN_MORPH_RUN_ID (run_train.sh), else torchrun's."""
    rid = os.environ.get("TITAN_MORPH_RUN_ID") or os.environ.get("TORCHELASTIC_RUN_ID", "")
    if rid not in ("", "none"):
        return rid
    if "LOCAL_RANK" in os.environ:  # torchrun without an id: the local agent's pid is shared by its ranks
        return time.strftime("%Y%m%d") + f"-agent{os.getppid()}-port{os.environ.get('MASTER_PORT', '0')}"
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def _make_trainer_class() -> type:
    """The trainer class, made after the CPU adaptation so that torchtitan loads adapted."""
    from torchtitan.tools.logging import logger
    from torchtitan.train import Trainer

    class MorphTrainer(Trainer):  # type: ignore[misc]
        """TorchTitan's Trainer; resolves [morph] first, makes the run folder self-describing and
        ends with the run's summary (step time before / during / after a straggler)."""

        def __init__(self, job_config: Any) -> None:
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

        def train(self) -> None:
            super().train()
            self._trained = True
            from titan_morph.integration.assembly import run_summary

            for line in run_summary(self.morph_settings, getattr(self, "pp_schedule", None)):
                logger.info(f"titan_morph: {line}")

        def close(self) -> None:
            from titan_morph.integration.assembly import close_transports
            from titan_morph.runtime.schedule import MorphSchedule

            try:  # threads and delegates stop while the process groups they use still exist
                schedule = getattr(self, "pp_schedule", None)
                if isinstance(schedule, MorphSchedule):
                    schedule.close(self.morph_settings.job.train_timeout_s)
                close_transports(drain=self._trained)
            finally:
                super().close()

        def init_distributed(self) -> Any:
            """TorchTitan's ParallelDims; for DP x PP, with the DP groups on the DP backend."""
            from titan_morph.integration.hybrid import parallel_dims_for

            return parallel_dims_for(self.morph_settings, super().init_distributed())

        def train_step(self, data_iterator: Any) -> None:
            from titan_morph.integration.hybrid import before_step

            before_step(self)
            super().train_step(data_iterator)

        def should_continue_training(self) -> bool:
            """False also after a step that moved ranks (DP x PP): the run resumes, relaunched."""
            from titan_morph.integration.hybrid import finish_for_move

            return not finish_for_move(self) and bool(super().should_continue_training())

    return MorphTrainer


def _write_run_info(job_config: Any, logger: Any) -> None:
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


def main(argv: list[str] | None = None) -> None:
    if "LOCAL_RANK" in os.environ:  # a torchrun rank: exit with the agent, whatever ends it
        die_with_parent()
    args = list(sys.argv[1:] if argv is None else argv)
    adapt_torchtitan_to_cpu()
    try:
        args = prepare_args(args)
        # TorchTitan's ConfigManager.parse_args reads sys.argv[1:] bound at import: set it first.
        sys.argv = [sys.argv[0], *args]
        from torchtitan.train import main as torchtitan_main

        from titan_morph.integration.register import register_all

        register_all()
        torchtitan_main(_make_trainer_class())
    except ConfigError as err:
        print(f"titan_morph: configuration error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
