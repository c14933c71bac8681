"""The package layers point one way, the planner loads no torch, and nothing probes a transport.

Layers, lowest first: pipelining (the planner) -> comm (transports, one subpackage per mechanism)
-> monitor -> runtime -> config (the schema and its resolution, no TorchTitan) -> integration
(TorchTitan glue: one folder per release, ``titan022/`` and ``titan03/``, beside what they share;
the entry points ``titan_morph.train``, ``titan_morph.launch`` and ``titan_morph.configs``) ->
compare -> netlab. A module may import its own layer and the ones below; every import counts, also
those inside functions.

The planner (``pipelining/``) is itself in rooms, lowest first: core (model, op codes, links, stragglers,
speeds, layout, values, trace rows) -> schedules (slackness, the generator, baselines) and timing
(the timing routine, simulate, deadlock, closed-form bounds), which import neither each other ->
search (driver, knobs, tabu, score, robust, builders) -> partition, reference (CP-SAT, instances)
and output (export, render), none importing another -> cli (the plan and partition command lines);
the two ``python -m`` entry points (``plan.py``, ``partition/__main__.py``) sit above every room. A
room imports itself and the rooms on lower levels only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "titan_morph"
LAYERS = ("pipelining", "comm", "monitor", "runtime", "config", "integration", "compare", "netlab")
ENTRY_POINTS = {"train": "integration", "launch": "integration", "configs": "integration"}
PURE = ("pipelining", "monitor")  # no torch


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # titan_morph itself
    return ENTRY_POINTS.get(parts[1], parts[1])


def _imports(path: Path) -> list[tuple[str, int]]:
    """Every module named by an import in ``path`` (absolute, relative resolved), with its line."""
    tree = ast.parse(path.read_text(), str(path))
    here = _module(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((base, node.lineno))
            out += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]  # submodule imports
    return out


def _files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _known_modules() -> set[str]:
    return {_module(p) for p in _files()}


def _edges() -> list[tuple[str, str, int]]:
    known = _known_modules()
    edges = []
    for path in _files():
        src = _module(path)
        for name, line in _imports(path):
            if name in known and name != src:
                edges.append((src, name, line))
    return edges


def test_every_import_points_down_the_layers():
    wrong = []
    for src, dst, line in _edges():
        a, b = _layer(src), _layer(dst)
        if a is None or b is None:
            continue
        if LAYERS.index(b) > LAYERS.index(a):
            wrong.append(f"{src}:{line} imports {dst} ({a} -> {b})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_planner_imports_no_other_titan_morph_package():
    outside = [
        f"{src}:{line} imports {dst}"
        for src, dst, line in _edges()
        if _layer(src) == "pipelining" and _layer(dst) != "pipelining"
    ]
    assert not outside, outside


@pytest.mark.parametrize("layer", PURE)
def test_pure_layers_never_name_torch(layer: str):
    named = [
        f"{_module(path)}:{line} imports {name}"
        for path in _files()
        if _layer(_module(path)) == layer
        for name, line in _imports(path)
        if name == "torch" or name.startswith("torch.")
    ]
    assert not named, named


def test_no_import_cycle_between_files():
    graph: dict[str, set[str]] = {}
    for src, dst, _ in _edges():
        if not dst.endswith("__init__") and dst != "titan_morph":
            graph.setdefault(src, set()).add(dst)
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_importing_the_planner_loads_no_torch_in_a_fresh_interpreter():
    """Every planner module, imported in a fresh interpreter, loads neither torch (nor matplotlib or
    OR-Tools, imported lazily where a picture or the exact solver needs them) nor another package."""
    modules = sorted(_module(p) for p in (PACKAGE / "pipelining").rglob("*.py"))
    assert {"titan_morph.pipelining.cli.plan", "titan_morph.pipelining.search.driver"} <= set(modules)
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "bad = sorted(k for k in sys.modules if k.split('.')[0] in ('torch', 'matplotlib', 'ortools')"
        " or (k.startswith('titan_morph.') and not k.startswith('titan_morph.pipelining')))\n"
        "print(len(sys.modules)); print(bad[:8])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    count, bad = out.stdout.splitlines()
    assert int(count) > 0 and bad == "[]", bad


def test_no_getattr_probing_of_a_transport():
    """Members a transport offers are in the written Protocol; nothing asks with getattr/hasattr."""
    suspects = ("transport", "primary", "delegate", "inner")
    found = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            probe = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if probe and node.func.id in ("getattr", "hasattr"):
                target = ast.unparse(node.args[0]) if node.args else ""
                if any(s in target for s in suspects):
                    found.append(f"{_module(path)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


def test_test_modules_outside_packages_have_unique_names():
    """pytest imports a test module of a folder without ``__init__.py`` by its bare file name: two
    such modules with one name stop the whole run at collection (``import file mismatch``)."""
    tests = Path(__file__).resolve().parent
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted(tests.rglob("test_*.py")):
        if (path.parent / "__init__.py").exists():
            continue
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(tests)} ~ {path.relative_to(tests)}")
        seen.setdefault(path.name, path)
    assert not clashes, clashes


PLANNER_ROOMS = (("core",), ("schedules", "timing"), ("search",), ("partition", "reference", "output"), ("cli",))
"""The planner's rooms by level, lowest first (module docstring); rooms on one level are siblings."""
PLANNER_ENTRY_POINTS = ("titan_morph.pipelining.plan", "titan_morph.pipelining.partition.__main__")


