"""Gaps to the exact optimum, each stated against what it is measured against.

CP-SAT (:func:`pipelining.reference.exact.optimal_makespan`, warm-started from a baseline, never from the
planner it judges) either proves its schedule optimal or returns the best schedule it found and a
proven lower bound. A gap is therefore against the proven optimum where there is one; elsewhere
against the best schedule known (CP-SAT's, or a planner's when shorter), which is no optimum, with
the gap to the proven bound beside it (the true gap lies between the two). The benchmarks share
these routines so that every table says which reference each figure has and how many were proven.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.reference.instances import describe


@dataclass(frozen=True)
class Reference:
    """What one instance's gaps are measured against."""

    best: float
    """The proven optimum when ``proven``, else the best schedule known (CP-SAT's or a planner's)."""
    bound: float
    """CP-SAT's proven lower bound on any schedule."""
    proven: bool
    """``best`` is the optimum: CP-SAT proved it, or a planner's schedule meets CP-SAT's bound."""
    hint: str
    """CP-SAT's warm start (a baseline's name or "none")."""
    by_bound: bool = False
    """Proven by a planner's schedule meeting CP-SAT's bound, not by CP-SAT's own schedule."""


def optima(models: Sequence[CostModel], cache: Path, limit_s: float) -> dict[str, dict]:
    """CP-SAT's result per instance (``describe(model)``), solved with the default warm start (a
    baseline) and cached as JSON in ``cache``; a cached entry is reused when it is proven or was
    solved at least as long and records its start."""
    from titan_morph.pipelining.reference.exact import optimal_makespan

    known = json.loads(cache.read_text()) if cache.exists() else {}
    for model in models:
        key = describe(model)
        entry = known.get(key)
        if entry is not None and "hint" in entry and (entry["optimal"] or entry["limit"] >= limit_s):
            continue
        res = optimal_makespan(model, time_limit_s=limit_s, workers=2)
        known[key] = {
            "makespan": res.makespan,
            "bound": res.lower_bound,
            "optimal": res.optimal,
            "limit": limit_s,
            "hint": res.hint,
        }
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(known, indent=1))
    return known


def references(models: Sequence[CostModel], opt: dict[str, dict], found: Sequence[Sequence[float]]) -> list[Reference]:
    """Per instance: the proven optimum, or the best of CP-SAT's schedule and ``found`` (each
    planner's makespans, one list per planner, within the memory budget). A best known that meets
    CP-SAT's proven bound is the optimum too (proven ``by_bound``)."""
    out = []
    for i, model in enumerate(models):
        entry = opt[describe(model)]
        best = entry["makespan"] if entry["optimal"] else min([entry["makespan"], *(spans[i] for spans in found)])
        by_bound = not entry["optimal"] and best <= entry["bound"] + 1e-9
        proven = bool(entry["optimal"]) or by_bound
        out.append(Reference(best, entry["bound"], proven, entry.get("hint", "?"), by_bound))
    return out


def reference_line(refs: Sequence[Reference], limit_s: float) -> str:
    """The sentence naming the references: how many proven, the warm starts, what the rest are."""
    proven = sum(r.proven for r in refs)
    by_bound = sum(r.by_bound for r in refs)
    starts = ", ".join(sorted({r.hint for r in refs}))
    rest = len(refs) - proven
    how = (
        f": CP-SAT's proof on {proven - by_bound}, a planner's schedule at CP-SAT's bound on {by_bound}"
        if by_bound
        else ""
    )
    other = (
        f"; the other {rest} against the best schedule known (CP-SAT's or a planner's, no proven optimum),"
        " with the gap to CP-SAT's proven bound beside it"
        if rest
        else ""
    )
    return (
        f"reference: the proven optimum on {proven} of {len(refs)}{how} (CP-SAT {limit_s:g} s per instance,"
        f" 2 workers, warm start from a baseline ({starts}), never from the planner's plan){other}"
    )


def gap_cell(ms: float, ref: Reference) -> str:
    """One instance's gap: to the optimum when proven, else "not proven" with the best and bound."""
    if ref.proven:
        return f"{100 * (ms / ref.best - 1):.2f} %"
    return (
        f"not proven: {100 * (ms / ref.best - 1):+.2f} % to the best known {ref.best:g},"
        f" {100 * (ms / ref.bound - 1):.2f} % to the bound {ref.bound:g}"
    )


GAP_HEADER = (
    "| {what} | to the proven optimum ({proven} inst.): mean / worst | to the best known (all {count}): mean / worst"
    " | to the proven bound (all {count}): mean / worst{extra} |"
)


def header(what: str, refs: Sequence[Reference], extra: Sequence[str] = ()) -> list[str]:
    """The markdown header of a gap table whose rows come from :func:`gap_row`."""
    cols = "".join(f" | {e}" for e in extra)
    line = GAP_HEADER.format(what=what, proven=sum(r.proven for r in refs), count=len(refs), extra=cols)
    return [line, "|---|---:|---:|---:|" + "---:|" * len(extra)]


def gap_row(name: str, spans: Sequence[float], refs: Sequence[Reference], extra: Sequence[str] = ()) -> str:
    """A planner's row: mean / worst gap to the proven optima, to the best known, to the bound."""

    def pair(gaps: list[float], digits: int) -> str:
        if not gaps:
            return "—"
        return f"{100 * statistics.mean(gaps):.{digits}f} % / {100 * max(gaps):.2f} %"

    proven = [ms / r.best - 1 for ms, r in zip(spans, refs) if r.proven]
    known = [ms / r.best - 1 for ms, r in zip(spans, refs)]
    bound = [ms / r.bound - 1 for ms, r in zip(spans, refs)]
    cols = "".join(f" | {e}" for e in extra)
    return f"| {name} | {pair(proven, 3)} | {pair(known, 3)} | {pair(bound, 2)}{cols} |"


def within(spans: Sequence[float], refs: Sequence[Reference], fraction: float) -> str:
    """How many instances are within ``fraction`` of their reference (optimum or best known)."""
    return f"{sum(ms / r.best - 1 <= fraction + 1e-12 for ms, r in zip(spans, refs))}/{len(refs)}"
