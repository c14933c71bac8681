"""TorchTitan 0.3.0's Trainer with titan_morph: the ``morph`` field and what the run needs around it.

Importing this module runs the CPU adaptation first (without CUDA), since 0.3.0 picks its device
when torchtitan loads. :class:`MorphTrainer` then:

1. resolves the configuration (the launcher's checks, run again for users who call torchrun
   directly) before initialising anything and publishes it for ``pipelining_fn``
   (:func:`~titan_morph.integration.titan03.jobconfig.activate`), which gets only the config's sections;
2. registers the dataset ``morph_text``, resizes the ``synthetic`` model from ``morph.synthetic``,
   expands ``{run_id}`` in ``dump_folder`` (one folder per run) and writes ``run.json`` there;
3. gives the metrics processor the schedule (its TensorBoard figures), ends with the run summary,
   and closes the schedule and the transports while the process groups still exist.

``MorphTrainer.Config`` is what titan_morph's config functions (:mod:`titan_morph.configs`) return:
``config.build()`` then builds this trainer.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from titan_morph.integration.titan03.cpu import adapt, adapt_attention

adapt()  # before torchtitan loads (no-op with CUDA)

from torchtitan.tools.logging import logger  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

from titan_morph.config import Settings  # noqa: E402
from titan_morph.config.schema import Morph  # noqa: E402
from titan_morph.integration.common import RUN_ID_PLACEHOLDER, MorphTrainerMethods, run_id  # noqa: E402
from titan_morph.integration.titan03.jobconfig import activate, settings_of  # noqa: E402

if TYPE_CHECKING:  # the model configs load with the synthetic flavor only
    from torchtitan.models.llama3 import Llama3Model

__all__ = ["MorphTrainer", "run_id"]


def _synthetic_model(settings: Settings) -> Llama3Model.Config:
    """The ``synthetic`` flavor's model config (:func:`~titan_morph.integration.titan03.synthetic.sized_model`)."""
    from titan_morph.integration.titan03.synthetic import sized_model

    return sized_model(settings)


class MorphTrainer(MorphTrainerMethods, Trainer):  # type: ignore[misc]
    """TorchTitan 0.3.0's Trainer with the ``morph`` options (``--morph.*``)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):  # type: ignore[misc]
        morph: Morph = field(default_factory=Morph)
        """titan_morph's options: the same names as 0.2.2's ``[morph]`` table."""

    def __init__(self, config: Config) -> None:
        from titan_morph.integration.data import register_dataset

        self.morph_settings = settings = settings_of(config)
        activate(settings)
        self._trained = False  # set once training finished: transports then drain on close
        register_dataset()
        spec = config.model_spec
        if spec is not None and spec.flavor == "synthetic":
            spec.model = _synthetic_model(settings)
        if spec is not None:
            adapt_attention(spec.model)
        if RUN_ID_PLACEHOLDER in config.dump_folder:
            config.dump_folder = config.dump_folder.replace(RUN_ID_PLACEHOLDER, run_id())
        super().__init__(config)
        schedule = getattr(self, "pp_schedule", None)
        if schedule is not None and hasattr(self.metrics_processor, "schedule"):
            self.metrics_processor.schedule = schedule  # its tensorboard_metrics(step)
        if int(os.environ.get("RANK", "0")) == 0:
            _write_run_info(config)

    @property
    def job_config(self) -> Trainer.Config:
        """The config under 0.2.2's name, read by the release-independent DP x PP code (:mod:`..hybrid`)."""
        return self.config


def _write_run_info(config: Trainer.Config) -> None:
    """How the run was started, next to TorchTitan's resolved config."""
    import torch
    import torchtitan

    import titan_morph

    folder = Path(config.dump_folder)
    folder.mkdir(parents=True, exist_ok=True)
    info = {
        "argv": sys.argv,
        "run_id": run_id(),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "titan_morph": titan_morph.__version__,
        "torchtitan": getattr(torchtitan, "__version__", "0.3.0"),
        "torch": torch.__version__,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (folder / "run.json").write_text(json.dumps(info, indent=2) + "\n")
    logger.info(f"titan_morph: run folder {folder}")
