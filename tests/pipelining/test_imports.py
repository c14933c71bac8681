"""The planner is pure Python: importing any of its modules loads neither torch (nor matplotlib or
OR-Tools, imported lazily where needed) nor any other titan_morph package."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import titan_morph.pipelining

# The torch runtime that still lives in this folder; it belongs to titan_morph.runtime.
RUNTIME_MODULES = {"schedule"}


def _planner_modules() -> list[str]:
    path = Path(titan_morph.pipelining.__file__).parent
    names = sorted(info.name for info in pkgutil.iter_modules([str(path)]))
    assert {"builders", "cli", "generate", "robust", "search", "simulate"} <= set(names)
    return [f"titan_morph.pipelining.{name}" for name in names if name not in RUNTIME_MODULES]


def test_every_planner_module_imports_without_torch_or_other_packages() -> None:
    modules = _planner_modules()
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "heavy = sorted(m for m in ('torch', 'matplotlib', 'ortools') if m in sys.modules)\n"
        "other = sorted(m for m in sys.modules if m.startswith('titan_morph.')"
        " and not m.startswith('titan_morph.pipelining'))\n"
        "assert not heavy and not other, (heavy, other)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
