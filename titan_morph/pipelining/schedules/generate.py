"""Full-pipeline schedule generation (paper §4.3, Appendix Alg. 3 and Alg. 4): the checked entry
points of the ONE generator.

:func:`generate` and :func:`generate_codes` validate the knobs (x_s per stage, Lemma 1 and the
memory budget; the in-flight limit per rank; the policy bits) and run the event loop of
:mod:`event_loop`, where the policy, the V placement and the deviations from the paper's
pseudo-code are documented; :func:`orders_of` turns its codes into :class:`model.Op` orders.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from titan_morph.pipelining.core.codes import CHUNK
from titan_morph.pipelining.core.links import LinkDownError
from titan_morph.pipelining.core.model import CostModel, Op, Order
from titan_morph.pipelining.schedules.event_loop import ALL_POLICY_BITS, REFILL, run_generator

__all__ = ["generate", "generate_codes", "orders_of", "check_warmup", "check_limit", "check_policy"]


def _rank_sums(model: CostModel, per_stage: Sequence[int]) -> list[int]:
    """Σ over each rank's stages of a per-stage value."""
    return [sum(per_stage[s] for s in model.rank_stages(r)) for r in range(model.ranks)]


def check_warmup(model: CostModel, warmup: Sequence[int]) -> tuple[int, ...]:
    """Validate x_s: one per stage, 1 <= x_s <= N, Lemma 1 (non-increasing over stages), and the
    warm-up of each rank (Σ of its stages' x_s) within its memory budget M_r.

    Raises ``ValueError`` naming the stage (or rank) and the allowed range.
    """
    s_count, n = model.stages, model.microbatches
    try:
        x = tuple(int(v) for v in warmup)
    except (TypeError, ValueError):
        raise ValueError(f"warmup must be a sequence of {s_count} integers, got {warmup!r}") from None
    if len(x) != s_count:
        raise ValueError(f"warmup needs {s_count} values (one x_i per stage), got {len(x)}: {x}")
    for s, v in enumerate(x):
        if not 1 <= v <= n:
            raise ValueError(f"warmup x_{s} = {v} out of range: each stage needs 1 <= x_i <= N = {n} forwards")
    for s in range(s_count - 1):
        if x[s] < x[s + 1]:
            raise ValueError(
                f"warmup {list(x)} violates Lemma 1 (x_i must be non-increasing over stages):"
                f" x_{s} = {x[s]} < x_{s + 1} = {x[s + 1]}"
            )
    if model.memory is not None:
        for r, v in enumerate(_rank_sums(model, x)):
            if v > model.memory[r]:
                if model.stages_per_rank == 1:
                    raise ValueError(
                        f"stage {r}: warm-up of x_{r} = {v} forwards needs {v} microbatches in flight,"
                        f" more than the memory budget M_{r} = {model.memory[r]}"
                    )
                raise ValueError(
                    f"rank {r}: warm-ups of its stages {list(model.rank_stages(r))} need {v} microbatches in"
                    f" flight, more than the memory budget M_{r} = {model.memory[r]}"
                )
    return x


def check_limit(model: CostModel, warmup: Sequence[int], limit: Sequence[int] | None) -> tuple[int, ...]:
    """Validate the in-flight cap per rank: Σ x_s of its stages <= limit_r <= M_r (all of its
    stages' microbatches when unbounded). Default: the rank's warm-up."""
    need = _rank_sums(model, warmup)
    if limit is None:
        return tuple(need)
    lim = tuple(int(v) for v in limit)
    if len(lim) != model.ranks:
        raise ValueError(f"limit needs {model.ranks} values (one per rank), got {len(lim)}")
    for r, (v, x) in enumerate(zip(lim, need)):
        if not x <= v <= model.budget(r):
            raise ValueError(
                f"limit_{r} = {v} out of range: the in-flight cap must satisfy x_{r} = {x} <= limit_{r}"
                f" <= {model.budget(r)} (memory budget / N)"
            )
    return lim


