"""TorchTitan 0.3.0's job config, read once: ``--module M --config FN`` + overrides -> its
``Trainer.Config`` -> titan_morph's :class:`~titan_morph.config.Settings`.

The launcher (before any rank starts) and the trainer on every rank run the same checks in the same
order, each problem one :class:`~titan_morph.config.ConfigError` line naming the key:

1. the config function exists in the module (``titan_morph.configs`` by default);
2. the overrides name known options, with valid choices and numbers (the options are read from the
   config the function returns, so a subclass's fields, e.g. the dataloader's, count);
3. TorchTitan's ``ConfigManager`` (tyro) builds the config;
4. :func:`titan_morph.config.resolve` checks the settings titan_morph relies on and every ``morph``
   option; for titan_morph's model the schedule name is checked too.

0.3.0 hands ``pipelining_fn`` the config's sections, not the config: the trainer publishes its
settings here (:func:`activate`) before it builds the model, and the pipelining function reads them
(:func:`active_settings`).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from titan_morph.config import ConfigError, JobView, Settings, resolve
from titan_morph.config.cli import check_overrides, expand_negated_flags
from titan_morph.config.schema import Morph
from titan_morph.integration import common
from titan_morph.integration.common import parse_quietly

if TYPE_CHECKING:  # torchtitan loads after the CPU adaptation (importing titan_morph.configs runs it)
    from _typeshed import DataclassInstance
    from torchtitan.trainer import Trainer

__all__ = [
    "CONFIG_MODULE",
    "MODEL_NAME",
    "activate",
    "active_settings",
    "config_functions",
    "job_view",
    "load",
    "module_and_function",
    "option_fields_of",
    "prepare_args",
    "settings_of",
]

CONFIG_MODULE = "titan_morph.configs"
"""The module ``--module`` names by default: titan_morph's config functions."""
MODEL_NAME = "llama3_morph"
"""The ``ModelSpec`` name of titan_morph's model (llama3, pipelined by titan_morph)."""

_active: Settings | None = None


def activate(settings: Settings) -> None:
    """Publish the settings of the job this process trains (the trainer, before the model is built)."""
    global _active
    _active = settings


def active_settings() -> Settings:
    """The settings :func:`activate` published; a pipelining function called outside titan_morph's
    trainer is one error naming it."""
    if _active is None:
        raise ConfigError(
            "morph: titan_morph's pipelining runs under its trainer: return MorphTrainer.Config from the config"
            f" function (see {CONFIG_MODULE})"
        )
    return _active


def module_and_function(argv: Sequence[str]) -> tuple[str | None, str | None, list[str]]:
    """``--module`` and ``--config`` of a command line (None when absent) and the other arguments."""
    found: dict[str, str | None] = {"--module": None, "--config": None}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        if key in found:
            if eq:
                found[key] = value
            elif i + 1 < len(argv):
                found[key] = argv[i + 1]
                i += 1
            else:
                raise ConfigError(f"{key[2:]}: {key} needs a value")
        else:
            rest.append(arg)
        i += 1
    return found["--module"], found["--config"], rest


def _import_module(module: str) -> ModuleType:
    """The module ``--module`` names, as TorchTitan's ConfigManager finds it (``M.config_registry`` first)."""
    for candidate in (f"{module}.config_registry", module):
        try:
            return importlib.import_module(candidate)
        except ModuleNotFoundError as err:
            if err.name is None or not candidate.startswith(err.name):
                raise
    raise ConfigError(f"module: {module!r} cannot be imported")


