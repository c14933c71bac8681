"""What a field's type allows, and the one routine that turns a raw value into its parsed form.

A schema field says what it accepts through its annotation: ``Literal[...]`` for choices,
``Annotated[int | float, Range(...)]`` for bounded numbers, ``Annotated[list[...], Range(...),
Per(...)]`` for per-link / per-stage lists and ``RankPairs()`` for rank pairs. :func:`parse_field`
reads that annotation, checks the raw value (TOML, command line, Python) and returns it parsed:
lists as tuples (one group per link or stage where the pipeline is known), rank pairs as tuples of
``(a, b)``. Every error is one :class:`ConfigError` whose message starts with the key.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Annotated, Any, Literal, get_args, get_origin

from titan_morph.pipelining.core.values import parse_list

__all__ = [
    "ConfigError",
    "check_unknown_keys",
    "Layout",
    "Per",
    "Range",
    "RankPairs",
    "coerce_list",
    "coerce_pairs",
    "fail",
    "limit_reason",
    "parse_field",
    "parse_rank_pairs",
    "unwrap",
]


class ConfigError(ValueError):
    """An option is invalid; the message starts with the key and says what is allowed."""


def fail(key: str, value: object, problem: str) -> ConfigError:
    return ConfigError(f"{key}: {value!r} {problem}")


@dataclass(frozen=True)
class Range:
    """Allowed values of a number, or of every element of a list.

    ``low <= v <= high`` (``low < v`` when ``low_open``); ``inf`` only when ``allow_inf``. ``delay``
    marks a delay in ms, also bounded by the run's delay limit (:attr:`Layout.delay_limit_ms`).
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    allow_inf: bool = False
    delay: bool = False

    def describe(self, limit: float | None = None) -> str:
        high = self.high if limit is None else (limit if self.high is None else min(self.high, limit))
        low = "" if self.low is None else f"{'>' if self.low_open else '>='} {self.low:g}"
        top = "" if high is None else f"<= {high:g}"
        text = " and ".join(p for p in (low, top) if p)
        return text + (" (inf = link down)" if self.allow_inf else "")


@dataclass(frozen=True)
class Per:
    """A list with ``width`` values per pipeline ``unit`` ("link": S-1 of them; "stage": S; "rank":
    one per pipeline rank).

    One group of ``width`` values stands for every link/stage/rank. An empty list means "not set"
    unless ``required``. ``or_pairs``: when ``[morph.inject] rank_links`` names rank pairs, one value
    per pair instead of per link. ``or_layers``: when ``[morph.synthetic] layers`` is set, one value
    per layer of the synthetic model instead of per stage. ``or_world``: one value per rank of the
    world (a host of a DP x PP job) is also accepted.
    """

    unit: Literal["link", "stage", "rank"]
    width: int = 1
    required: bool = False
    or_pairs: bool = False
    or_layers: bool = False
    or_world: bool = False


@dataclass(frozen=True)
class RankPairs:
    """A list of rank pairs ``"a-b"`` (two different ranks, no pair twice)."""


@dataclass(frozen=True)
class Layout:
    """What the pipeline-dependent parts of parsing need: pipeline ranks (``stages``, None =
    unknown), the delay limit, stages per rank (1; 2 in a V; None = unknown), the number of rank
    pairs of ``rank_links`` (per-pair lists), the synthetic model's layers (per-layer lists) and the
    ranks of the world (per-host lists)."""

    stages: int | None = None
    delay_limit_ms: float | None = None
    stages_per_rank: int | None = 1
    pairs: int | None = None
    layers: int | None = None
    world: int | None = None

    def count(self, per: Per) -> int | None:
        """Groups a ``per`` list holds in this layout (None = unknown)."""
        if per.or_pairs and self.pairs:
            return self.pairs
        if per.or_layers and self.layers:
            return self.layers
        if self.stages is None:
            return None
        if per.unit == "link":
            return self.stages - 1
        if per.unit == "rank":
            return self.stages
        return None if self.stages_per_rank is None else self.stages * self.stages_per_rank


