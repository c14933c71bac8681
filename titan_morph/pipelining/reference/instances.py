"""Random scheduling instances shared by the search tests, the exact-gap tests and the benchmark.

An instance is a :class:`~titan_morph.pipelining.core.model.CostModel` with heterogeneous per-stage
F/I/W times, per-link delays (some links straggle, some do not) and an activation-memory budget.
Everything is drawn from one ``random.Random`` so a seed fixes the instance (the paper's §7.4
evaluates its scheduler against an MILP optimum on "randomly generated profiles"; this is ours).

Times and delays are multiples of ``resolution`` ms (1 ms by default), so the exact CP-SAT
reference (``exact.py``) can work on integers without rounding.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; annotations are not evaluated at run time
    from typing_extensions import Unpack

from titan_morph.pipelining.core.model import CostModel

MEMORY_MODES = ("tight", "loose", "scalar", "mixed", None)


def _rng(rng: random.Random | int) -> random.Random:
    return rng if isinstance(rng, random.Random) else random.Random(rng)


def _quantize(value: float, resolution: float) -> float:
    return round(round(value / resolution) * resolution, 6)


def random_memory(rng: random.Random, stages: int, microbatches: int, memory: str | None) -> tuple[int, ...] | None:
    """Per-stage budgets M_i: ``tight`` ~ 1F1B's need S−i up to ~1.5(S−i); ``loose`` >= 2S or unbounded;
    ``scalar`` one budget M in [S, N] for every stage (1F1B always fits); ``mixed`` tight or loose."""
    if memory is None:
        return None
    if memory == "scalar":
        return (rng.randint(stages, max(stages, microbatches)),) * stages
    if memory == "mixed":
        memory = rng.choice(("tight", "loose"))
    if memory == "tight":
        return tuple(max(1, rng.randint(stages - i, math.ceil(1.5 * (stages - i)))) for i in range(stages))
    if memory == "loose":
        if rng.random() < 0.5:
            return None
        return tuple(rng.randint(2 * stages, 3 * stages) for _ in range(stages))
    raise ValueError(f"memory must be one of {MEMORY_MODES}, got {memory!r}")


def random_instance(
    rng: random.Random | int,
    s_range: tuple[int, int] = (3, 5),
    n_mult: tuple[float, float] = (1, 3),
    time_range: tuple[float, float] = (5, 20),
    delay_range: tuple[float, float] = (0, 60),
    memory: str | None = "mixed",
    zero_delay_prob: float = 0.35,
    resolution: float = 1.0,
    delay_factor: tuple[float, float] | None = None,
) -> CostModel:
    """One random instance: S in ``s_range``, N in [S·n_mult[0], S·n_mult[1]], F/I/W per stage in
    ``time_range`` ms, each link's delay 0 with probability ``zero_delay_prob`` else in
    ``delay_range`` ms (or, with ``delay_factor = (lo, hi)``, in [lo, hi] × t^F of the sending
    stage), and memory per :func:`random_memory` (``"mixed"`` picks tight or loose).

    ``rng`` is a ``random.Random`` or an int seed; the result depends only on it and the arguments.
    """
    rng = _rng(rng)
    if not (1 <= s_range[0] <= s_range[1]):
        raise ValueError(f"s_range must satisfy 1 <= low <= high, got {s_range}")
    if not (0 < n_mult[0] <= n_mult[1]):
        raise ValueError(f"n_mult must satisfy 0 < low <= high, got {n_mult}")
    if not (0 <= time_range[0] <= time_range[1]):
        raise ValueError(f"time_range must satisfy 0 <= low <= high ms, got {time_range}")
    if not (0 <= delay_range[0] <= delay_range[1]):
        raise ValueError(f"delay_range must satisfy 0 <= low <= high ms, got {delay_range}")
    if not (0 <= zero_delay_prob <= 1):
        raise ValueError(f"zero_delay_prob must be in [0, 1], got {zero_delay_prob}")
    if resolution <= 0:
        raise ValueError(f"resolution must be > 0 ms, got {resolution}")
    if delay_factor is not None and not (0 <= delay_factor[0] <= delay_factor[1]):
        raise ValueError(f"delay_factor must satisfy 0 <= low <= high, got {delay_factor}")
    stages = rng.randint(*s_range)
    microbatches = max(1, rng.randint(math.ceil(stages * n_mult[0]), math.floor(stages * n_mult[1])))

    def times() -> tuple[float, ...]:
        return tuple(_quantize(rng.uniform(*time_range), resolution) for _ in range(stages))

    fwd, bwd, wgt = times(), times(), times()

    def delay(link: int) -> float:
        if rng.random() < zero_delay_prob:
            return 0.0
        if delay_factor is None:
            return _quantize(rng.uniform(*delay_range), resolution)
        return _quantize(rng.uniform(*delay_factor) * fwd[link], resolution)

    delays = tuple(delay(link) for link in range(stages - 1))
    mem = random_memory(rng, stages, microbatches, memory)
    return CostModel(stages, microbatches, fwd, bwd, wgt, delays, mem)


class InstanceOptions(TypedDict, total=False):
    """The keyword arguments of :func:`random_instance`, for :func:`instance_set`."""

    s_range: tuple[int, int]
    n_mult: tuple[float, float]
    time_range: tuple[float, float]
    delay_range: tuple[float, float]
    memory: str | None
    zero_delay_prob: float
    resolution: float
    delay_factor: tuple[float, float] | None


def instance_set(seed: int, count: int, **kwargs: Unpack[InstanceOptions]) -> list[CostModel]:
    """``count`` instances from one seeded stream (``kwargs`` go to :func:`random_instance`)."""
    rng = random.Random(seed)
    return [random_instance(rng, **kwargs) for _ in range(count)]


def planner_set(seed: int, count: int) -> list[CostModel]:
    """The planner's quality set: S 3–6, N in S..3S, heterogeneous F/I/W in 5–20 ms, delays 0–3×t^F
    (a third of the links without delay), memory cycling through tight, loose and one-budget-for-all
    (``scalar``, M in S..N). The search's gap to the exact optimum is measured on such sets."""
    rng = random.Random(seed)
    modes = ("tight", "loose", "scalar")
    return [
        random_instance(rng, s_range=(3, 6), n_mult=(1, 3), delay_factor=(0, 3), memory=modes[k % 3])
        for k in range(count)
    ]


