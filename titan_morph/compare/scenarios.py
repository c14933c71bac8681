"""Named scenarios: the paper's §7 straggler settings as ``[morph.inject]`` overrides, at small scale.

A scenario expands, for a pipeline with ``num_links = PP - 1`` links (link i joins stage i and
i+1), into one or more *cases*; each case is one set of injected delays that every variant runs
under (a sweep such as Fig. 15 has several). Injections start at step 1 and last to the end
unless the scenario says otherwise, and the random ones use a fixed seed, so every variant sees
the same delays.

Paper references (PipeMorph, NSDI'26): Fig. 5/8 (§3.1, simulator only), Fig. 15 (delay sweep on
the last link), Fig. 16 (first vs last link), Fig. 17 (several slow links), Fig. 18 (random
N(30, 10) ms delays re-drawn at U(·) ms intervals, traces A/B/C), Table 3 / §7.5 (trace replay
with a link going down), Fig. 19 / §7.3 (a slow pair of ranks inside a DP group, DP x PP).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from titan_morph.compare.variants import HYBRID_VARIANTS

__all__ = [
    "Case",
    "Scenario",
    "SCENARIOS",
    "ScenarioError",
    "get_scenario",
    "expand",
    "describe_all",
    "RANDOM_SEED",
]

RANDOM_SEED = 1
"""Seed of the random (Fig. 18) delays: the same for every variant and run."""


class ScenarioError(ValueError):
    """Unknown scenario, or one that does not fit the pipeline (e.g. too few links)."""


@dataclass(frozen=True)
class Case:
    """One injected-delay setting; ``name`` is its sub-folder ("" for single-case scenarios)."""

    name: str
    label: str
    overrides: tuple[str, ...]
    delays_ms: tuple[float, ...] | None = None
    """Static per-link delays (None for random/trace injection): the simulator's links."""
    x: float | None = None
    """Sweep coordinate (e.g. the delay in ms) for the scenario's summary plot."""


@dataclass(frozen=True)
class Scenario:
    """A named comparison setting; ``cases(num_links)`` expands it for a pipeline."""

    name: str
    description: str
    cases: Callable[[int], tuple[Case, ...]] = field(repr=False)
    simulator_only: bool = False
    default_steps: int | None = None
    """Training steps when ``--steps`` is not given (None: the harness default)."""
    sweep_axis: str | None = None
    """x-axis label of the summary plot over cases (None: a bar chart by case label)."""
    variants: tuple[str, ...] | None = None
    """Variants run when ``--variants`` is not given (None: the harness defaults)."""


def _fmt(ms: float) -> str:
    return "inf" if math.isinf(ms) else f"{ms:g}"


def _window() -> tuple[str, ...]:
    # Explicit so a TOML's own [morph.inject] window cannot shift the scenario.
    return ("--morph.inject.start_step", "1", "--morph.inject.end_step", "0", "--morph.inject.direction", "both")


def static_overrides(delays: Sequence[float]) -> tuple[str, ...]:
    """``[morph.inject]`` overrides for fixed per-link delays (all zero: no injection at all)."""
    if not any(d > 0 for d in delays):
        return ("--morph.inject.mode", "none")
    spec = ",".join(_fmt(d) for d in delays)
    return ("--morph.inject.mode", "static", "--morph.inject.delays_ms", spec, *_window())


def _on(num_links: int, slow: dict[int, float]) -> tuple[float, ...]:
    return tuple(slow.get(link, 0.0) for link in range(num_links))


def _static_case(name: str, label: str, num_links: int, slow: dict[int, float], x: float | None = None) -> Case:
    delays = _on(num_links, slow)
    return Case(name, label, static_overrides(delays), delays, x)


def _link(i: int) -> str:
    return f"link {i} ({i}<->{i + 1})"


def _need_links(scenario: str, num_links: int, at_least: int, why: str) -> None:
    if num_links < at_least:
        raise ScenarioError(
            f"scenario {scenario!r} needs at least {at_least} pipeline links (PP >= {at_least + 1}) {why};"
            f" this config has PP = {num_links + 1}"
        )


