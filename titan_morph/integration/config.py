"""The name TOML files used before the 0.2.2 adapter had its own folder: ``[job] custom_config_module =
"titan_morph.integration.config"`` keeps working; new files name :mod:`.titan022.config`."""

from titan_morph.integration.titan022.config import Inject, JobConfig, Morph, Synthetic

__all__ = ["Inject", "JobConfig", "Morph", "Synthetic"]