def generate(model: CostModel, warmup: Sequence[int], **options: Any) -> tuple[Order, ...]:
    """Per-rank operation orders by Alg. 3/4: :func:`generate_codes`'s (same arguments) as
    :class:`model.Op` orders (fused ``B`` ops with ``split_backward=False``)."""
    codes = generate_codes(model, warmup, **options)
    return orders_of(model, codes, fused=not options.get("split_backward", True))


def generate_codes(
    model: CostModel,
    warmup: Sequence[int],
    *,
    limit: Sequence[int] | None = None,
    policy: int | Sequence[int] = 0,
    refill: bool = False,
    **options: Any,
) -> list[list[tuple[int, int]]]:
    """Per-rank orders by Alg. 3/4 (event-driven; δ-quantised when ``delta`` is set), as
    :func:`run_generator`'s codes, after checking the arguments.

    ``warmup`` = x_s per stage, ``limit`` = in-flight cap per rank (default its warm-up).
    ``policy``: bits :data:`WAIT_W`, :data:`WAIT_F`, :data:`WAIT_W_FOR_F`, :data:`REFILL`,
    :data:`PAIR_W` (:mod:`event_loop`), one value for every rank or one per rank; ``refill=True``
    adds :data:`REFILL` everywhere. ``options`` are :func:`run_generator`'s:
    ``split_backward=False`` emits fused ``B`` ops (1F1B-style) instead of ``I``/``W``; ``delta``
    quantises decision times; delays come from ``model.delays`` unless ``links`` is given (looked
    up at ``t0 + t`` and ``step``).
    """
    x = check_warmup(model, warmup)
    lim = check_limit(model, x, limit)
    pol = check_policy(model, policy)
    if refill:
        pol = tuple(p | REFILL for p in pol)
    delta, links = options.get("delta"), options.get("links")
    if delta is not None and not (delta > 0 and math.isfinite(delta)):
        raise ValueError(f"delta must be a finite time step > 0 ms (or None for exact), got {delta}")
    if links is not None and links.num_links != model.num_links:
        raise ValueError(f"links model has {links.num_links} links, the cost model {model.num_links}")
    if links is None:
        for link, c in enumerate(model.delays):
            if math.isinf(c):
                raise LinkDownError(link, "fwd", " (cannot plan across a link that is down)")
    span, codes = run_generator(model, x, lim, pol, **options)
    if codes is None:  # cannot happen for valid x and limits; kept as a clear internal check
        raise RuntimeError(f"schedule generation stalled with warmup={list(x)} limit={list(lim)} policy={list(pol)}")
    return codes


def orders_of(model: CostModel, codes: Sequence[Sequence[tuple[int, int]]], fused: bool = False) -> tuple[Order, ...]:
    """:func:`run_generator`'s codes as :class:`model.Op` orders (kind 1 as a fused ``B`` when ``fused``)."""
    kinds = ("F", "B" if fused else "I", "W")
    n = model.microbatches
    named = model.stages_per_rank > 1
    out = []
    for r, order in enumerate(codes):
        cache = [[Op(kind, m, s if named else None) for m in range(n)] for s in model.rank_stages(r) for kind in kinds]
        out.append(tuple(cache[(c // CHUNK) * 3 + c % CHUNK][m] for c, m in order))
    return tuple(out)


def check_policy(model: CostModel, policy: int | Sequence[int]) -> tuple[int, ...]:
    """Validate the policy bits: one int for every rank or one per rank, each in 0..31."""
    ranks = model.ranks
    pol = (int(policy),) * ranks if isinstance(policy, int) else tuple(int(p) for p in policy)
    if len(pol) != ranks:
        raise ValueError(f"policy needs 1 or {ranks} values (one per rank), got {len(pol)}")
    for s, p in enumerate(pol):
        if not 0 <= p <= ALL_POLICY_BITS:
            raise ValueError(
                f"policy_{s} = {p} out of range: a combination of the bits 1, 2, 4, 8, 16 (0..{ALL_POLICY_BITS})"
            )
    return pol
