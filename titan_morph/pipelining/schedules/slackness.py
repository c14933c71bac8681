"""Slackness analysis and warm-up planning (paper §4.1–§4.2: Eq. 1, Alg. 1, Alg. 2).

The slackness of a hop (stage s to s+1) is Δ_s = x_s − x_{s+1}, the difference of the warm-up
forward counts of the two stages it joins (non-negative by Lemma 1, whose proof holds for any
placement of stages on ranks). Theorem 1: with uniform op time t, a delay c_i is absorbed
(accumulated delay Θ(c_i)) iff c_i <= (Δ_i − 1)·t, and cascades (Θ(N·c_i/(Δ_i − 1))) beyond.
Eq. 1 is the heterogeneous form::

    t^F_i + t^B_i + 2·c_i <= Δ_i · (t^F_{i+1} + t^B_{i+1})                      (1)

Its right side is Δ_i steady-phase periods of the downstream stage, one F and one B each. With two
stages per rank (the V, :class:`model.CostModel`) the downstream *rank* runs one F and one B of
each of its stages per period, so the V form of Eq. 1 for the hop s -> s+1 reads::

    t^F_s + t^B_s + 2·c <= Δ_s · P_{r(s+1)},   P_r = Σ_{stages q of rank r} (t^F_q + t^B_q)   (1-V)

with c the delay of the link the hop crosses; a link's tolerance is the smaller of its two hops'
(each link carries a hop of the way down and one of the way back up). The hop between the last
rank's two stages crosses no link and needs no slackness. With one stage per rank (1-V) is Eq. 1.

Alg. 1 (initial plan, no delay known) maximises min Δ over the hops that cross links under the
memory budget; Alg. 2 (dynamic adaptation) picks, from measured delays, the smallest Δ that
satisfies Eq. 1. In the V a rank's warm-up holds x_r + x_{2R−1−r} microbatches, so the budget
binds the two stages of a rank together. The deviations from the paper's pseudo-code are listed in
each function's docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from titan_morph.pipelining.core.model import CostModel

__all__ = [
    "tolerance_ms",
    "tolerates",
    "required_slackness",
    "initial_warmup",
    "adapted_warmup",
    "uniform_warmup",
    "link_hops_after",
    "fit_warmup",
]


def _check_link(model: CostModel, link: int) -> None:
    if not 0 <= link < model.num_links:
        if model.stages_per_rank == 1:
            raise ValueError(f"link must be in 0..{model.num_links - 1} (link i joins stages i and i+1), got {link}")
        raise ValueError(f"link must be in 0..{model.num_links - 1} (link i joins ranks i and i+1), got {link}")


def _period(model: CostModel, stage: int) -> float:
    """P of Eq. 1-V: the F + B work per microbatch of the rank that runs ``stage``."""
    return sum(model.fwd[q] + model.bwd[q] for q in model.rank_stages(model.rank_of(stage)))


def _hop_tolerance(model: CostModel, warmup: Sequence[int], hop: int) -> float:
    delta = int(warmup[hop]) - int(warmup[hop + 1])
    return (delta * _period(model, hop + 1) - model.fwd[hop] - model.bwd[hop]) / 2.0


def tolerance_ms(model: CostModel, warmup: Sequence[int], link: int) -> float:
    """Largest delay c on ``link`` that Eq. 1 (1-V) absorbs: (Δ_s·P − t^F_s − t^B_s) / 2, the
    smallest over the hops the link carries.

    Negative means even a zero delay cascades (e.g. Δ = 0). With one stage per rank and
    t^F = t^B = t this is (Δ_i − 1)·t, Theorem 1's threshold.
    """
    _check_link(model, link)
    if len(warmup) != model.stages:
        raise ValueError(f"warmup needs {model.stages} values (one x_i per stage), got {len(warmup)}")
    return min(_hop_tolerance(model, warmup, hop) for hop in model.link_hops(link))


def tolerates(model: CostModel, warmup: Sequence[int], link: int, delay_ms: float | None = None) -> bool:
    """Eq. 1: does link ``link`` absorb ``delay_ms`` (default: the link's latency + transmit time,
    a message's least cost) without cascading?"""
    c = model.delays[link] + model.transmit[link] if delay_ms is None else float(delay_ms)
    if not c >= 0:
        raise ValueError(f"delay_ms must be >= 0 ms, got {delay_ms}")
    return c <= tolerance_ms(model, warmup, link) + 1e-9


def _required(model: CostModel, hop: int, c: float) -> int:
    """Smallest integer Δ of hop ``hop`` that satisfies Eq. 1 (1-V) for delay ``c``."""
    num = model.fwd[hop] + model.bwd[hop] + 2.0 * c
    den = _period(model, hop + 1)
    if den <= 0:
        return 0 if num <= 0 else 1 << 30
    return max(0, math.ceil(num / den - 1e-9))


def required_slackness(model: CostModel, link: int, delay_ms: float | None = None) -> int:
    """Smallest integer Δ satisfying Eq. 1 (1-V) for the delay on ``link`` (default: its latency +
    transmit time), over the hops it carries (0 if no slackness is needed).

    Infinite delays (link down) cannot be absorbed: ``ValueError``.
    """
    _check_link(model, link)
    c = model.delays[link] + model.transmit[link] if delay_ms is None else float(delay_ms)
    if math.isinf(c):
        raise ValueError(f"link {link} is down (infinite delay): no slackness absorbs it")
    return max(_required(model, hop, c) for hop in model.link_hops(link))


def _caps(model: CostModel, memory: Sequence[int] | None) -> list[int]:
    """cap'_i = min_{j<=i} min(N, M_j): x_i may not exceed it (Lemma 1 makes x_j >= x_i for j < i)."""
    n = model.microbatches
    caps = [n if memory is None else min(n, int(memory[s])) for s in range(model.stages)]
    for s in range(1, len(caps)):
        caps[s] = min(caps[s], caps[s - 1])
    return caps


def _warmup_from(delta: Sequence[int]) -> tuple[int, ...]:
    x = [1]
    for d in reversed(delta):
        x.append(x[-1] + d)
    return tuple(reversed(x))


def _fill(
    model: CostModel, memory: Sequence[int] | None, key: Callable[[int, int], tuple[int, int] | None]
) -> list[int]:
    """Raise Δ's one unit at a time, always on the feasible hop with the smallest ``key(hop, Δ)``.

    x_{S-1} = 1 and x_s = 1 + Σ_{j>=s} Δ_j; raising Δ_j raises x_0..x_j, allowed while x stays
    within N and every rank's warm-up within its budget. Returns Δ (length S−1). ``key`` returning
    None means "stop raising" that hop. Feasibility is monotone in j (raising Δ_j raises a prefix
    of the stages), so each round finds the first infeasible hop in one pass over the stages.
    """
    hops = model.stages - 1
    delta = [0] * hops
    x = [1] * model.stages
    rank_of = [model.rank_of(s) for s in range(model.stages)]
    held = [len(model.rank_stages(r)) for r in range(model.ranks)]  # Σ x_s of each rank's stages
    if memory is not None and any(h > m for h, m in zip(held, memory)):
        return delta
    while True:
        if x[0] + 1 > model.microbatches:  # x_0 is the largest x_s and rises with every hop
            return delta
        reach = hops  # the first hop that cannot be raised (its prefix overflows a rank's budget)
        if memory is not None:
            extra = [0] * model.ranks
            for s in range(hops):
                r = rank_of[s]
                extra[r] += 1
                if held[r] + extra[r] > memory[r]:
                    reach = s
                    break
        best = None
        best_key = None
        for j in range(reach):
            k_val = key(j, delta[j])
            if k_val is not None and (best_key is None or k_val < best_key):
                best, best_key = j, k_val
        if best is None:
            return delta
        delta[best] += 1
        for k in range(best + 1):
            x[k] += 1
            held[rank_of[k]] += 1


def initial_warmup(
    stages: int, microbatches: int, memory: int | Sequence[int], *, stages_per_rank: int = 1
) -> tuple[int, ...]:
    """Alg. 1: x_0 = x_max, then Δ as balanced as possible (max min_i Δ_i), x_{S-1} = 1.

    ``memory`` is M (microbatches of activations a rank can hold: the paper's ⌊M/M^F⌋), one value
    or one per rank. Deviations: x_max is also capped at N (no stage can run more forwards than
    there are microbatches); with per-rank budgets the balancing is a max-min water-fill under
    every rank's budget; for a uniform budget and one stage per rank the result is exactly Alg. 1
    (the remainder r goes to the first links, as in line 8). A single stage (S = 1, where line 4
    divides by zero) gets x_0 = 1: with no link there is no slackness to buy with memory. In the V
    (``stages_per_rank = 2``) the hop between the last rank's two stages takes no slackness (it
    crosses no link), and a rank's budget covers both of its stages' warm-ups.
    """
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be an integer >= 1, got {stages!r}")
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches must be an integer >= 1, got {microbatches!r}")
    model = CostModel.uniform(stages, microbatches, 1.0, 1.0, 1.0, stages_per_rank=stages_per_rank)
    ranks = model.ranks
    mem = [int(memory)] * ranks if isinstance(memory, int) else [int(m) for m in memory]
    if len(mem) != ranks:
        raise ValueError(f"memory needs {ranks} values (one per rank), got {len(mem)}")
    least = stages_per_rank
    for r, m in enumerate(mem):
        if m < least:
            raise ValueError(f"memory M_{r} = {m}: each rank must hold at least {least} microbatch(es) in flight")

    def key(j: int, d: int) -> tuple[int, int] | None:
        return None if model.hop_link(j) is None else (d, j)

    return _warmup_from(_fill(model, mem, key))


def adapted_warmup(model: CostModel) -> tuple[int, ...]:
    """Alg. 2: from x_{S-1} = 1 backwards, Δ_s = the smallest slackness that satisfies Eq. 1.

    Deviations from the pseudo-code, and why:

    * Line 7 divides ``t^F_i + t^B_{i+1} + 2c_i``; Eq. 1 has ``t^F_i + t^B_i`` — we follow Eq. 1
      (Eq. 1-V in the V).
    * Line 7 uses ⌊·⌋, which can return a Δ that does *not* satisfy Eq. 1 (c = 25, t = 10 gives
      ⌊3.5⌋ = 3 < 3.5); we take ⌈·⌉, the smallest Δ that does.
    * Line 7 clips Δ_i by N − 2S, which collapses every Δ to <= 0 when N <= 2S (common: S = 8,
      N = 16) regardless of where the slow link is. We keep the paper's floor of 2 (ZB-H2's
      slackness; 1 in the V, ZB-V's, and 0 on the V's local hop) and enforce the real constraints
      instead: x_i <= N and, when ``model.memory`` is set, the warm-up of every rank within M_r
      (the paper relaxes memory because PipeMorph offloads activations to host; ``memory=None``
      reproduces that). The unconstrained x is clipped from the top, x_i = min(x_i, min_{j<=i}
      cap_j), which keeps the slackness of the downstream links (where x is small and Δ = 0 would
      serialise the pipeline) and gives up slackness only where x_i reaches its cap (such a stage
      runs GPipe-like, so Δ = 0 there costs fill/drain, not a cascade). Measured (S=8, t=10 ms,
      c_6 = 60 ms): N=8 → 430 ms vs ZB-H2 630 ms; N=16 → 610 vs 1090 ms; a proportional
      water-fill of the budget was worse in every case we tried. In the V, a rank over its budget
      lowers its first-leg stage one unit at a time (clipping the stages after it to Lemma 1),
      from the last rank back to the first, until its two warm-ups fit.
    * Infinite delays (link down) cannot be absorbed: ``ValueError`` (replan around the link).
    * Bandwidth (``model.transmit``): a message takes at least its transmit time tau_i plus the
      latency, so Eq. 1 uses c_i + tau_i. The queueing of warm-up bursts on the wire is left to the
      generator, which times messages under the bandwidth model (:mod:`generate`), and to the
      search. Adding ⌈tau_i / P⌉ to Δ where tau_i reaches the downstream period P (so that the
      bottleneck link, once busy, always has a message queued) measured no better without search
      on 60 random bandwidth instances (mean 0.07 % worse), so Eq. 1 with c_i + tau_i it is.
      tau = 0 is Alg. 2 as before.
    """
    s_count = model.stages
    if s_count == 1:
        return (1,)
    v = model.stages_per_rank > 1
    floor = 1 if v else 2
    x = [1] * s_count
    for s in range(s_count - 2, -1, -1):
        link = model.hop_link(s)
        if link is None:
            x[s] = x[s + 1]
            continue
        c = model.delays[link]
        if math.isinf(c):
            raise ValueError(f"link {link} is down (infinite delay): no slackness absorbs it")
        tau = model.transmit[link]
        x[s] = x[s + 1] + max(floor, _required(model, s, c if tau == 0 else c + tau))
    if not v:
        caps = _caps(model, model.memory)
        return tuple(min(val, cap) for val, cap in zip(x, caps))
    return fit_warmup(model, x, model.memory)


def fit_warmup(model: CostModel, warmup: Sequence[int], budgets: Sequence[int] | None) -> tuple[int, ...]:
    """Two stages per rank: ``warmup`` clipped to [1, N] and to Lemma 1 (later stages lowered),
    then every rank over its budget (Σ of its stages' x_s > ``budgets[r]``) lowers its first-leg
    stage one unit at a time, clipping the stages after it, from the last rank back to the first."""
    x = [max(1, min(int(val), model.microbatches)) for val in warmup]
    for s in range(1, len(x)):
        x[s] = min(x[s], x[s - 1])
    if budgets is not None:
        for r in range(model.ranks - 1, -1, -1):
            first = model.rank_stages(r)[0]
            while sum(x[q] for q in model.rank_stages(r)) > budgets[r] and x[first] > 1:
                x[first] -= 1  # give up the least slackness: lower the first leg, clip what follows it
                x[first:] = [min(val, x[first]) for val in x[first:]]
    return tuple(x)


def link_hops_after(model: CostModel, stage: int) -> int:
    """How many hops from ``stage`` on cross a link (the V's local hop does not)."""
    return sum(1 for s in range(stage, model.stages - 1) if model.hop_link(s) is not None)


def uniform_warmup(stages: int, microbatches: int, slackness: int, *, stages_per_rank: int = 1) -> tuple[int, ...]:
    """x_s = min(N, 1 + Δ·(hops from s on that cross a link)): one chosen uniform slackness (Fig. 8
    experiments); with one stage per rank x_i = min(N, 1 + Δ·(S−1−i))."""
    if slackness < 0:
        raise ValueError(f"slackness must be >= 0, got {slackness}")
    model = CostModel.uniform(stages, microbatches, 1.0, 1.0, 1.0, stages_per_rank=stages_per_rank)
    return tuple(min(microbatches, 1 + slackness * link_hops_after(model, s)) for s in range(stages))
