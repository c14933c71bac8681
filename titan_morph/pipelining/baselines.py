"""The plain named schedules as :class:`model.Plan` objects: the baselines of the paper's §7 and
PipeMorph's plain plan (no search). :mod:`builders` adds the search on top.

Every builder reduces to warm-up counts x_i plus the Alg. 3/4 generator (GPipe is written out):

* ``1f1b``     x_i = S − i, fused ``B`` (one-forward-one-backward after warm-up).
* ``1f1b-iw``  the same orders with each ``B`` split into ``I`` immediately followed by ``W``.
* ``gpipe``    all forwards, then all backwards (x_i = N).
* ``zb-h1``    ZeroBubble-H1: x_i = S − i (1F1B memory), ``W`` deferred by the I > F > W policy.
* ``zb-h2``    ZeroBubble-H2: x_i = 2(S − i) − 1 — the paper's Fig. 4 (S=4, N=12: 390 ms).
* ``pipemorph`` Alg. 1 (no delay known) or Alg. 2 (``model.delays`` non-zero) + Alg. 3/4.

Names are spelled one way here (:data:`SCHEDULES`); :func:`schedule_key` maps every accepted
spelling ("ZBH2", "zb-h2", "ZB_H2", the TOML names "PipeMorph", "Morph1F1B"...) onto them.

x_i is capped at N everywhere; a warm-up that needs more than M_i microbatches in flight raises
``ValueError`` naming the stage, the need and M_i (paper §4.2: memory bounds the warm-up).
"""

from __future__ import annotations

from collections.abc import Sequence

from titan_morph.pipelining.generate import check_warmup, generate
from titan_morph.pipelining.links import LinkModel
from titan_morph.pipelining.model import CostModel, Op, Order, Plan
from titan_morph.pipelining.slackness import adapted_warmup, initial_warmup

__all__ = ["SCHEDULES", "build_plain", "schedule_key", "warmup_for", "split_fused"]

SCHEDULES = ("1f1b", "1f1b-iw", "gpipe", "zb-h1", "zb-h2", "pipemorph")

_SPELLINGS = {
    "1f1b": "1f1b",
    "1f1biw": "1f1b-iw",
    "morph1f1b": "1f1b-iw",  # the TOML name of 1F1B with split backward
    "gpipe": "gpipe",
    "zbh1": "zb-h1",
    "zbh2": "zb-h2",
    "pipemorph": "pipemorph",
}


def schedule_key(name: str) -> str:
    """The builder name (one of :data:`SCHEDULES`) for any accepted spelling of a schedule.

    Case, ``-``, ``_`` and spaces are ignored: "ZBH2", "zb-h2" and "ZB_H2" are all ``zb-h2``;
    "PipeMorph" is ``pipemorph``; "Morph1F1B" and "1F1B-IW" are ``1f1b-iw``; "1F1B" and "GPipe" as
    written. Anything else raises ``ValueError`` listing the allowed names.
    """
    if not isinstance(name, str):
        raise ValueError(f"schedule name must be a string, got {type(name).__name__}")
    key = _SPELLINGS.get("".join(ch for ch in name.lower() if ch not in "-_ "))
    if key is None:
        raise ValueError(
            f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES)}"
            " (case, '-' and '_' are ignored; Morph1F1B = 1f1b-iw)"
        )
    return key


def _check_memory(schedule: str, model: CostModel, warmup: Sequence[int]) -> None:
    if model.memory is None:
        return
    for s, (x, m) in enumerate(zip(warmup, model.memory)):
        if x > m:
            raise ValueError(
                f"schedule {schedule!r}: stage {s} needs {x} microbatches in flight for its warm-up,"
                f" more than its memory budget M_{s} = {m}"
            )


def warmup_for(schedule: str, model: CostModel) -> tuple[int, ...]:
    """x_i a named schedule (any spelling :func:`schedule_key` accepts) uses on ``model`` (capped at N)."""
    schedule = schedule_key(schedule)
    s_count, n = model.stages, model.microbatches
    if schedule in ("1f1b", "1f1b-iw", "zb-h1"):
        return tuple(min(n, s_count - i) for i in range(s_count))
    if schedule == "zb-h2":
        return tuple(min(n, 2 * (s_count - i) - 1) for i in range(s_count))
    if schedule == "pipemorph":
        if any(c > 0 for c in model.delays):
            return adapted_warmup(model)
        memory = model.memory if model.memory is not None else n
        return initial_warmup(s_count, n, memory)
    return (n,) * s_count  # gpipe


def split_fused(orders: Sequence[Sequence[Op]]) -> tuple[Order, ...]:
    """Replace every fused ``B m`` with ``I m, W m`` (1F1B with split backward, same timing)."""
    out = []
    for order in orders:
        ops: list[Op] = []
        for op in order:
            if op.kind == "B":
                ops += [Op("I", op.mb), Op("W", op.mb)]
            else:
                ops.append(op)
        out.append(tuple(ops))
    return tuple(out)


def _gpipe(model: CostModel) -> tuple[Order, ...]:
    n = model.microbatches
    order = tuple(Op("F", m) for m in range(n)) + tuple(Op("B", m) for m in range(n))
    return (order,) * model.stages


def build_plain(
    schedule: str,
    model: CostModel,
    *,
    delta: float | None = None,
    links: LinkModel | None = None,
    warmup: Sequence[int] | None = None,
    refill: bool = False,
) -> Plan:
    """The named schedule (any spelling :func:`schedule_key` accepts) for ``model``, without search.

    ``delta``: δ-quantised generation; ``links``: a link model the generator plans against instead of
    ``model.delays``; ``warmup``: override x_i (pipemorph only); ``refill``: keep stages x_i forwards
    ahead in the steady phase (:mod:`generate`; default False = the paper's I > F > W).
    """
    name = schedule_key(schedule)
    if warmup is not None and name != "pipemorph":
        raise ValueError(f"warmup= overrides only 'pipemorph'; {schedule!r} defines its own x_i")
    plan_model = model
    if links is not None and not any(c > 0 for c in model.delays):
        plan_model = model.with_delays(links.snapshot())  # plan (Alg. 2) against what the links show
    x = tuple(warmup) if warmup is not None else warmup_for(name, plan_model)
    _check_memory(name, model, x)
    if name == "gpipe":
        return Plan(name, x, _gpipe(model), model)
    x = check_warmup(model, x)
    if name in ("1f1b", "1f1b-iw"):
        orders = generate(model, x, split_backward=False, delta=delta, links=links, refill=refill)
        if name == "1f1b-iw":
            orders = split_fused(orders)
    else:
        orders = generate(model, x, delta=delta, links=links, refill=refill)
    return Plan(name, x, orders, model)
