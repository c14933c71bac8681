"""TorchTitan 0.2.2's job config, read once: TOML + overrides -> its JobConfig -> titan_morph's
:class:`~titan_morph.config.Settings`.

The launcher (before any rank starts), the trainer on every rank and the comparison harness all
come through :func:`load` / :func:`settings_of`, so they run the same checks in the same order:

1. the TOML file parses and names only known keys (TorchTitan's sections and ``[morph]``);
2. the command-line overrides name known options, with valid choices and numbers
   (:func:`titan_morph.config.cli.check_overrides`);
3. TorchTitan's own ``ConfigManager`` builds the JobConfig (with ``[morph]`` merged in);
4. :func:`titan_morph.config.resolve` checks TorchTitan's settings titan_morph relies on and every
   ``[morph]`` option, and returns the frozen settings;
5. for titan_morph's TrainSpec, ``[experimental] custom_import`` imports and the schedule name is
   registered.

Every problem is one :class:`~titan_morph.config.ConfigError` line naming the key.
"""

from __future__ import annotations

import importlib
import re
import sys
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from titan_morph.config import ConfigError, JobView, Settings, resolve, resolve_morph
from titan_morph.config.cli import check_overrides, expand_negated_flags, option_fields
from titan_morph.config.fields import check_unknown_keys
from titan_morph.config.schema import Inject, Morph, Synthetic
from titan_morph.config.schema import JobConfig as MorphJobConfig
from titan_morph.integration import common
from titan_morph.integration.common import parse_quietly

if TYPE_CHECKING:  # the launcher reads configs before torchtitan loads (it adapts TorchTitan to CPU first)
    from torchtitan.config import JobConfig as TitanJobConfig

    class MergedJobConfig(TitanJobConfig, MorphJobConfig):
        """TorchTitan's JobConfig with ``[morph]`` merged in: the dataclass its ``ConfigManager``
        makes (``MergedJobConfig``) when ``[job] custom_config_module`` names :data:`CONFIG_MODULE`."""


__all__ = [
    "CONFIG_MODULE",
    "check_early",
    "config_file_of",
    "job_view",
    "load",
    "load_toml",
    "prepare_args",
    "settings_of",
    "with_morph",
    "without_config_file",
]

CONFIG_MODULE = "titan_morph.integration.titan022.config"
"""What ``[job] custom_config_module`` names so that TorchTitan merges ``[morph]``."""
TRAIN_SPEC_NAME = "llama3_morph"


def load_toml(path: str | Path) -> dict[str, Any]:
    """The parsed TOML file; a missing file or a syntax error is one line naming the file and, for
    syntax errors, the line and column."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"job.config_file: {str(path)!r}: file not found") from None
    except tomllib.TOMLDecodeError as err:
        where = re.search(r"\(at line (\d+), column (\d+)\)", str(err))
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(err))
        at = f":{where.group(1)}:{where.group(2)}" if where else ""
        raise ConfigError(f"{path}{at}: invalid TOML: {message}") from None


def config_file_of(argv: Sequence[str]) -> str | None:
    """The ``--job.config_file`` value of a TorchTitan command line (None when absent)."""
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if key in ("--job.config_file", "--job.config-file"):
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def without_config_file(argv: Sequence[str]) -> list[str]:
    """``argv`` less its ``--job.config_file`` option (either spelling, ``=`` or separate value)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--job.config_file", "--job.config-file"):
            skip = True
        elif not arg.startswith(("--job.config_file=", "--job.config-file=")):
            out.append(arg)
    return out


def _morph_options() -> dict[str, Any]:
    return option_fields(MorphJobConfig)


def prepare_args(argv: Sequence[str]) -> list[str]:
    """A TorchTitan command line made ready for titan_morph: the TOML's ``[morph]`` keys checked,
    ``--morph.no-<flag>`` spelled ``--morph.<flag> false``, and the ``[morph]`` config module named
    unless the command line or the TOML names one."""
    path = config_file_of(argv)
    toml = load_toml(path) if path else {}
    if "morph" in toml:
        morph = toml["morph"]
        try:
            check_unknown_keys(morph if isinstance(morph, Mapping) else {"morph": morph}, Morph, "morph")
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
    args = expand_negated_flags(argv, _morph_options())
    named_on_cli = any(a.split("=")[0] in ("--job.custom_config_module", "--job.custom-config-module") for a in args)
    job = toml.get("job", {})
    named_in_toml = isinstance(job, Mapping) and bool(job.get("custom_config_module"))
    return args if named_on_cli or named_in_toml else [*args, "--job.custom_config_module", CONFIG_MODULE]


