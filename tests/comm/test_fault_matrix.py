"""The fault matrix (``benchmarks/fault_matrix.py``), cell by cell: process kind x fault x transport.

Each cell is a real training job (llama3 debug, PP=2, 8 steps) whose rank-0 process of one kind
gets one fault after step 3; the cell passes when the job does what the matrix expects (continues
with the losses of the same job without the fault, or stops within the timeout + 30 s with an
error naming the process and link) and leaves no process or shared-memory segment behind.

Every cell is ``slow`` (the default run kills delegates and ranks in
``tests/comm/test_delegate_lifecycle.py`` and ``test_delegate_faults.py``). ``benchmarks/fault_matrix.py``
runs them all and writes ``docs/reliability.md``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.fault_matrix import Cell, cells, reference, run_cell


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict:
    """Per transport, the losses of the job without a fault (computed once, when first needed)."""
    cache: dict[str, dict[int, float]] = {}
    root = tmp_path_factory.mktemp("references")

    def get(transport: str) -> dict[int, float]:
        if transport not in cache:
            cache[transport] = reference(transport, Path(root))
        return cache[transport]

    return get  # type: ignore[return-value]


@pytest.mark.slow  # a real job per cell; the default run kills delegates in tests/comm/test_delegate_lifecycle.py
@pytest.mark.parametrize("cell", [pytest.param(cell, id=cell.name) for cell in cells()])
def test_fault_matrix_cell(cell: Cell, references, tmp_path) -> None:
    result = run_cell(cell, references(cell.transport), tmp_path)
    assert result.passed, f"{cell.name}: {result.why}\n{result}"