def config_functions(module: ModuleType) -> list[str]:
    """The config functions a module offers: its public lower-case callables defined there."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if callable(v) and getattr(v, "__module__", "") == module.__name__]
    return sorted(n for n in names if not n.startswith("_") and n[:1].islower())


def _base_config(module_name: str, function: str) -> Trainer.Config:
    module = _import_module(module_name)
    fn = getattr(module, function, None)
    offered = config_functions(module)
    if not callable(fn) or function.startswith("_"):
        raise ConfigError(f"config: {function!r} is not one of {', '.join(offered)} (module {module_name})")
    return fn()


def option_fields_of(config: DataclassInstance, prefix: str = "") -> dict[str, Any]:
    """Every leaf option of a config instance: dotted key -> field type. The values' own classes are
    walked (a config function may set a subclass, e.g. a dataloader with a ``dataset`` field)."""
    out: dict[str, Any] = {}
    for f in fields(config):
        if f.name.startswith("_"):
            continue
        value = getattr(config, f.name, None)
        key = f"{prefix}{f.name}"
        if is_dataclass(value) and not isinstance(value, type):
            out.update(option_fields_of(value, key + "."))
        else:
            out[key] = f.type
    return out


def prepare_args(argv: Sequence[str], morph_options: dict[str, Any]) -> list[str]:
    """``--morph.no-<flag>`` spelled ``--morph.<flag> false`` (titan_morph's booleans take a value)."""
    return expand_negated_flags(argv, morph_options)


def parse(module: str, function: str, overrides: Sequence[str]) -> Trainer.Config:
    """TorchTitan 0.3.0's ``Trainer.Config`` for ``--module M --config FN *overrides``, as
    ``torchtitan.train`` builds it, after the overrides' names and values were checked."""
    base = _base_config(module, function)
    options = option_fields_of(base)
    args = prepare_args(overrides, {k: v for k, v in options.items() if k.startswith("morph.")})
    check_overrides(args, options)
    from torchtitan.config import ConfigManager

    return parse_quietly(lambda: ConfigManager().parse_args(["--module", module, "--config", function, *args]))


def _is_morph_model(config: Trainer.Config) -> bool:
    spec = config.model_spec
    return spec is not None and spec.name == MODEL_NAME


def job_view(config: Trainer.Config, ranks: int | None = None) -> JobView:
    """What titan_morph reads of a TorchTitan 0.3.0 ``Trainer.Config`` (``ranks``: the launcher's NGPU)."""
    return common.job_view(config, ranks, _is_morph_model(config))


def _check_schedule(config: Trainer.Config) -> None:
    """For titan_morph's model: the schedule name is one titan_morph builds."""
    if config.parallelism.pipeline_parallel_degree >= 2 and _is_morph_model(config):
        common.check_schedule(config.parallelism)


def settings_of(config: Trainer.Config, ranks: int | None = None) -> Settings:
    """The resolved settings of a TorchTitan 0.3.0 ``Trainer.Config`` (the schedule checked too)."""
    morph = getattr(config, "morph", None)
    if not isinstance(morph, Morph):
        raise ConfigError(f"morph: the config has no morph field: return MorphTrainer.Config (see {CONFIG_MODULE})")
    _check_schedule(config)
    settings = resolve(morph, job_view(config, ranks))
    _check_model(config, settings)
    return settings


def _check_model(config: Trainer.Config, settings: Settings) -> None:
    """The checks that need titan_morph's model (:func:`~titan_morph.integration.partition.check_model`),
    when the partition or the ranks' memory is set."""
    morph = settings.morph
    spec = config.model_spec
    if (
        not _is_morph_model(config)
        or spec is None
        or not (morph.partition != "even" or morph.rank_memory_gb or morph.split)
    ):
        return
    from titan_morph.integration.partition import check_model
    from titan_morph.integration.titan03.shape import model_shape
    from titan_morph.integration.titan03.synthetic import FLAVOR, sized_model

    model = sized_model(settings) if spec.flavor == FLAVOR else spec.model
    shape = model_shape(model, config.training, config.parallelism)
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    check_model(settings, shape, config.parallelism, _generate_llm_fqn_per_model_part, "parallelism.")


def load(
    function: str, overrides: Sequence[str] = (), ranks: int | None = None, module: str = CONFIG_MODULE
) -> tuple[Trainer.Config, Settings]:
    """TorchTitan's config and titan_morph's settings for a config function and its overrides:
    every check a rank would run, before any rank starts."""
    config = parse(module, function, overrides)
    return config, settings_of(config, ranks)
