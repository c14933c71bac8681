"""The plain named schedules as :class:`model.Plan` objects: the baselines of the paper's §7 and
PipeMorph's plain plan (no search). :mod:`builders` adds the search on top.

Every builder reduces to warm-up counts x_i plus the Alg. 3/4 generator (GPipe is written out):

* ``1f1b``     x_i = S − i, fused ``B`` (one-forward-one-backward after warm-up).
* ``1f1b-iw``  the same orders with each ``B`` split into ``I`` immediately followed by ``W``.
* ``gpipe``    all forwards, then all backwards (x_i = N).
* ``zb-h1``    ZeroBubble-H1: x_i = S − i (1F1B memory), ``W`` deferred by the I > F > W policy.
* ``zb-h2``    ZeroBubble-H2: x_i = 2(S − i) − 1 — the paper's Fig. 4 (S=4, N=12: 390 ms).
* ``pipemorph`` Alg. 1 (no delay known) or Alg. 2 (``model.delays`` non-zero) + Alg. 3/4.

Two stages per rank (the V placement, ``model.stages_per_rank = 2``; ``--stages`` counts ranks R).
ZB-V and DualPipeV are static schedules in torch: their orders never depend on delays, so they are
planned for no delay whatever ``model.delays`` says (run them under delays with the simulator).

* ``zb-v``        ZB-V (torch's ``ScheduleZBVZeroBubble``): x_s = 2R − 1 − s (1 on the last stage),
  at most 2R microbatches in flight per rank, refill and :data:`event_loop.PAIR_W` (the steady
  phase's ``F I W`` per stage); for uniform op times these are torch's orders (up to the order of
  the final ``W`` run). Like torch, fewer than 2R − 1 microbatches are planned as 2R − 1 and the
  missing microbatches' ops dropped.
* ``dualpipe-v``  DualPipeV (torch's ``ScheduleDualPipeV``): its warm-ups x_s = 2R − s and its
  2R + 1 microbatches in flight per rank, refill (forwards of one stage between the backwards of
  the other, ``W`` deferred to fill gaps); needs N >= 2R as torch does. The generator's rendering:
  torch's exact order also overlaps F and B pairs and fuses its backwards, and times within 2 % of
  this one for uniform op times (tests/pipelining/test_vshape.py).
* ``pipemorph-v`` Alg. 1 / Alg. 2 in their V form (:mod:`slackness`, Eq. 1-V) + Alg. 3/4 with refill,
  whose steady forwards keep each stage x_s ahead: with the paper's plain I > F > W the V's two legs
  on one rank drain each other's lead.

Names are spelled one way here (:data:`SCHEDULES`); :func:`schedule_key` maps every accepted
spelling ("ZBH2", "zb-h2", "ZB_H2", the TOML names "PipeMorph", "Morph1F1B"...) onto them.

x_i is capped at N everywhere; a warm-up that needs more than M_i microbatches in flight raises
``ValueError`` naming the stage, the need and M_i (paper §4.2: memory bounds the warm-up).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from titan_morph.pipelining.core.codes import Code
from titan_morph.pipelining.core.links import LinkModel
from titan_morph.pipelining.core.model import CostModel, Op, Order, Plan, in_flight_peak, warmup_counts
from titan_morph.pipelining.schedules.event_loop import PAIR_W, REFILL
from titan_morph.pipelining.schedules.generate import check_warmup, generate_codes, orders_of
from titan_morph.pipelining.schedules.slackness import adapted_warmup, initial_warmup

__all__ = [
    "SCHEDULES",
    "V_SCHEDULES",
    "build_plain",
    "schedule_key",
    "warmup_for",
    "split_fused",
    "split_codes",
    "plain_codes",
    "check_placement",
    "zbv_memory",
]

SCHEDULES = ("1f1b", "1f1b-iw", "gpipe", "zb-h1", "zb-h2", "pipemorph")
"""The schedules with one stage per rank."""
V_SCHEDULES = ("zb-v", "dualpipe-v", "pipemorph-v")
"""The schedules that place two stages per rank in a V (``CostModel.stages_per_rank = 2``)."""

_SPELLINGS = {
    "1f1b": "1f1b",
    "1f1biw": "1f1b-iw",
    "morph1f1b": "1f1b-iw",  # the TOML name of 1F1B with split backward
    "gpipe": "gpipe",
    "zbh1": "zb-h1",
    "zbh2": "zb-h2",
    "pipemorph": "pipemorph",
    "zbv": "zb-v",
    "zbvzerobubble": "zb-v",  # torch's / TorchTitan's name
    "dualpipev": "dualpipe-v",
    "pipemorphv": "pipemorph-v",
}


def schedule_key(name: str) -> str:
    """The builder name (one of :data:`SCHEDULES` or :data:`V_SCHEDULES`) for any accepted spelling.

    Case, ``-``, ``_`` and spaces are ignored: "ZBH2", "zb-h2" and "ZB_H2" are all ``zb-h2``;
    "PipeMorph" is ``pipemorph``; "Morph1F1B" and "1F1B-IW" are ``1f1b-iw``; "ZBVZeroBubble" and
    "ZBV" are ``zb-v``; "DualPipeV" is ``dualpipe-v``; "PipeMorphV" is ``pipemorph-v``; "1F1B" and
    "GPipe" as written. Anything else raises ``ValueError`` listing the allowed names.
    """
    if not isinstance(name, str):
        raise ValueError(f"schedule name must be a string, got {type(name).__name__}")
    key = _SPELLINGS.get("".join(ch for ch in name.lower() if ch not in "-_ "))
    if key is None:
        raise ValueError(
            f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES + V_SCHEDULES)}"
            " (case, '-' and '_' are ignored; Morph1F1B = 1f1b-iw)"
        )
    return key


def check_placement(schedule: str, model: CostModel) -> str:
    """The builder name of ``schedule`` after checking that ``model`` places stages as it needs:
    the V schedules two stages per rank, the others one. ``ValueError`` names the setting."""
    name = schedule_key(schedule)
    v = name in V_SCHEDULES
    if v and model.stages_per_rank != 2:
        raise ValueError(
            f"schedule {name!r} places two stages per rank in a V: it needs stages_per_rank = 2"
            f" (2R stages on R ranks), got {model.stages_per_rank}"
        )
    if not v and model.stages_per_rank != 1:
        raise ValueError(
            f"schedule {name!r} runs one stage per rank; with stages_per_rank = {model.stages_per_rank}"
            f" choose one of {', '.join(V_SCHEDULES)}"
        )
    return name


def _check_memory(schedule: str, model: CostModel, need: Sequence[int]) -> None:
    """``need[r]``: microbatches rank r holds in flight (its warm-up, or the schedule's peak)."""
    if model.memory is None:
        return
    word = "stage" if model.stages_per_rank == 1 else "rank"
    for r, (x, m) in enumerate(zip(need, model.memory)):
        if x > m:
            raise ValueError(
                f"schedule {schedule!r}: {word} {r} needs {x} microbatches in flight for its warm-up,"
                f" more than its memory budget M_{r} = {m}"
            )


def _zbv_codes(model: CostModel) -> list[list[Code]]:
    """ZB-V by the generator (module docstring), planned for no delay as torch's static order is;
    below 2R − 1 microbatches, planned for 2R − 1 and the missing microbatches' ops dropped, as
    torch does."""
    r_count, n = model.ranks, model.microbatches
    full = max(n, 2 * r_count - 1)
    big = replace(model, microbatches=full, memory=None, delays=(0.0,) * model.num_links)
    x = tuple(max(1, 2 * r_count - 1 - s) for s in range(model.stages))
    codes = generate_codes(big, x, limit=(2 * r_count,) * r_count, policy=REFILL | PAIR_W)
    return [[op for op in order if op[1] < n] for order in codes]


def zbv_memory(model: CostModel) -> tuple[int, ...]:
    """Microbatches ZB-V holds in flight per rank on ``model`` (its peak): pipemorph-v's default
    budget, so that the two are compared on the same memory."""
    return tuple(in_flight_peak(o) for o in orders_of(model, _zbv_codes(model)))


def warmup_for(schedule: str, model: CostModel) -> tuple[int, ...]:
    """x_i a named schedule (any spelling :func:`schedule_key` accepts) uses on ``model`` (capped at N;
    pipemorph-v without a memory budget plans under ZB-V's, :func:`zbv_memory`)."""
    schedule = check_placement(schedule, model)
    s_count, n = model.stages, model.microbatches
    if schedule == "zb-v":
        return tuple(min(n, max(1, s_count - 1 - s)) for s in range(s_count))
    if schedule == "dualpipe-v":
        return tuple(min(n, s_count - s) for s in range(s_count))
    if schedule == "pipemorph-v":
        if any(c > 0 for c in model.delays) or model.has_transmit:
            return adapted_warmup(model)
        memory = model.memory if model.memory is not None else zbv_memory(model)
        return initial_warmup(s_count, n, memory, stages_per_rank=2)
    if schedule in ("1f1b", "1f1b-iw", "zb-h1"):
        return tuple(min(n, s_count - i) for i in range(s_count))
    if schedule == "zb-h2":
        return tuple(min(n, 2 * (s_count - i) - 1) for i in range(s_count))
    if schedule == "pipemorph":
        if any(c > 0 for c in model.delays) or model.has_transmit:
            return adapted_warmup(model)
        budget = model.memory if model.memory is not None else n
        return initial_warmup(s_count, n, budget)
    return (n,) * s_count  # gpipe


def split_fused(orders: Sequence[Sequence[Op]]) -> tuple[Order, ...]:
    """Replace every fused ``B m`` with ``I m, W m`` (1F1B with split backward, same timing)."""
    out = []
    for order in orders:
        ops: list[Op] = []
        for op in order:
            if op.kind == "B":
                ops += [Op("I", op.mb, op.stage), Op("W", op.mb, op.stage)]
            else:
                ops.append(op)
        out.append(tuple(ops))
    return tuple(out)


def split_codes(codes: Sequence[Sequence[Code]]) -> list[list[Code]]:
    """:func:`split_fused` on generator codes: every fused ``B`` (kind 1) becomes ``I``, ``W``."""
    out = []
    for order in codes:
        row: list[Code] = []
        for c, m in order:
            row += [(c, m), (c + 1, m)] if c % 4 == 1 else [(c, m)]
        out.append(row)
    return out


def build_plain(schedule: str, model: CostModel, **options: Any) -> Plan:
    """The named schedule (any spelling :func:`schedule_key` accepts) for ``model``, without search;
    ``options`` are :func:`plain_codes`'s."""
    name = check_placement(schedule, model)
    x, codes, fused = plain_codes(name, model, **options)
    orders = orders_of(model, codes, fused)
    return Plan(name, warmup_counts(model, orders) if x is None else x, orders, model)


def plain_codes(
    schedule: str,
    model: CostModel,
    *,
    delta: float | None = None,
    links: LinkModel | None = None,
    warmup: Sequence[int] | None = None,
    refill: bool = False,
) -> tuple[tuple[int, ...] | None, list[list[Code]], bool]:
    """:func:`build_plain`'s schedule before any :class:`model.Op` is made (the search seeds itself
    with these): x_i (None where the plan reads them off its orders: ZB-V, DualPipeV), the orders as
    :func:`event_loop.run_generator` codes, and whether their kind 1 is a fused ``B``.

    ``delta``: δ-quantised generation; ``links``: a link model the generator plans against instead of
    ``model.delays``; ``warmup``: override x_i (pipemorph only); ``refill``: keep stages x_i forwards
    ahead in the steady phase (:mod:`generate`; default False = the paper's I > F > W).
    """
    name = check_placement(schedule, model)
    if warmup is not None and name not in ("pipemorph", "pipemorph-v"):
        raise ValueError(f"warmup= overrides only 'pipemorph' and 'pipemorph-v'; {schedule!r} defines its own x_i")
    if name in ("zb-v", "dualpipe-v") and (delta is not None or links is not None or refill):
        raise ValueError(
            f"schedule {name!r} is static (torch's order, planned for no delay): delta, links and refill do not apply"
        )
    if name == "zb-v":
        codes = _zbv_codes(model)
        _check_memory("zb-v", model, [in_flight_peak(o) for o in orders_of(model, codes)])
        return None, codes, False
    plan_model = model
    if links is not None and not any(c > 0 for c in model.delays):
        plan_model = model.with_delays(links.snapshot())  # plan (Alg. 2) against what the links show
    x = tuple(warmup) if warmup is not None else warmup_for(name, plan_model)
    if name == "dualpipe-v":
        if model.microbatches < model.stages:
            raise ValueError(
                f"schedule 'dualpipe-v' needs at least as many microbatches as stages (as torch's DualPipeV):"
                f" N = {model.microbatches} < {model.stages} stages"
            )
        limit = (model.stages + 1,) * model.ranks  # DualPipeV's 2R + 1 microbatches in flight
        _check_memory(name, model, limit)
        static = replace(model, memory=None, delays=(0.0,) * model.num_links)
        return None, generate_codes(static, x, limit=limit, policy=REFILL), False
    _check_memory(name, model, [sum(x[s] for s in model.rank_stages(r)) for r in range(model.ranks)])
    if name == "gpipe":
        n = model.microbatches
        return x, [[(0, m) for m in range(n)] + [(1, m) for m in range(n)] for _ in range(model.ranks)], True
    x = check_warmup(model, x)
    if name in ("1f1b", "1f1b-iw"):
        codes = generate_codes(model, x, split_backward=False, delta=delta, links=links, refill=refill)
        return (x, split_codes(codes), False) if name == "1f1b-iw" else (x, codes, True)
    refill = refill or name == "pipemorph-v"
    return x, generate_codes(model, x, delta=delta, links=links, refill=refill), False