def limit_reason(limit: float) -> str:
    return (
        f"the delay limit {limit:g} ms is [comm] train_timeout_seconds x 1000 / microbatches "
        "(a step may wait out the delay once per microbatch)"
    )


def unwrap(ftype: Any) -> tuple[Any, tuple[Any, ...]]:
    """(base type, metadata) of ``Annotated[base, *metadata]`` (nested Annotated flattened)."""
    meta: tuple[Any, ...] = ()
    while get_origin(ftype) is Annotated:
        args = get_args(ftype)
        ftype, meta = args[0], meta + tuple(args[1:])
    return ftype, meta


def coerce_list(value: Any, kind: type) -> Any:
    """A TOML list, a comma/semicolon string or a scalar as ``list[kind]``; nested lists are
    flattened (``[[F, B, W], ...]``). Anything that does not parse is returned unchanged, for
    :func:`parse_field` to report with its key."""
    if isinstance(value, str):
        value = value.replace(";", ",")
    elif isinstance(value, Sequence) and any(isinstance(v, (list, tuple)) for v in value):
        value = [x for v in value for x in (v if isinstance(v, (list, tuple)) else (v,))]
    try:
        return list(parse_list(value, kind, name="value", allow_inf=True))
    except ValueError:
        return value


def parse_rank_pairs(spec: Any, key: str = "morph.inject.rank_links") -> tuple[tuple[int, int], ...]:
    """Rank pairs from ``"a-b,c-d"``, a list of ``"a-b"`` strings or a list of ``[a, b]`` lists.

    Each element is two different integers >= 0; a pair may not appear twice (in either order).
    """
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return ()
    if isinstance(spec, str):
        items: list[Any] = spec.replace(";", ",").split(",")
    elif isinstance(spec, Sequence):
        items = list(spec)
    else:
        raise ConfigError(f"{key}: {spec!r} is not a list of rank pairs such as 0-1,2-3")
    pairs: list[tuple[int, int]] = []
    for item in items:
        try:
            a, b = parse_list(
                item if isinstance(item, (str, list, tuple)) else str(item), int, name=key, sep="-", low=0
            )
        except ValueError as err:
            raise ConfigError(f"{key}: {item!r} is not a rank pair a-b of two ranks >= 0 ({err})") from None
        if a == b:
            raise ConfigError(f"{key}: {item!r} joins rank {a} to itself; a pair needs two different ranks")
        if (min(a, b), max(a, b)) in {(min(p), max(p)) for p in pairs}:
            raise ConfigError(f"{key}: pair {a}-{b} is listed twice")
        pairs.append((a, b))
    return tuple(pairs)


def coerce_pairs(value: Any) -> Any:
    """``"0-1,2-3"``, ``["0-1", "2-3"]`` or ``[[0, 1], [2, 3]]`` as ``["0-1", "2-3"]``; anything that
    does not parse is returned unchanged (reported with the key when parsed)."""
    try:
        return [f"{a}-{b}" for a, b in parse_rank_pairs(value, "value")]
    except (ConfigError, TypeError):
        return value


def _numbers(key: str, value: Any, kind: type, rng: Range, layout: Layout) -> tuple[Any, ...]:
    """``value`` as a tuple of ``kind`` within ``rng`` (and the delay limit for delays)."""
    limit = layout.delay_limit_ms if rng.delay else None
    try:
        values = parse_list(coerce_list(value, kind), kind, name=key, allow_inf=rng.allow_inf)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    high = limit if rng.high is None else (rng.high if limit is None else min(rng.high, limit))
    for v in values:
        below = rng.low is not None and (v <= rng.low if rng.low_open else v < rng.low)
        above = high is not None and v > high and not (rng.allow_inf and math.isinf(v))
        if below or above:
            shown = value if isinstance(value, (int, float)) else v
            reason = f"; {limit_reason(limit)}" if above and limit is not None and high == limit else ""
            raise fail(key, shown, f"is out of range: must be {rng.describe(limit)}{reason}")
    return values