def _room(module: str) -> tuple[str, int] | None:
    """A planner module's room and its level (the entry points above every room); None outside the
    rooms (another package, or ``titan_morph.pipelining`` itself)."""
    parts = module.split(".")
    if parts[:2] != ["titan_morph", "pipelining"] or len(parts) < 3:
        return None
    if module in PLANNER_ENTRY_POINTS:
        return "entry point", len(PLANNER_ROOMS)
    level = next((k for k, rooms in enumerate(PLANNER_ROOMS) if parts[2] in rooms), -1)
    return parts[2], level


def test_the_planner_rooms_import_only_lower_levels():
    planner = PACKAGE / "pipelining"
    rooms = {p.name for p in planner.iterdir() if (p / "__init__.py").exists()}
    assert rooms == {room for level in PLANNER_ROOMS for room in level}, rooms
    wrong = []
    for src, dst, line in _edges():
        a, b = _room(src), _room(dst)
        if a is None or b is None or a[0] == b[0]:
            continue
        if a[1] < 0 or b[1] >= a[1]:
            wrong.append(f"{src}:{line} imports {dst} ({a[0]} -> {b[0]})")
    assert not wrong, "imports against the planner's rooms:\n" + "\n".join(wrong)


def test_the_planner_keeps_a_small_top_level_and_short_modules():
    """Beside its rooms the planner's top level holds its package and the ``plan`` entry point; no
    module of the planner or of the TorchTitan integration (the two largest rooms) is longer than 500
    lines."""
    top = sorted(p.name for p in (PACKAGE / "pipelining").glob("*.py"))
    assert len(top) <= 6, top
    long = [
        f"{_module(p)}: {n} lines"
        for room in ("pipelining", "integration")
        for p in (PACKAGE / room).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    ]
    assert not long, long


MAX_LINES = 600


def test_no_module_is_longer_than_a_reader_can_hold():
    long = [f"{_module(p)}: {n} lines" for p in _files() if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, long


def test_comm_keeps_its_mechanisms_in_their_own_rooms():
    """``comm/`` holds the protocol and what every mechanism shares; each mechanism is a subpackage."""
    top = sorted(p.name for p in (PACKAGE / "comm").glob("*.py"))
    assert len(top) <= 10, top
    assert {"delegate", "failover", "emulator"} <= {p.name for p in (PACKAGE / "comm").iterdir() if p.is_dir()}


RELEASES = ("titan022", "titan03")
DISPATCH = {"titan_morph.integration.release", "titan_morph.integration.config"}  # picks / aliases a release


def _release(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "integration" and parts[2] in RELEASES else None


def test_release_adapters_import_only_themselves_and_what_they_share():
    """One TorchTitan release's adapter never imports the other's, and the shared integration
    modules import neither (but the module that tells which release runs, and the old config name)."""
    wrong = []
    for src, dst, line in _edges():
        a, b = _release(src), _release(dst)
        if b is None or a == b:
            continue
        if a is not None or (src.startswith("titan_morph.integration.") and src not in DISPATCH):
            wrong.append(f"{src}:{line} imports {dst}")
    assert not wrong, wrong


def _imported_by_torchtitan(names: set[str]) -> set[str]:
    """Those of ``names`` that the installed TorchTitan imports itself without declaring them
    (read from its source, so that the exception holds only while TorchTitan really needs them)."""
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")
    if spec is None or spec.origin is None:
        return set()
    found = set()
    for path in Path(spec.origin).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    return found & names


def test_every_declared_dependency_is_imported():
    """``pyproject.toml`` declares what the code imports, or what TorchTitan imports without
    declaring it (a package nothing imports costs every install its size: triton is ~1 GB)."""
    import re

    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    imported = {
        name.split(".")[0]
        for path in [*_files(), *(PACKAGE.parent / "scripts").glob("*.py")]
        for name, _ in _imports(path)
    }
    tools = {"pytest", "pytest-timeout", "ruff", "mypy"}  # run, not imported
    tests_only = {"hypothesis"}
    imported |= _imported_by_torchtitan({"triton"})
    declared = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    unused = [
        req
        for req in declared
        if (name := re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower()) not in tools | tests_only
        and name.replace("-", "_") not in imported
    ]
    assert not unused, f"declared but imported by no module: {unused}"
