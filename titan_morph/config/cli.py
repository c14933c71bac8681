"""The command-line side of the schema: how tyro reads titan_morph's option types, and the checks
of ``--section.key value`` overrides that name what is wrong before tyro's parser sees them.

TorchTitan builds its command line with tyro from the config dataclasses. titan_morph's booleans
take a value (``--morph.monitor false``; a bare ``--morph.monitor`` means true) and its lists are
one token (``--morph.inject.delays_ms 0,0,60``): the constructor specs below say so. A token that
does not parse is kept raw, so that the one check pass (:func:`~titan_morph.config.fields.parse_field`)
reports it with its key.

:func:`check_overrides` walks the overrides against the dataclass tree itself: an unknown option,
a value outside a ``Literal``'s choices or a non-number for a number is one line naming the key,
instead of tyro's boxed help text.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import fields, is_dataclass
from typing import Annotated, Any, Literal, get_args, get_origin

import tyro.conf
from tyro.constructors import PrimitiveConstructorSpec

from titan_morph.config.fields import ConfigError, coerce_list, coerce_pairs, unwrap

__all__ = ["Bool", "FloatList", "IntList", "PairList", "check_overrides", "expand_negated_flags", "option_fields"]

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _bool_from_cli(args: list[str]) -> bool:
    if not args:
        return True
    word = args[0].strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"{args[0]!r} is not a boolean: write true or false")


_CLI_BOOL = PrimitiveConstructorSpec(
    nargs=(0, 1),
    metavar="[true|false]",
    instance_from_str=_bool_from_cli,
    is_instance=lambda value: isinstance(value, bool),
    str_from_instance=lambda value: ["true" if value else "false"],
)


def _cli_list(kind: type) -> PrimitiveConstructorSpec[Any]:
    """One token ``A,B,C`` (``;`` also separates), kept raw when it does not parse."""
    return PrimitiveConstructorSpec(
        nargs=1,
        metavar="A,B,..." if kind is float else "I,J,...",
        instance_from_str=lambda args: coerce_list(args[0], kind),
        is_instance=lambda value: isinstance(value, (list, str)),
        str_from_instance=lambda value: [",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)],
    )


_CLI_PAIRS = PrimitiveConstructorSpec(
    nargs=1,
    metavar="A-B,C-D,...",
    instance_from_str=lambda args: coerce_pairs(args[0]),
    is_instance=lambda value: isinstance(value, (list, str)),
    str_from_instance=lambda value: [",".join(str(v) for v in value)],
)

Bool = Annotated[bool, tyro.conf.FlagConversionOff, _CLI_BOOL]
FloatList = Annotated[list[float], _cli_list(float)]
IntList = Annotated[list[int], _cli_list(int)]
PairList = Annotated[list[str], _CLI_PAIRS]


def option_fields(cls: type, prefix: str = "") -> dict[str, Any]:
    """Every leaf option below the dataclass ``cls``: dotted key -> field type."""
    out: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        key = f"{prefix}{f.name}"
        base, _ = unwrap(f.type)
        if is_dataclass(base):
            out.update(option_fields(base, key + "."))  # type: ignore[arg-type]
        else:
            out[key] = f.type
    return out


def _is_value_bool(ftype: Any) -> bool:
    """A boolean that takes a value on the command line (titan_morph's), not a bare flag."""
    base, meta = unwrap(ftype)
    return base is bool and _CLI_BOOL in meta


def expand_negated_flags(argv: Sequence[str], options: dict[str, Any]) -> list[str]:
    """``--morph.no-adapt`` (TorchTitan's spelling of a false boolean flag) -> ``--morph.adapt false``
    for the booleans that take a value (``options``: :func:`option_fields`); other arguments are
    returned unchanged."""
    out: list[str] = []
    for arg in argv:
        head, _, name = arg[2:].rpartition(".") if arg.startswith("--") else ("", "", "")
        plain = name[3:] if name.startswith(("no-", "no_")) else ""
        key = f"{head}.{plain.replace('-', '_')}"
        known = plain and key in options and _is_value_bool(options[key])
        out.extend([f"--{key}", "false"] if known else [arg])
    return out


def _check_value(key: str, raw: str, ftype: Any) -> None:
    base, _ = unwrap(ftype)
    if _is_value_bool(ftype):
        try:
            _bool_from_cli([raw])
        except ValueError as err:
            raise ConfigError(f"{key}: {err}") from None
    elif get_origin(base) is Literal:
        choices = [str(c) for c in get_args(base)]
        if raw not in choices:
            raise ConfigError(f"{key}: {raw!r} is not one of {', '.join(choices)}")
    elif base in (int, float):
        try:
            base(raw)
        except ValueError:
            raise ConfigError(f"{key}: {raw!r} is not {'an integer' if base is int else 'a number'}") from None


def check_overrides(argv: Sequence[str], options: dict[str, Any]) -> None:
    """Check ``--section.key [value]`` overrides against ``options`` (:func:`option_fields` of the
    whole job config): the key exists (with a suggestion when close to one), a choice is one of its
    ``Literal``'s values, a number parses. Other tokens (values of list options, bare flags) are
    left to tyro. Raises one :class:`~titan_morph.config.fields.ConfigError` line."""
    dashed = {k.replace("_", "-"): k for k in options}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--") or arg in ("--help", "-h"):
            continue
        flag, eq, inline = arg[2:].partition("=")
        key = dashed.get(flag.replace("_", "-"))
        if key is None:
            head, _, name = flag.rpartition(".")
            negated = name.startswith(("no-", "no_")) and f"{head}.{name[3:]}".replace("_", "-") in dashed
            if negated or flag.replace("_", "-").startswith("no-") and flag[3:].replace("_", "-") in dashed:
                continue
            close = difflib.get_close_matches(flag, list(options), n=1)
            hint = f" (did you mean --{close[0]}?)" if close else ""
            raise ConfigError(f"unrecognized option(s): --{flag}{hint}")
        has_value = bool(eq) or (i < len(argv) and not argv[i].startswith("--"))
        if has_value:
            value = inline if eq else argv[i]
            i += 0 if eq else 1
            _check_value(key, value, options[key])