def _groups(key: str, value: Any, values: tuple[Any, ...], per: Per, layout: Layout) -> tuple[Any, ...]:
    """``values`` with one group of ``per.width`` per link/stage (a lone group repeated) where the
    layout says how many; as given (a whole number of groups) where it does not."""
    if not values:
        if per.required:
            raise fail(key, value, f"needs at least {per.width} value(s)")
        return values
    groups = layout.count(per)
    unit = "rank pair" if per.or_pairs and layout.pairs else "layer" if per.or_layers and layout.layers else per.unit
    what = f"one per {unit}" if per.width == 1 else f"one group of {per.width} per {unit}"
    if groups is None:
        if len(values) % per.width:
            raise fail(key, value, f"needs a multiple of {per.width} values ({what}), got {len(values)}")
        return values
    if len(values) == per.width:
        return values * groups
    world = layout.world if per.or_world and layout.world not in (None, groups) else None
    if world is not None and len(values) == per.width * world:
        return values
    if len(values) != per.width * groups:
        if world is not None:
            allowed = f"{per.width}, {per.width * groups} (one per pipeline {unit}) or {per.width * world}"
            raise fail(key, value, f"needs {allowed} values (one per rank of the world), got {len(values)}")
        raise fail(
            key,
            value,
            f"needs {per.width} or {per.width * groups} values ({what}, {groups} {unit}s), got {len(values)}",
        )
    return values


def parse_field(key: str, value: Any, ftype: Any, layout: Layout) -> Any:
    """Check ``value`` against its field type and return it parsed (see the module docstring).

    Dataclass-typed fields are returned as a dict of their parsed fields.
    """
    base, meta = unwrap(ftype)
    rng = next((m for m in meta if isinstance(m, Range)), Range())
    per = next((m for m in meta if isinstance(m, Per)), None)
    if is_dataclass(base):
        if not is_dataclass(value):
            raise fail(key, value, f"must be a table [{key}]")
        return {f.name: parse_field(f"{key}.{f.name}", getattr(value, f.name), f.type, layout) for f in fields(value)}
    if get_origin(base) is Literal:
        if value not in get_args(base):
            raise fail(key, value, f"is not one of {', '.join(get_args(base))}")
        return value
    if base is bool:
        if not isinstance(value, bool):
            raise fail(key, value, "is not a boolean: write true or false (unquoted in TOML)")
        return value
    if base in (int, float):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (base is int and not isinstance(value, int)):
            raise fail(key, value, f"must be {'an integer' if base is int else 'a number'}")
        _numbers(key, value, float, rng, layout)
        return base(value)
    if base is str:
        if not isinstance(value, str):
            raise fail(key, value, "must be a string")
        return value
    if any(isinstance(m, RankPairs) for m in meta):
        return parse_rank_pairs(value, key)
    if get_origin(base) is list:
        values = _numbers(key, value, get_args(base)[0], rng, layout)
        return values if per is None else _groups(key, value, values, per, layout)
    raise TypeError(f"{key}: no parser for the field type {ftype!r}")


def check_unknown_keys(table: Mapping[str, Any], cls: type, prefix: str) -> None:
    """Reject keys of a raw TOML table that the dataclass ``cls`` does not define (recursively);
    with ``prefix`` = "" the table is a whole TOML file."""
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    where = f"[{prefix}]" if prefix else "the top level"
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else key
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{name}: unknown key{hint}; allowed keys in {where} are {', '.join(sorted(known))}")
        ftype, _ = unwrap(known[key].type)
        if is_dataclass(ftype):
            if not isinstance(value, Mapping):
                raise fail(name, value, f"must be a table [{name}]")
            check_unknown_keys(value, ftype, name)  # type: ignore[arg-type]
