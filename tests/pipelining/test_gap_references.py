"""benchmarks/gaps.py: a gap is to the proven optimum only where one is proven, never "0.0 %" on an
unproven instance, and the reference line counts the proofs."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.gaps import Reference, gap_cell, gap_row, reference_line, references
from titan_morph.pipelining.core.model import CostModel
from titan_morph.pipelining.reference.instances import describe

MODELS = [CostModel.uniform(3, 4, 1.0, 1.0, 1.0, delays=d) for d in (0.0, 1.0, 2.0)]


def _opt(*entries: tuple[float, float, bool]) -> dict[str, dict]:
    return {
        describe(m): {"makespan": ms, "bound": lb, "optimal": ok, "limit": 1.0, "hint": "zb-h2"}
        for m, (ms, lb, ok) in zip(MODELS, entries)
    }


def test_unproven_rows_say_so_with_best_and_bound() -> None:
    # proven by CP-SAT; unproven but a planner meets the bound; unproven, the planner's own plan best
    opt = _opt((100.0, 100.0, True), (110.0, 105.0, False), (130.0, 110.0, False))
    planner = [100.0, 105.0, 120.0]
    refs = references(MODELS, opt, [planner])
    assert [r.proven for r in refs] == [True, True, False] and refs[1].by_bound
    assert refs[2].best == 120.0 and refs[2].bound == 110.0
    assert gap_cell(planner[0], refs[0]) == "0.00 %"
    cell = gap_cell(planner[2], refs[2])
    assert cell.startswith("not proven") and "120" in cell and "bound 110" in cell and "9.09 %" in cell
    line = reference_line(refs, 1.0)
    assert "proven optimum on 2 of 3" in line and "CP-SAT's proof on 1" in line and "the other 1" in line
    assert "never from the planner's plan" in line
    row = gap_row("p", planner, refs)
    assert row.startswith("| p | 0.000 % / 0.00 % | 0.000 % / 0.00 % |")  # to the optima; to the best known
    assert "9.09 %" in row  # the worst gap to the proven bound


def test_optima_cache_records_the_start(tmp_path: Path) -> None:
    pytest.importorskip("ortools", reason="CP-SAT is a dev dependency")
    from benchmarks.gaps import optima

    cache = tmp_path / "optima.json"
    got = optima(MODELS[:1], cache, 10.0)[describe(MODELS[0])]
    assert got["optimal"] and got["hint"] in ("1f1b-iw", "zb-h1", "zb-h2")
    assert Reference(got["makespan"], got["bound"], True, got["hint"]).best == got["makespan"]
