"""A data path broken at a training step: schedules keyed by step, and (netlab) a job whose data
path between two nodes breaks at step 3 under ``transport = "auto"`` keeps the losses of an
undisturbed run, its link on the delegates (over the ``host`` NIC)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.netlab.conftest import PREFIX, finish
from titan_morph.comm.machine.system import segments_in_use, shm_segments
from titan_morph.netlab.lab import Lab, LabError, lab_namespaces
from titan_morph.netlab.schedule import Controller, Event, StepLog, parse_schedule
from titan_morph.netlab.shape import breaks

REPO = Path(__file__).resolve().parents[2]
LOSS_RE = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)")


def test_step_keyed_rows_come_after_the_timed_ones_in_step_order():
    text = "time_s,from,to,nic,rate_mbit\nstep=5,1,2,data,heal\n3,0,1,data,100\nstep=3,n1,n2,data,break\n"
    assert parse_schedule(text) == [
        Event(3.0, 0, 1, "data", 100.0),
        Event(0.0, 1, 2, "data", action="break", step=3),
        Event(0.0, 1, 2, "data", action="heal", step=5),
    ]
    assert str(Event(0.0, 1, 2, "data", action="break", step=3)) == "step 3 break 1<->2 on data"


@pytest.mark.parametrize("cell", ["step=0", "step=x", "step=-1", "step="])
def test_a_bad_step_names_its_line(cell: str):
    with pytest.raises(LabError, match=r"plan.csv:2: .*step=N with a training step N >= 1"):
        parse_schedule(f"time_s,from,to,nic,rate_mbit\n{cell},1,2,data,break\n", "plan.csv")


def test_a_step_keyed_row_needs_a_job_to_follow():
    lab = Lab(3, PREFIX)  # not made: the check comes before anything runs
    with pytest.raises(LabError, match="step 3 break 1<->2 on data: a step-keyed row needs a job"):
        Controller(lab, [Event(0.0, 1, 2, "data", action="break", step=3)])


def test_the_step_log_reads_the_step_the_job_is_in(tmp_path: Path):
    log = tmp_path / "node3.log"
    progress = StepLog(log)
    assert progress() == 1  # no log yet: the job is starting
    with log.open("wb") as fh:
        fh.write(b"[rank3]: step:  1  loss:  7.9241  grad_norm: 1.2\n[rank3]: step:  2  lo")
        fh.flush()
        assert progress() == 2  # step 2's line is still being written
        fh.write(b"ss:  7.7441\nother text\n")
        fh.flush()
        assert progress() == 3


@pytest.mark.netlab
def test_a_step_keyed_break_is_applied_when_the_job_begins_that_step(lab3: Lab, tmp_path: Path):
    log = tmp_path / "node2.log"
    log.write_bytes(b"step:  1  loss:  7.9\n")
    out = io.StringIO()
    controller = Controller(lab3, [Event(0.0, 1, 2, "data", action="break", step=3)], out, StepLog(log)).start()
    try:
        assert not controller.wait(0.5) and breaks(lab3) == []  # still in step 2
        with log.open("ab") as fh:
            fh.write(b"step:  2  loss:  7.7\n")
        assert controller.wait(10.0)
        assert {(b.a, b.b, b.nic) for b in breaks(lab3)} == {(1, 2, "data"), (2, 1, "data")}
        assert out.getvalue() == "netlab: schedule: step 3 break 1<->2 on data\n"
    finally:
        controller.stop()


def _break_at_step_3(tmp_path: Path, transport: str) -> tuple[int, str, Path]:
    """A 4-node PipeMorph job under ``transport`` whose data path 1 <-> 2 breaks when step 3 begins;
    the job's exit code, output and dump folder. [comm] train timeout 20 s: the stall bound of
    ``auto`` is 5 s (the default 100 s gives 25 s, same result)."""
    dump = tmp_path / "run"
    schedule = tmp_path / "break.csv"
    schedule.write_text("time_s,from,to,nic,rate_mbit\nstep=3,1,2,data,break\n")
    train = ["--parallelism.pipeline_parallel_schedule", "PipeMorph", "--morph.transport", transport]
    train += ["--comm.train_timeout_seconds", "20", "--job.dump_folder", str(dump)]
    cmd = [sys.executable, "-m", "titan_morph.netlab", "run", "--prefix", PREFIX, "--nodes", "4"]
    cmd += ["--ranks-per-node", "1", "--schedule", str(schedule), "--", *train]
    env = {k: v for k, v in os.environ.items() if k not in ("CONFIG_FILE", "TITAN_MORPH_RUN_ID")}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env, start_new_session=True
    )
    out = finish(proc, 420)
    return proc.returncode, out, dump


def _nothing_left(dump: Path, before: set[str], no_leftovers: Callable[[Path], None]) -> None:
    assert lab_namespaces(PREFIX) == []
    no_leftovers(dump)
    deadline = time.monotonic() + 10
    while (stale := shm_segments() - before - segments_in_use()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not stale


@pytest.mark.slow
@pytest.mark.netlab
def test_a_data_path_broken_at_step_3_fails_over_with_the_losses_of_an_undisturbed_run(
    namespaces_ok: None, tmp_path: Path, no_leftovers: Callable[[Path], None], one_node_losses: list[float]
):
    before = shm_segments()
    code, out, dump = _break_at_step_3(tmp_path, "auto")
    assert code == 0, out[-3000:]
    assert "netlab: schedule: step 3 break 1<->2 on data" in out, out[-3000:]
    losses = [float(loss) for _, loss in LOSS_RE.findall(out)]
    assert losses == one_node_losses, out[-3000:]  # the default config: PipeMorph, auto, 10 steps
    logs = {n: (dump / "netlab" / f"node{n}.log").read_text() for n in range(4)}
    # the link's two ends moved it at step 3, the rank that saw the stall by its own verdict, the other
    # on its notice; no other link moved
    moved = {n: re.findall(r"link (\d) \((fwd|bwd)\) failed on its default path at step (\d+)", logs[n]) for n in logs}
    assert sorted(moved[1]) == sorted(moved[2]) == [("1", "bwd", "3"), ("1", "fwd", "3")], moved
    assert moved[0] == moved[3] == [], moved
    assert "the data path is broken" in logs[1] + logs[2]
    _nothing_left(dump, before, no_leftovers)


@pytest.mark.slow
@pytest.mark.netlab
def test_under_default_a_broken_data_path_ends_the_job_within_its_timeout_naming_the_link(
    namespaces_ok: None, tmp_path: Path, no_leftovers: Callable[[Path], None], one_node_losses: list[float]
):
    """``transport = "default"`` has nowhere to move a link: with ``data_ifname`` (netlab passes
    ``data``) its pipeline traffic is on per-link groups over the data NIC, so the break stalls it,
    and every rank's wait ends at the [comm] train timeout; the two ends of link 1 name it."""
    before = shm_segments()
    code, out, dump = _break_at_step_3(tmp_path, "default")
    assert code not in (0, 124), out[-3000:]
    losses = [float(loss) for _, loss in LOSS_RE.findall(out)]
    assert losses == one_node_losses[:2], out[-3000:]  # steps 1 and 2, then the break
    node_lines = dict(re.findall(r"netlab: node (\d): (LinkFailedError: .*)", out))
    for node, peer in (("1", "2"), ("2", "1")):  # which op each end was waiting in depends on timing
        line = node_lines.get(node, "")
        assert re.search(rf"(send to|receive from) stage {peer} on link 1 \((fwd|bwd)\)", line), out[-3000:]
        assert "(bound 20 s)" in line
    _nothing_left(dump, before, no_leftovers)
