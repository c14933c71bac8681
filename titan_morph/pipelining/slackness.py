"""Slackness analysis and warm-up planning (paper §4.1–§4.2: Eq. 1, Alg. 1, Alg. 2).

The slackness of link i is Δ_i = x_i − x_{i+1}, the difference of warm-up forward counts of the
two stages it joins (non-negative by Lemma 1). Theorem 1: with uniform op time t, a delay c_i is
absorbed (accumulated delay Θ(c_i)) iff c_i <= (Δ_i − 1)·t, and cascades (Θ(N·c_i/(Δ_i − 1)))
beyond. Eq. 1 is the heterogeneous form::

    t^F_i + t^B_i + 2·c_i <= Δ_i · (t^F_{i+1} + t^B_{i+1})                      (1)

Alg. 1 (initial plan, no delay known) maximises min_i Δ_i under the memory budget; Alg. 2
(dynamic adaptation) picks, from measured delays, the smallest Δ_i that satisfies Eq. 1.
The deviations from the paper's pseudo-code are listed in each function's docstring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from titan_morph.pipelining.model import CostModel

__all__ = [
    "tolerance_ms",
    "tolerates",
    "required_slackness",
    "initial_warmup",
    "adapted_warmup",
    "uniform_warmup",
]


def _slackness(model: CostModel, warmup: Sequence[int], link: int) -> int:
    if not 0 <= link < model.stages - 1:
        raise ValueError(f"link must be in 0..{model.stages - 2} (link i joins stages i and i+1), got {link}")
    if len(warmup) != model.stages:
        raise ValueError(f"warmup needs {model.stages} values (one x_i per stage), got {len(warmup)}")
    return int(warmup[link]) - int(warmup[link + 1])


def tolerance_ms(model: CostModel, warmup: Sequence[int], link: int) -> float:
    """Largest delay c_link that Eq. 1 absorbs: (Δ_i(t^F_{i+1} + t^B_{i+1}) − t^F_i − t^B_i) / 2.

    Negative means even a zero delay cascades (e.g. Δ_i = 0). With t^F = t^B = t this is
    (Δ_i − 1)·t, Theorem 1's threshold.
    """
    delta = _slackness(model, warmup, link)
    i = link
    return (delta * (model.fwd[i + 1] + model.bwd[i + 1]) - model.fwd[i] - model.bwd[i]) / 2.0


def tolerates(model: CostModel, warmup: Sequence[int], link: int, delay_ms: float | None = None) -> bool:
    """Eq. 1: does link ``link`` absorb ``delay_ms`` (default: ``model.delays[link]``) without cascading?"""
    c = model.delays[link] if delay_ms is None else float(delay_ms)
    if not c >= 0:
        raise ValueError(f"delay_ms must be >= 0 ms, got {delay_ms}")
    return c <= tolerance_ms(model, warmup, link) + 1e-9


def required_slackness(model: CostModel, link: int, delay_ms: float | None = None) -> int:
    """Smallest integer Δ_i satisfying Eq. 1 for the delay on ``link`` (0 if no slackness is needed).

    Infinite delays (link down) cannot be absorbed: ``ValueError``.
    """
    i = link
    if not 0 <= i < model.stages - 1:
        raise ValueError(f"link must be in 0..{model.stages - 2}, got {link}")
    c = model.delays[i] if delay_ms is None else float(delay_ms)
    if math.isinf(c):
        raise ValueError(f"link {i} is down (infinite delay): no slackness absorbs it")
    num = model.fwd[i] + model.bwd[i] + 2.0 * c
    den = model.fwd[i + 1] + model.bwd[i + 1]
    if den <= 0:
        return 0 if num <= 0 else 1 << 30
    return max(0, math.ceil(num / den - 1e-9))


def _caps(model: CostModel, memory: Sequence[int] | None) -> list[int]:
    """cap'_i = min_{j<=i} min(N, M_j): x_i may not exceed it (Lemma 1 makes x_j >= x_i for j < i)."""
    n = model.microbatches
    caps = [n if memory is None else min(n, int(memory[s])) for s in range(model.stages)]
    for s in range(1, len(caps)):
        caps[s] = min(caps[s], caps[s - 1])
    return caps


def _fill(caps: Sequence[int], key: object) -> list[int]:
    """Raise Δ's one unit at a time, always on the feasible link with the smallest ``key(link, Δ)``.

    x_{S-1} = 1 and x_i = 1 + Σ_{j>=i} Δ_j; raising Δ_j raises x_0..x_j, allowed while every one
    stays within its cap. Returns Δ (length S−1). ``key`` returning None means "stop raising".
    """
    links = len(caps) - 1
    delta = [0] * links
    x = [1] * len(caps)
    while True:
        best = None
        best_key = None
        # Raising Δ_j is feasible iff x_k < cap_k for every k <= j: scan links up to the first full stage.
        for j in range(links):
            if x[j] >= caps[j]:
                break
            k_val = key(j, delta[j])  # type: ignore[operator]
            if k_val is None:
                continue
            if best_key is None or k_val < best_key:
                best, best_key = j, k_val
        if best is None:
            return delta
        delta[best] += 1
        for k in range(best + 1):
            x[k] += 1


