"""``python -m titan_morph.train --job.config_file X.toml [--section.key value ...]``.

TorchTitan's own trainer (``torchtitan.train.main``) with titan_morph's registrations:

1. without CUDA, the CPU adaptation (``titan_morph.integration.cpu``) runs before torchtitan loads;
2. ``--job.custom_config_module titan_morph.integration.config`` is added when neither the command
   line nor the TOML names one, so the ``[morph]`` section always exists;
3. unknown ``[morph]`` keys in the TOML are rejected with the list of allowed ones;
4. the dataset ``morph_text`` and the TrainSpec ``llama3_morph`` are registered;
5. the trainer runs the launcher's checks (:func:`titan_morph.launch.validate`) before
   initialising anything, expands ``{run_id}`` in ``[job] dump_folder`` (one folder per run) and
   writes the resolved config into that folder;
6. under torchrun, each rank asks to be sent SIGTERM when torchrun exits, so no rank outlives it.

``./run_train.sh`` runs the same checks before starting torchrun (``titan_morph.launch``); they
run here again for users who call torchrun directly.
"""

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from titan_morph.integration.cpu import adapt_torchtitan_to_cpu
from titan_morph.launch import CONFIG_MODULE

__all__ = ["CONFIG_MODULE", "main", "prepare_args", "run_id"]

RUN_ID_PLACEHOLDER = "{run_id}"


def prepare_args(argv: list[str]) -> list[str]:
    """Add the [morph] config module when missing, pre-check the TOML's [morph] keys and spell
    ``--morph.no-<flag>`` as ``--morph.<flag> false``."""
    from titan_morph.integration.config import check_unknown_keys, expand_negated_flags
    from titan_morph.launch import config_file_of, load_toml, with_config_module

    toml_path = config_file_of(argv)
    toml = load_toml(toml_path) if toml_path else {}
    if "morph" in toml:
        check_unknown_keys(toml["morph"])
    return with_config_module(expand_negated_flags(argv), toml)


def run_id() -> str:
    """One id per launch, equal on every rank: $TITAN_MORPH_RUN_ID (run_train.sh), else torchrun's."""
    rid = os.environ.get("TITAN_MORPH_RUN_ID") or os.environ.get("TORCHELASTIC_RUN_ID", "")
    if rid not in ("", "none"):
        return rid
    if "LOCAL_RANK" in os.environ:  # torchrun without an id: the local agent's pid is shared by its ranks
        return time.strftime("%Y%m%d") + f"-agent{os.getppid()}-port{os.environ.get('MASTER_PORT', '0')}"
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def _make_trainer_class():
    from torchtitan.tools.logging import logger
    from torchtitan.train import Trainer

    from titan_morph.launch import validate

    class MorphTrainer(Trainer):
        """TorchTitan's Trainer; validates [morph] first, makes the run folder self-describing and
        ends with the run's summary (step time before / during / after a straggler)."""

        def __init__(self, job_config: Any) -> None:
            validate(job_config)
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
                self._write_run_info(job_config)

        def train(self) -> None:
            super().train()
            self._trained = True
            from titan_morph.integration.assembly import run_summary

            for line in run_summary(self.job_config, getattr(self, "pp_schedule", None)):
                logger.info(f"titan_morph: {line}")

        def close(self) -> None:
            from titan_morph.integration.assembly import close_transports
            from titan_morph.runtime.schedule import MorphSchedule

            try:  # threads and delegates stop while the process groups they use still exist
                schedule = getattr(self, "pp_schedule", None)
                if isinstance(schedule, MorphSchedule):
                    schedule.close(self.job_config.comm.train_timeout_seconds)
                close_transports(drain=self._trained)
            finally:
                super().close()

        def init_distributed(self) -> Any:
            """TorchTitan's ParallelDims; for DP x PP, with the DP groups on the DP backend."""
            from titan_morph.integration.hybrid import parallel_dims_for

            return parallel_dims_for(self.job_config, super().init_distributed())

        def train_step(self, data_iterator: Any) -> None:
            from titan_morph.integration.hybrid import before_step

            before_step(self)
            super().train_step(data_iterator)

        def should_continue_training(self) -> bool:
            """False also after a step that moved ranks (DP x PP): the run resumes, relaunched."""
            from titan_morph.integration.hybrid import finish_for_move

            return not finish_for_move(self) and super().should_continue_training()

        @staticmethod
        def _write_run_info(job_config: Any) -> None:
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

    return MorphTrainer


def main(argv: list[str] | None = None) -> None:
    from titan_morph.integration.config import MorphConfigError
    from titan_morph.launch import LaunchError, die_with_parent

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
    except (MorphConfigError, LaunchError) as err:
        print(f"titan_morph: configuration error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
