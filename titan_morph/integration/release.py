"""The TorchTitan release this environment runs, behind one interface for the tools above the adapters.

Each release has its adapter (0.2.2: :mod:`titan_morph.integration` with TOML files; 0.3.0:
:mod:`titan_morph.integration.titan03` with config functions); both fill the same
:class:`~titan_morph.config.JobView` and :class:`~titan_morph.integration.schedules.ScheduleRequest`,
so planner, comm, monitor and runtime never know which one runs. What differs for a tool that
launches jobs (the comparison harness, benchmarks) is how a job is named and started:
:func:`current` answers that. A job is named by a TOML path on both: on 0.3.0 its file name
(``train_configs/synthetic_cpu.toml``) names the config function (``synthetic_cpu``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from titan_morph.config import Settings
from titan_morph.integration.boundary import TitanConfig

__all__ = ["Release", "current", "installed"]


def installed() -> str:
    """The installed TorchTitan's version ("" when none)."""
    try:
        return version("torchtitan")
    except PackageNotFoundError:
        return ""


@dataclass(frozen=True)
class Release:
    """How jobs are read and started on one TorchTitan release."""

    version: str

    @property
    def config_functions(self) -> bool:
        """Whether jobs are config functions (0.3.0) rather than TOML files (0.2.2)."""
        return not self.version.startswith("0.2.")

    def config_name(self, config: str | Path) -> str:
        """What names the job on this release: the TOML path, or (0.3.0) the function its file name names."""
        if not self.config_functions:
            return str(config)
        name = str(config)
        return Path(name).stem if name.endswith(".toml") else name

    def load(
        self, config: str | Path, overrides: Sequence[str] = (), ranks: int | None = None
    ) -> tuple[TitanConfig, Settings]:
        """TorchTitan's config (the release's class; what both share is :class:`.boundary.TitanConfig`)
        and titan_morph's settings, after every pre-rank check."""
        if self.config_functions:
            from titan_morph.integration.titan03.jobconfig import load as load03

            return load03(self.config_name(config), overrides, ranks)
        from titan_morph.integration.titan022.jobconfig import load

        return load(config, overrides, ranks)

    def train_command(
        self,
        config: str | Path,
        dump_folder: str | Path,
        nproc: int,
        overrides: Sequence[str] = (),
        python: str = "",
    ) -> list[str]:
        """The supervised ``torchrun`` command of one job writing into ``dump_folder``."""
        from titan_morph.integration.supervisor import torchrun_args, torchrun_command

        if not self.config_functions:
            return torchrun_command(config, dump_folder, nproc, overrides, python)
        from titan_morph.integration.titan03.jobconfig import CONFIG_MODULE
        from titan_morph.integration.titan03.launcher import TRAIN_MODULE

        python = python or sys.executable
        job = ["--module", CONFIG_MODULE, "--config", self.config_name(config), "--dump_folder", str(dump_folder)]
        supervise = [python, "-m", "titan_morph.launch", "supervise", "--"]
        return [*supervise, *torchrun_args(python, nproc), "-m", TRAIN_MODULE, *job, *overrides]


def current() -> Release:
    """The release installed here (0.2.2's adapter when TorchTitan's version is unknown)."""
    return Release(installed() or "0.2.2")