def _none(num_links: int) -> tuple[Case, ...]:
    return (Case("", "no injected delay", ("--morph.inject.mode", "none"), (0.0,) * num_links, 0.0),)


def _last_link_60(num_links: int) -> tuple[Case, ...]:
    last = num_links - 1
    return (_static_case("", f"60 ms on the last {_link(last)}", num_links, {last: 60.0}, 60.0),)


FIG15_DELAYS = (0.0, 15.0, 30.0, 45.0, 60.0)


def _fig15(num_links: int) -> tuple[Case, ...]:
    last = num_links - 1
    return tuple(
        _static_case(f"{d:g}ms", f"{d:g} ms on the last {_link(last)}", num_links, {last: d}, d) for d in FIG15_DELAYS
    )


def _fig16(num_links: int) -> tuple[Case, ...]:
    _need_links("fig16", num_links, 2, "(the first and the last link must differ)")
    last = num_links - 1
    cases = []
    for where, link in (("first", 0), ("last", last)):
        for d in (30.0, 60.0):
            cases.append(
                _static_case(f"{where}-{d:g}ms", f"{d:g} ms on the {where} {_link(link)}", num_links, {link: d})
            )
    return tuple(cases)


def _fig17(num_links: int) -> tuple[Case, ...]:
    _need_links("fig17", num_links, 3, "(a skip pair 0-1 + 2-3)")
    last = num_links - 1
    sets: list[tuple[str, str, tuple[int, ...]]] = [
        ("adjacent", "adjacent links 0 and 1", (0, 1)),
        ("skip", "skip links 0 and 2", (0, 2)),
    ]
    if last != 2:  # at PP = 4 the first+last pair is the skip pair
        sets.append(("first-last", f"first and last links 0 and {last}", (0, last)))
    if num_links >= 7:
        sets.append(("three-skip", f"three skip links 0, {last // 2} and {last}", (0, last // 2, last)))
    cases = []
    for name, label, links in sets:
        if name == "skip" and last == 2:
            label += " (= first and last at PP = 4)"
        cases.append(_static_case(name, f"30 ms on {label}", num_links, {link: 30.0 for link in links}))
    return tuple(cases)


FIG18_TRACES = {"A": (50, 100), "B": (100, 200), "C": (200, 400)}


def random_overrides(interval: tuple[float, float], mean: float = 30.0, std: float = 10.0) -> tuple[str, ...]:
    """§7.2's dynamic stragglers on every link: N(mean, std) ms re-drawn every U(interval) ms."""
    return (
        "--morph.inject.mode",
        "random",
        "--morph.inject.random_mean_ms",
        f"{mean:g}",
        "--morph.inject.random_std_ms",
        f"{std:g}",
        "--morph.inject.random_interval_ms",
        f"{interval[0]:g},{interval[1]:g}",
        "--morph.inject.links",
        "",
        "--morph.inject.seed",
        str(RANDOM_SEED),
        *_window(),
    )


def _fig18_case(trace: str, name: str = "") -> Case:
    low, high = FIG18_TRACES[trace]
    label = f"trace {trace}: N(30, 10) ms on every link, re-drawn every U({low}, {high}) ms"
    return Case(name, label, random_overrides((low, high)))


def _fig18(num_links: int) -> tuple[Case, ...]:
    return tuple(_fig18_case(t, t) for t in FIG18_TRACES)


def _fig18_single(trace: str, _links: int) -> tuple[Case, ...]:
    """One Fig. 18 trace as its own scenario."""
    return (_fig18_case(trace),)


def _table3(num_links: int) -> tuple[Case, ...]:
    overrides = ("--morph.inject.mode", "trace", "--morph.inject.trace_file", "table3", *_window())
    down = min(num_links - 1, 2 * num_links // 7)  # stragglers.table3_trace's mapping of the paper's 8 stages
    label = (
        f"Table 3 trace rescaled onto the run's steps; the paper's link 2<->3, here {_link(down)},"
        " goes down at 94 % of the run"
    )
    return (Case("", label, overrides),)


FIG19_DELAYS = (0.0, 10.0, 20.0, 30.0)
FIG19_PAIR = "0-1"
"""Ranks 0 and 1: stage 0's DP group in TorchTitan's layout (pipeline outermost)."""


def rank_pair_overrides(pair: str, delay_ms: float) -> tuple[str, ...]:
    """``[morph.inject]`` overrides for one slow pair of ranks (0 ms: no injection at all)."""
    if delay_ms <= 0:
        return ("--morph.inject.mode", "none")
    spec = ("--morph.inject.rank_links", pair, "--morph.inject.delays_ms", _fmt(delay_ms))
    return ("--morph.inject.mode", "static", *spec, *_window())


def _fig19(num_links: int) -> tuple[Case, ...]:
    a, b = FIG19_PAIR.split("-")
    return tuple(
        Case(
            f"{d:g}ms",
            f"{d:g} ms between ranks {a} and {b} (stage 0's DP group)",
            rank_pair_overrides(FIG19_PAIR, d),
            None,
            d,
        )
        for d in FIG19_DELAYS
    )


def _simulator_only(num_links: int) -> tuple[Case, ...]:
    return ()


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("none", "no injected delay (each schedule's baseline)", _none),
        Scenario("last-link-60ms", "60 ms static delay on the last link", _last_link_60),
        Scenario("fig15", "Fig. 15: delay sweep 0/15/30/45/60 ms on the last link", _fig15, sweep_axis="delay (ms)"),
        Scenario("fig16", "Fig. 16: 30/60 ms on the first vs the last link", _fig16),
        Scenario("fig17", "Fig. 17: 30 ms on several links (adjacent, skip, first+last)", _fig17),
        Scenario("fig18", "Fig. 18: random N(30,10) ms on every link, traces A, B and C", _fig18),
        *(
            Scenario(
                f"fig18-{t}",
                f"Fig. 18 trace {t}: random N(30,10) ms on every link, re-drawn every U({lo},{hi}) ms",
                functools.partial(_fig18_single, t),
            )
            for t, (lo, hi) in FIG18_TRACES.items()
        ),
        Scenario(
            "table3",
            "§7.5 / Table 3: trace replay with per-link delay events and a link going down",
            _table3,
            default_steps=30,
        ),
        Scenario(
            "fig19",
            "Fig. 19 (DP x PP): 0/10/20/30 ms between the two ranks of stage 0's DP group",
            _fig19,
            sweep_axis="delay (ms)",
            variants=HYBRID_VARIANTS,
        ),
        Scenario(
            "fig5-8",
            "Fig. 5/8 (simulator only, no training): ZB-H2 under a slow link; delay and bubble rate vs slackness",
            _simulator_only,
            simulator_only=True,
        ),
    )
}


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name`` (case-insensitive) or a :class:`ScenarioError` listing them."""
    by_lower = {key.lower(): s for key, s in SCENARIOS.items()}
    scenario = by_lower.get(name.strip().lower())
    if scenario is None:
        raise ScenarioError(f"unknown scenario {name!r}: allowed scenarios are {', '.join(SCENARIOS)}")
    return scenario


def expand(name: str, num_links: int) -> tuple[Case, ...]:
    """The cases of scenario ``name`` for a pipeline with ``num_links`` links (PP - 1 >= 1)."""
    scenario = get_scenario(name)
    if not scenario.simulator_only and num_links < 1:
        raise ScenarioError(
            f"scenario {scenario.name!r} injects link delays: it needs PP >= 2, got PP = {num_links + 1}"
        )
    return scenario.cases(num_links)


def describe_all() -> str:
    """One line per scenario (``--list``)."""
    width = max(len(name) for name in SCENARIOS)
    return "\n".join(f"{name:<{width}}  {s.description}" for name, s in SCENARIOS.items())
