"""``netlab run``: training across namespaces gives the losses of one node and leaves nothing."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.netlab.conftest import PREFIX, finish
from titan_morph.comm.machine.system import segments_in_use, shm_segments
from titan_morph.netlab.lab import Lab, lab_namespaces
from titan_morph.netlab.run import NIC_BYTES_FILE, with_lab_nics

pytestmark = pytest.mark.netlab

REPO = Path(__file__).resolve().parents[2]
LOSS_RE = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)")


def _netlab_run(dump: Path, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "titan_morph.netlab", "run", "--prefix", PREFIX, *args]
    env = {k: v for k, v in os.environ.items() if k not in ("CONFIG_FILE", "TITAN_MORPH_RUN_ID")}
    return subprocess.Popen(
        [*cmd, "--job.dump_folder", str(dump)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env=env,
        start_new_session=True,
    )


def _nothing_left(dump: Path, segments_before: set[str], no_leftovers: Callable[[Path], None]) -> None:
    """No namespace, process or unused new segment (other jobs on this host may hold their own)."""
    assert lab_namespaces(PREFIX) == []
    no_leftovers(dump)
    deadline = time.monotonic() + 10
    while (stale := shm_segments() - segments_before - segments_in_use()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not stale


# what stage 1 (node 0) sends stage 2 (node 1) in 3 steps: 8 microbatches of 128 x 256 fp32 activations
CROSS_NODE_BYTES = 3 * 8 * 128 * 256 * 4


@pytest.mark.parametrize(
    ("transport", "pipeline_nic", "other_nic"),
    [
        pytest.param("auto", "data", "host", marks=pytest.mark.slow),  # the per-link groups: data_ifname = "data"
        pytest.param("delegate", "host", "data", marks=pytest.mark.slow),  # the delegates: host_ifnames = "host"
    ],
)
def test_two_nodes_of_two_ranks_train_with_the_losses_of_one_node(
    namespaces_ok: None,
    tmp_path: Path,
    no_leftovers: Callable[[Path], None],
    transport: str,
    pipeline_nic: str,
    other_nic: str,
    one_node_losses: list[float],
):
    dump, before = tmp_path / "run", shm_segments()
    args = ["--training.steps", "3", "--morph.transport", transport]
    proc = _netlab_run(dump, "--nodes", "2", "--ranks-per-node", "2", "--", *args)
    out = finish(proc, 240)
    assert proc.returncode == 0, out[-3000:]
    losses = {int(step): float(loss) for step, loss in LOSS_RE.findall(out)}
    assert [losses.get(step) for step in (1, 2, 3)] == one_node_losses[:3], out[-3000:]
    assert {p.name for p in (dump / "netlab").iterdir()} >= {"node0.log", "node1.log", "node0", "node1"}
    assert LOSS_RE.search((dump / "netlab" / "node1.log").read_text())  # the shown node's log keeps the loss
    # the pipeline's traffic between the nodes went over its own NIC; the other carried a small part
    sent = {nic: n["tx"] for nic, n in json.loads((dump / "netlab" / NIC_BYTES_FILE).read_text())["node0"].items()}
    assert sent[pipeline_nic] >= CROSS_NODE_BYTES and sent[other_nic] < CROSS_NODE_BYTES / 3, sent
    _nothing_left(dump, before, no_leftovers)


@pytest.mark.slow
def test_tp_inside_a_node_and_pp_across_two_trains_with_the_losses_of_one_node(
    namespaces_ok: None, tmp_path: Path, no_leftovers: Callable[[Path], None]
):
    """TP 2 x PP 2 with each stage's two TP ranks on one lab node and the pipeline across the two
    (the layout of most large jobs): the losses of the same job on one node."""
    tp = [
        "--training.steps",
        "3",
        "--parallelism.tensor_parallel_degree",
        "2",
        "--parallelism.pipeline_parallel_degree",
        "2",
    ]
    one = subprocess.run(
        [str(REPO / "run_train.sh"), *tp, "--job.dump_folder", str(tmp_path / "one")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k not in ("CONFIG_FILE", "TITAN_MORPH_RUN_ID")},
    )
    assert one.returncode == 0, one.stderr[-3000:]
    want = {int(step): float(loss) for step, loss in LOSS_RE.findall(one.stdout + one.stderr)}
    dump, before = tmp_path / "run", shm_segments()
    proc = _netlab_run(dump, "--nodes", "2", "--ranks-per-node", "2", "--", *tp)
    out = finish(proc, 300)
    assert proc.returncode == 0, out[-3000:]
    got = {int(step): float(loss) for step, loss in LOSS_RE.findall(out)}
    assert sorted(want) == [1, 2, 3] and got == want, (got, want)
    _nothing_left(dump, before, no_leftovers)


def test_lab_nic_options_come_first_and_the_users_own_win():
    two = Lab(2, PREFIX, host_nics=2)
    assert with_lab_nics(["--training.steps", "3"], Lab(2, PREFIX)) == [
        "--morph.data_ifname", "data", "--morph.host_ifnames", "host", "--training.steps", "3"
    ]  # fmt: skip
    assert with_lab_nics(["--morph.data-ifname=eth9"], two) == [
        "--morph.host_ifnames", "host", "--morph.data-ifname=eth9"
    ]  # fmt: skip
    assert with_lab_nics(["--morph.host_ifnames", ""], two) == [
        "--morph.data_ifname", "data", "--morph.host_ifnames", ""
    ]  # fmt: skip


def test_a_bad_configuration_is_one_line_before_any_namespace(namespaces_ok: None, tmp_path: Path):
    proc = _netlab_run(tmp_path / "run", "--nodes", "2", "--ranks-per-node", "1", "--", "--training.steps", "2")
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 2, out
    assert out.startswith("error: NGPU: 2 ranks") and len(out.splitlines()) == 1, out
    assert lab_namespaces(PREFIX) == [] and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_ctrl_c_stops_every_node_and_leaves_nothing(
    namespaces_ok: None, tmp_path: Path, no_leftovers: Callable[[Path], None]
):
    dump, before = tmp_path / "run", shm_segments()
    proc = _netlab_run(dump, "--nodes", "2", "--ranks-per-node", "2", "--", "--training.steps", "200")
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # until the first step's loss
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            line = proc.stdout.readline() if ready else ""
            if LOSS_RE.search(line) or (ready and not line):
                break
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130
    _nothing_left(dump, before, no_leftovers)
