"""README's parity table (TorchTitan 0.2.2 vs 0.3.0) stays true: every test a cell names exists (the
file, and the function when one is named), every row gives each release a test or, for 0.3.0, says
"not on 0.3.0" and why, and a 0.3.0 cell names a ``titan03/`` test unless it says that the test
uses no TorchTitan."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
HEADER = "| Feature | 0.2.2 | 0.3.0 |"
REF = re.compile(r"`((?:[\w]+/)*test_\w+\.py)(?:::(\w+))?`")


def _rows() -> list[list[str]]:
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index(HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def _tests_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_named_test_exists_and_every_row_is_backed() -> None:
    rows = _rows()
    assert len(rows) >= 20, f"the parity table was not found whole under {HEADER!r}"
    for feature, old, new in rows:
        for release, cell in (("0.2.2", old), ("0.3.0", new)):
            refs = REF.findall(cell)
            refused = release == "0.3.0" and cell.startswith("not on 0.3.0")
            assert refs or refused, f"{feature!r}: the {release} cell names no test: {cell!r}"
            for file, name in refs:
                path = TESTS / file
                assert path.is_file(), f"{feature!r} ({release}): no file tests/{file}"
                assert not name or name in _tests_of(path), f"{feature!r} ({release}): no {name} in tests/{file}"
        if not new.startswith("not on 0.3.0"):
            own = [f for f, _ in REF.findall(new) if f.startswith("titan03/")]
            assert own or "no TorchTitan" in new, f"{feature!r}: the 0.3.0 cell names no titan03/ test: {new!r}"
