"""titan_morph's configuration core: the ``[morph]`` schema, one check pass, one resolved object.

* :mod:`.schema`: the ``[morph]`` tables as typed dataclasses (what TorchTitan merges and tyro reads);
* :mod:`.fields`: what each field type allows, and the one routine that parses a raw value;
* :mod:`.cli`: how the options look on a command line, and the check of overrides;
* :mod:`.rules`: the rules between options, and TorchTitan's settings titan_morph relies on;
* :mod:`.resolve`: :func:`resolve` -> the frozen :class:`Settings` (:mod:`.settings`) every layer
  above reads;
* :mod:`.links`: the link models of ``[morph.inject]``.

No TorchTitan release is imported here: each release's adapter (``titan_morph.integration``)
fills a :class:`JobView` from its own config and calls :func:`resolve`.
"""

from titan_morph.config.fields import ConfigError
from titan_morph.config.resolve import resolve, resolve_morph
from titan_morph.config.schema import Inject, JobConfig, Morph, Synthetic
from titan_morph.config.settings import InjectSettings, JobView, MorphSettings, Settings, SyntheticSettings

__all__ = [
    "ConfigError",
    "Inject",
    "InjectSettings",
    "JobConfig",
    "JobView",
    "Morph",
    "MorphSettings",
    "Settings",
    "Synthetic",
    "SyntheticSettings",
    "resolve",
    "resolve_morph",
]
