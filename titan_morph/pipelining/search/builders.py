"""Named schedules as :class:`model.Plan` objects: the baselines of the paper's §7 and PipeMorph,
with PipeMorph's search on top.

The plain builders live in :mod:`baselines` (1F1B, 1F1B with split backward, GPipe, ZB-H1, ZB-H2 and
PipeMorph's Alg. 1/2 + Alg. 3/4 plan); ``build("pipemorph", model, search=True)`` runs the search
(:mod:`search`; with ``samples=``, :mod:`robust` plans for sampled delays). Names are spelled one way
(:data:`SCHEDULES`); :func:`schedule_key` maps every accepted spelling ("ZBH2", "zb-h2", "ZB_H2",
the TOML names "PipeMorph", "Morph1F1B"...) onto them.
"""

from __future__ import annotations

from typing import Any

from titan_morph.pipelining.core.model import CostModel, Plan
from titan_morph.pipelining.schedules.baselines import (
    SCHEDULES,
    V_SCHEDULES,
    build_plain,
    check_placement,
    schedule_key,
    split_fused,
    warmup_for,
)
from titan_morph.pipelining.search.driver import search as run_search
from titan_morph.pipelining.search.robust import robust_plan

__all__ = ["SCHEDULES", "V_SCHEDULES", "build", "schedule_key", "warmup_for", "split_fused"]


def build(schedule: str, model: CostModel, **kw: Any) -> Plan:
    """Build the named schedule (any spelling :func:`schedule_key` accepts) for ``model``.

    Keyword options: ``search`` (pipemorph and pipemorph-v only: run :func:`driver.search` on top; ``iterations``,
    ``time_budget_ms``, ``links``, ``depth`` and ``seeds`` go to it; with ``samples`` (per-link delay
    vectors) :func:`robust.robust_plan` plans for them instead), ``delta`` (δ-quantised
    generation), ``links`` (a :class:`links.LinkModel` the generator plans against instead of
    ``model.delays``), ``warmup`` (override x_i; pipemorph and pipemorph-v only), ``refill`` (generator option:
    keep stages x_i forwards ahead in the steady phase, see :mod:`generate`; default False = the
    paper's I > F > W).
    """
    name = schedule_key(schedule)
    search = bool(kw.pop("search", False))
    if search and name not in ("pipemorph", "pipemorph-v"):
        raise ValueError(f"search=True is only meaningful for 'pipemorph' and 'pipemorph-v', not {schedule!r}")
    check_placement(name, model)
    if search:
        samples = kw.pop("samples", None)
        return robust_plan(model, samples, schedule=name, **kw) if samples is not None else run_search(model, **kw)
    unknown = set(kw) - {"delta", "links", "warmup", "refill"}
    if unknown:
        raise ValueError(f"unknown option(s) for build({schedule!r}): {', '.join(sorted(unknown))}")
    return build_plain(name, model, **kw)
