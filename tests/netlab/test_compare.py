"""``netlab compare``: compare's variants in turn on one shaped lab, read back as compare's tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from titan_morph.compare.results import STEP_TIME_TAG, read_scalars
from titan_morph.netlab.compare import link_rates, reset_lab
from titan_morph.netlab.lab import Lab, down, lab_namespaces
from titan_morph.netlab.run import parse_shape_spec
from titan_morph.netlab.shape import break_path, breaks, shape, shapes

pytestmark = pytest.mark.netlab

REPO = Path(__file__).resolve().parents[2]
PREFIX = "tmcmp"  # not the other netlab tests' prefix: they may run at the same time


def _compare(logdir: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TITAN_MORPH_RUN_ID"}
    env["CONFIG_FILE"] = "train_configs/synthetic_cpu.toml"
    cmd = [sys.executable, "-m", "titan_morph.netlab", "compare", "--prefix", PREFIX, "--logdir", str(logdir), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout_s)


def test_link_rates_of_the_lab_limits() -> None:
    both = [parse_shape_spec("1-2:data:20"), parse_shape_spec("2-1:data:20"), parse_shape_spec("1-2:host:5")]
    assert link_rates(both, 4, 1) == ((0.0, 20.0, 0.0), "")
    rates, why = link_rates([parse_shape_spec("1-2:data:20")], 4, 1)
    assert rates is None and "link 1" in why  # one direction only: the model has one rate per link
    assert link_rates([parse_shape_spec("0-2:data:20"), parse_shape_spec("2-0:data:20")], 4, 1)[0] is None
    assert link_rates(both, 2, 2)[0] is None


def test_an_unknown_variant_is_one_line_before_any_lab(namespaces_ok: None, tmp_path: Path) -> None:
    out = _compare(tmp_path, "--nodes", "2", "--ranks-per-node", "1", "--variants", "ZBH2,Nope", timeout_s=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]
    assert out.stderr.startswith("error: unknown variant 'Nope'")
    assert lab_namespaces(PREFIX) == []


def test_a_job_of_another_size_than_the_lab_is_one_line(namespaces_ok: None, tmp_path: Path) -> None:
    out = _compare(tmp_path, "--nodes", "2", "--ranks-per-node", "1", "--variants", "ZBH2", timeout_s=120)
    assert out.returncode == 2
    assert "error: ZBH2: the job needs 4 ranks, the lab has 2 nodes x 1" in out.stderr
    assert lab_namespaces(PREFIX) == []


def test_reset_lab_clears_limits_and_broken_paths(namespaces_ok: None) -> None:
    lab = Lab(3, PREFIX)
    lab.up()
    try:
        shape(lab, 0, 1, "data", 30)
        shape(lab, 2, 1, "host", 10)
        break_path(lab, 1, 2, "data")
        assert len(shapes(lab)) == 2 and breaks(lab)
        reset_lab(lab)
        assert shapes(lab) == [] and breaks(lab) == []
    finally:
        down(PREFIX)


@pytest.mark.slow  # two jobs' start-up: about 2 minutes on 2 cores
def test_two_variants_run_on_one_shaped_lab_and_read_back(
    namespaces_ok: None, tmp_path: Path, no_leftovers: Callable[[Path], None]
) -> None:
    args = ["--nodes", "2", "--ranks-per-node", "1", "--variants", "ZBH2,PipeMorph", "--steps", "3"]
    args += ["--shape", "0-1:data:50", "--shape", "1-0:data:50", "--name", "two"]
    train = ["--parallelism.pipeline_parallel_degree", "2", "--morph.synthetic.message_kb", "16"]
    out = _compare(tmp_path, *args, "--", *train)
    assert out.returncode == 0, out.stderr[-3000:]
    assert lab_namespaces(PREFIX) == []
    folder = tmp_path / "two"
    meta = json.loads((folder / "comparison.json").read_text())
    assert [r["variant"] for r in meta["runs"]] == ["ZBH2", "PipeMorph"]
    for variant in ("ZBH2", "PipeMorph"):
        run_dir = folder / variant
        assert sorted(read_scalars(run_dir)[STEP_TIME_TAG]) == [1, 2, 3]
        assert json.loads((run_dir / "outcome.json").read_text())["returncode"] == 0
        assert "shaped 0->1 on data: 50 mbit" in out.stderr  # the limits of every job
        no_leftovers(run_dir)
    assert out.stderr.count("shaped 1->0 on data: 50 mbit") == 2  # re-applied for each job
    table = (folder / "table.md").read_text()
    assert "| ZBH2 |" in table and "| PipeMorph |" in table and "| ok |" in table
    sims = [r["simulated_ms"] for r in meta["runs"]]
    assert all(s is not None and s > 0 for s in sims)  # both directions limited alike: the model has a rate
