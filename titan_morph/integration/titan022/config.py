"""``[job] custom_config_module = "titan_morph.integration.titan022.config"``: the module TorchTitan 0.2.2's
``ConfigManager`` imports to merge ``[morph]`` into its JobConfig.

Only the merge point lives here; the schema, its checks and the resolved settings are
:mod:`titan_morph.config`.
"""

from titan_morph.config.schema import Inject, JobConfig, Morph, Synthetic

__all__ = ["Inject", "JobConfig", "Morph", "Synthetic"]