def _warmup_from(delta: Sequence[int]) -> tuple[int, ...]:
    x = [1]
    for d in reversed(delta):
        x.append(x[-1] + d)
    return tuple(reversed(x))


def initial_warmup(stages: int, microbatches: int, memory: int | Sequence[int]) -> tuple[int, ...]:
    """Alg. 1: x_0 = x_max, then Δ as balanced as possible (max min_i Δ_i), x_{S-1} = 1.

    ``memory`` is M (microbatches of activations a stage can hold: the paper's ⌊M/M^F⌋), one value
    or one per stage. Deviations: x_max is also capped at N (no stage can run more forwards than
    there are microbatches); with per-stage budgets the cap of stage i is min_{j<=i} M_j (Lemma 1)
    and the balancing is a max-min water-fill; for a uniform budget the result is exactly Alg. 1
    (the remainder r goes to the first links, as in line 8). A single stage (S = 1, where line 4
    divides by zero) gets x_0 = 1: with no link there is no slackness to buy with memory.
    """
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be an integer >= 1, got {stages!r}")
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches must be an integer >= 1, got {microbatches!r}")
    mem = [int(memory)] * stages if isinstance(memory, int) else [int(m) for m in memory]
    if len(mem) != stages:
        raise ValueError(f"memory needs {stages} values (one per stage), got {len(mem)}")
    for s, m in enumerate(mem):
        if m < 1:
            raise ValueError(f"memory M_{s} = {m}: each stage must hold at least 1 microbatch in flight")
    model = CostModel.uniform(stages, microbatches, 1.0, 1.0, 1.0)
    caps = _caps(model, mem)
    delta = _fill(caps, lambda j, d: (d, j))
    return _warmup_from(delta)


def adapted_warmup(model: CostModel) -> tuple[int, ...]:
    """Alg. 2: from x_{S-1} = 1 backwards, Δ_i = the smallest slackness that satisfies Eq. 1.

    Deviations from the pseudo-code, and why:

    * Line 7 divides ``t^F_i + t^B_{i+1} + 2c_i``; Eq. 1 has ``t^F_i + t^B_i`` — we follow Eq. 1.
    * Line 7 uses ⌊·⌋, which can return a Δ that does *not* satisfy Eq. 1 (c = 25, t = 10 gives
      ⌊3.5⌋ = 3 < 3.5); we take ⌈·⌉, the smallest Δ that does.
    * Line 7 clips Δ_i by N − 2S, which collapses every Δ to <= 0 when N <= 2S (common: S = 8,
      N = 16) regardless of where the slow link is. We keep the paper's floor of 2 (ZB-H2's
      slackness) and enforce the real constraints instead: x_i <= N and, when ``model.memory`` is
      set, x_i <= M_i (the paper relaxes memory because PipeMorph offloads activations to host;
      ``memory=None`` reproduces that). The unconstrained x is clipped from the top,
      x_i = min(x_i, min_{j<=i} cap_j), which keeps the slackness of the downstream links (where
      x is small and Δ = 0 would serialise the pipeline) and gives up slackness only where x_i
      reaches N (such a stage runs GPipe-like, so Δ = 0 there costs fill/drain, not a cascade).
      Measured (S=8, t=10 ms, c_6 = 60 ms): N=8 → 430 ms vs ZB-H2 630 ms; N=16 → 610 vs 1090 ms;
      a proportional water-fill of the budget was worse in every case we tried.
    * Infinite delays (link down) cannot be absorbed: ``ValueError`` (replan around the link).
    """
    s_count = model.stages
    if s_count == 1:
        return (1,)
    caps = _caps(model, model.memory)
    x = [1] * s_count
    for i in range(s_count - 2, -1, -1):
        x[i] = x[i + 1] + max(2, required_slackness(model, i))
    return tuple(min(v, cap) for v, cap in zip(x, caps))


def uniform_warmup(stages: int, microbatches: int, slackness: int) -> tuple[int, ...]:
    """x_i = min(N, 1 + Δ·(S−1−i)): a plan with one chosen uniform slackness (Fig. 8 experiments)."""
    if slackness < 0:
        raise ValueError(f"slackness must be >= 0, got {slackness}")
    return tuple(min(microbatches, 1 + slackness * (stages - 1 - i)) for i in range(stages))
