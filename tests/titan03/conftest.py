"""tests/titan03: TorchTitan 0.3.0's adapter. They run in its environment (``TORCHTITAN=0.3.0
./run_tests.sh``); elsewhere each is skipped with one line saying so."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def titan_version() -> str | None:
    try:
        return version("torchtitan")
    except PackageNotFoundError:
        return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    found = titan_version()
    if found == "0.3.0":
        return
    skip = pytest.mark.skip(
        reason=f"TorchTitan 0.3.0 tests; this environment has {found}: TORCHTITAN=0.3.0 ./run_tests.sh"
    )
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)