def describe(model: CostModel) -> str:
    """One line for logs: ``S=4 N=9 F=[..] I=[..] W=[..] c=[..] M=[..]``."""

    def fmt(values: Sequence[float]) -> str:
        return "[" + ",".join(f"{v:g}" for v in values) + "]"

    mem = "inf" if model.memory is None else fmt(model.memory)
    tau = f" tau={fmt(model.transmit)}" if model.has_transmit else ""
    return (
        f"S={model.stages} N={model.microbatches} F={fmt(model.fwd)} I={fmt(model.bwd)} W={fmt(model.wgt)}"
        f" c={fmt(model.delays)}{tau} M={mem}"
    )


def bandwidth_instance(
    rng: random.Random | int,
    s_range: tuple[int, int] = (3, 5),
    n_range: tuple[int, int] = (8, 24),
    transmit_range: tuple[float, float] = (12, 30),
    latency_range: tuple[float, float] = (0, 20),
    memory: str | None = "mixed",
    slow_links: tuple[int, int] = (1, 2),
) -> CostModel:
    """One instance of the bandwidth model (links with a transmit time per message): S in ``s_range``,
    N in ``n_range``, F/I/W per stage in 5–20 ms, ``slow_links`` links (1 or 2 by default) with a
    transmit time in ``transmit_range`` and a latency in ``latency_range`` ms (1 ms grid), the
    other links free, and memory per :func:`random_memory` (capped at N)."""
    rng = _rng(rng)
    stages = rng.randint(*s_range)
    microbatches = rng.randint(*n_range)

    def times() -> tuple[float, ...]:
        return tuple(float(rng.randint(5, 20)) for _ in range(stages))

    fwd, bwd, wgt = times(), times(), times()
    links = stages - 1
    slow = rng.sample(range(links), min(links, rng.randint(*slow_links)))
    delays = [0.0] * links
    transmit = [0.0] * links
    for link in slow:
        transmit[link] = float(rng.randint(int(transmit_range[0]), int(transmit_range[1])))
        delays[link] = float(rng.randint(int(latency_range[0]), int(latency_range[1])))
    mem = random_memory(rng, stages, microbatches, memory)
    if mem is not None:
        mem = tuple(min(m, microbatches) for m in mem)
    return CostModel(stages, microbatches, fwd, bwd, wgt, tuple(delays), mem, transmit=tuple(transmit))


def bandwidth_set(seed: int, count: int, **kwargs: Any) -> list[CostModel]:
    """``count`` :func:`bandwidth_instance` instances from one seeded stream."""
    rng = random.Random(seed)
    return [bandwidth_instance(rng, **kwargs) for _ in range(count)]