def _morph_overrides(argv: Sequence[str]) -> list[str]:
    """The ``--morph.*`` options of ``argv`` with their values (the others left out)."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg.startswith("--morph."):
            out.append(arg)
            if "=" not in arg and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out.append(argv[i + 1])
    return out


def check_early(config_file: str | Path, overrides: Sequence[str]) -> None:
    """The launcher's checks that need no TorchTitan (which takes seconds to import): the TOML
    parses, its ``[morph]`` keys exist, the ``--morph.*`` overrides name options with values of
    their type, and ``[morph]`` with the overrides applied (as TorchTitan's parser applies them: tyro
    over the TOML's values) passes every check that needs no pipeline -- the files a setting names
    among them. :func:`load` runs every check after it."""
    toml = load_toml(config_file)
    prepare_args(["--job.config_file", str(config_file)])  # the TOML's [morph] keys
    options = _morph_options()
    morph_args = _morph_overrides(expand_negated_flags(overrides, options))
    check_overrides(morph_args, options)
    table = toml.get("morph")
    morph = Morph()
    if isinstance(table, Mapping):
        nested = {"inject": Inject, "synthetic": Synthetic}
        morph = Morph(**{k: nested[k](**v) if k in nested and isinstance(v, Mapping) else v for k, v in table.items()})
    if morph_args:
        import tyro

        default = MorphJobConfig(morph=morph)
        morph = parse_quietly(lambda: tyro.cli(MorphJobConfig, args=morph_args, default=default)).morph
    resolve_morph(morph)


def _parse_job_config(config_file: str | Path, overrides: Sequence[str]) -> TitanJobConfig:
    """TorchTitan's JobConfig for ``--job.config_file CONFIG *overrides``, as ``torchtitan.train``
    builds it, after the TOML's keys and the overrides' names and values were checked."""
    toml = load_toml(config_file)
    argv = prepare_args(["--job.config_file", str(config_file), *overrides])
    if "torchtitan.tools.utils" not in sys.modules:  # as titan_morph.train: adapt before torchtitan loads
        from titan_morph.integration.cpu import adapt_torchtitan_to_cpu

        adapt_torchtitan_to_cpu()
    from torchtitan.config import ConfigManager
    from torchtitan.config import JobConfig as TitanJobConfig

    try:
        check_unknown_keys({k: v for k, v in toml.items() if k != "morph"}, TitanJobConfig, "")
    except ConfigError as err:
        raise ConfigError(f"{config_file}: {err}") from None
    check_overrides(argv, {**option_fields(TitanJobConfig), **_morph_options()})
    return parse_quietly(lambda: ConfigManager().parse_args(argv))


def job_view(job_config: TitanJobConfig, ranks: int | None = None) -> JobView:
    """What titan_morph reads of a TorchTitan 0.2.2 JobConfig (``ranks``: the launcher's NGPU)."""
    return common.job_view(job_config, ranks, job_config.model.name == TRAIN_SPEC_NAME)


def _check_schedule(job_config: TitanJobConfig) -> None:
    """For titan_morph's TrainSpec: ``[experimental] custom_import`` (which may register schedules)
    imports, and the schedule name is registered."""
    par = job_config.parallelism
    if par.pipeline_parallel_degree < 2 or job_config.model.name != TRAIN_SPEC_NAME:
        return
    custom = job_config.experimental.custom_import
    if custom:
        try:
            importlib.import_module(custom)
        except ImportError as err:
            raise ConfigError(f"experimental.custom_import: {custom!r} cannot be imported: {err}") from None
    common.check_schedule(par)


def _check_model(job_config: TitanJobConfig, settings: Settings) -> None:
    """The checks that need titan_morph's model (:func:`~titan_morph.integration.partition.check_model`),
    when the partition or the ranks' memory is set."""
    morph = settings.morph
    if job_config.model.name != TRAIN_SPEC_NAME or not (
        morph.partition != "even" or morph.rank_memory_gb or morph.split
    ):
        return
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part
    from torchtitan.models.llama3 import llama3_args

    from titan_morph.integration.partition import check_model
    from titan_morph.integration.titan022.shape import model_shape, synthetic_shape

    flavor = job_config.model.flavor
    if flavor == "synthetic":
        shape = synthetic_shape(settings, job_config)
    elif flavor in llama3_args:
        shape = model_shape(llama3_args[flavor], job_config)
    else:
        return  # TorchTitan names the unknown flavor itself
    check_model(settings, shape, job_config.parallelism, generate_llm_fqn_per_model_part, "[parallelism] ")


# TorchTitan hands one JobConfig to the trainer, the model args and the TrainSpec's pipelining_fn, none
# of which can carry titan_morph's settings to the next: each JobConfig is resolved once, here.
# Keyed by id (a JobConfig is an unhashable dataclass); an entry goes with its JobConfig.
_resolved: dict[int, tuple[weakref.ref[TitanJobConfig], Settings]] = {}


def _has_morph(job_config: TitanJobConfig) -> TypeGuard[MergedJobConfig]:
    return isinstance(getattr(job_config, "morph", None), Morph)


def with_morph(job_config: TitanJobConfig) -> MergedJobConfig:
    """``job_config`` as TorchTitan merged ``[morph]`` into it; one error when it did not (the
    config module was not named)."""
    if not _has_morph(job_config):
        raise ConfigError(f"morph: the [morph] section is missing: set [job] custom_config_module = {CONFIG_MODULE!r}")
    return job_config


def settings_of(job_config: TitanJobConfig, ranks: int | None = None) -> Settings:
    """The resolved settings of a TorchTitan 0.2.2 JobConfig (the schedule checked too), resolved
    on the first call for that JobConfig."""
    ref, known = _resolved.get(id(job_config), (None, None))
    if ref is not None and ref() is job_config and known is not None and known.job.ranks == ranks:
        return known
    morph = with_morph(job_config).morph
    _check_schedule(job_config)
    settings = resolve(morph, job_view(job_config, ranks))
    _check_model(job_config, settings)
    key = id(job_config)
    _resolved[key] = (weakref.ref(job_config, lambda _: _resolved.pop(key, None)), settings)
    return settings


def load(
    config_file: str | Path, overrides: Sequence[str] = (), ranks: int | None = None
) -> tuple[MergedJobConfig, Settings]:
    """TorchTitan's JobConfig (``[morph]`` merged in) and titan_morph's settings for a TOML file and
    its overrides: every check a rank would run, before any rank starts."""
    job_config = with_morph(_parse_job_config(config_file, overrides))
    return job_config, settings_of(job_config, ranks)
