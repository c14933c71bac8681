"""./run_train.sh as one node of a multi-node job: the torchrun command built from torchrun's usual
variables, their one-line errors before any rank, the ``[morph]`` NIC checks, and a real two-node
job on loopback that trains with the losses of one node."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch import DEFAULT_CONFIG, REPO, check_like_run_train, free_port
from titan_morph.comm.machine.system import segments_in_use, shm_segments
from titan_morph.compare.runner import MARKER_ENV, marked_processes
from titan_morph.config import ConfigError, Morph, resolve_morph
from titan_morph.integration.nodes import Nodes, check_interfaces, network_interfaces, nodes_from_env
from titan_morph.integration.titan022 import launcher

NODE_VARIABLES = ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RDZV_ENDPOINT", "RDZV_ID", "RDZV_BACKEND")
LOSS_RE = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)")
HYBRID = REPO / "train_configs" / "hybrid_cpu.toml"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*NODE_VARIABLES, "TITAN_MORPH_RUN_ID", "NGPU", "LOG_RANK")}
    return {**env, "VENV": sys.prefix, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}


# --------------------------------------------------------------------------------------------
# The torchrun command


def test_one_node_stays_standalone_whatever_else_is_set():
    for env in ({}, {"NNODES": "1"}, {"NNODES": "1", "NODE_RANK": "7", "MASTER_ADDR": "x", "RDZV_BACKEND": "etcd"}):
        nodes = nodes_from_env(env)
        assert nodes == Nodes() and not nodes.multi
        assert nodes.rendezvous_args() == ["--standalone"]
        assert nodes.shown_ranks("3", 4) == "3"


def test_static_rendezvous_from_torchrun_variables():
    env = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29600"}
    assert nodes_from_env(env).rendezvous_args() == [
        "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "static",
        "--master-addr", "10.0.0.1", "--master-port", "29600",
    ]  # fmt: skip
    del env["MASTER_PORT"]  # torchrun's default
    assert nodes_from_env(env).rendezvous_args()[-2:] == ["--master-port", "29500"]
    env = {"NNODES": "3", "NODE_RANK": "0", "RDZV_BACKEND": "static", "RDZV_ENDPOINT": "head:29400"}
    assert nodes_from_env(env).rendezvous_args() == [
        "--nnodes", "3", "--node-rank", "0", "--rdzv-backend", "static", "--rdzv-endpoint", "head:29400",
    ]  # fmt: skip


def test_c10d_rendezvous_from_an_endpoint():
    env = {"NNODES": "4", "RDZV_ENDPOINT": "head:29400", "RDZV_ID": "job 7", "NODE_RANK": "3", "MASTER_ADDR": "x"}
    nodes = nodes_from_env(env)
    assert nodes.rendezvous_args() == [
        "--nnodes", "4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29400", "--rdzv-id", "job 7",
    ]  # fmt: skip
    assert nodes.rank is None  # the rendezvous places the nodes
    assert nodes_from_env({"NNODES": "2", "RDZV_ENDPOINT": "[::1]"}).rendezvous_args()[-1] == "[::1]"


def test_every_node_derives_the_same_run_id():
    base = {"NNODES": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29600"}
    ids = {nodes_from_env({**base, "NODE_RANK": str(i)}).run_id(base) for i in (0, 1)}
    assert len(ids) == 1 and next(iter(ids)).endswith("-10.0.0.1-29600")
    slurm = {**base, "NODE_RANK": "0", "SLURM_JOB_ID": "4242"}
    assert nodes_from_env(slurm).run_id(slurm).endswith("-4242")
    c10d = {"NNODES": "2", "RDZV_ENDPOINT": "head:29400", "RDZV_ID": "exp/1"}
    assert nodes_from_env(c10d).run_id(c10d).endswith("-exp_1")


def test_each_node_shows_the_ranks_placed_on_it():
    static = {"NNODES": "2", "MASTER_ADDR": "h"}
    node0, node1 = (nodes_from_env({**static, "NODE_RANK": str(i)}) for i in (0, 1))
    assert node1.shown_ranks("3", 2) == "1" and node1.shown_text("1", 2) == "showing local rank(s) 1"
    assert node0.shown_ranks("3", 2) == "2" and node0.shown_text("2", 2) == "showing no rank here"
    assert node0.shown_ranks("0,1,3", 2) == "0,1" and node1.shown_ranks("0,1,3", 2) == "1"
    c10d = nodes_from_env({"NNODES": "2", "RDZV_ENDPOINT": "h"})
    assert c10d.shown_ranks("3", 2) == "1"


BAD_VARIABLES = {
    "nnodes-word": ({"NNODES": "two"}, "NNODES: 'two' is not a number of nodes (an integer >= 1)"),
    "nnodes-0": ({"NNODES": "0"}, "NNODES: '0' is not a number of nodes (an integer >= 1)"),
    "node-rank-2-of-2": (
        {"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "h"},
        "NODE_RANK: '2' is not a node rank of NNODES = 2 (an integer in 0..1)",
    ),
    "node-rank-missing": (
        {"NNODES": "2", "MASTER_ADDR": "h"},
        "NODE_RANK: not set; with NNODES = 2 each node needs its rank, 0..1",
    ),
    "master-addr-missing": (
        {"NNODES": "2", "NODE_RANK": "0"},
        "MASTER_ADDR: not set; with NNODES = 2 it names node 0's host (or set RDZV_ENDPOINT)",
    ),
    "master-port-word": (
        {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "http"},
        "MASTER_PORT: 'http' is not a port (an integer in 1..65535)",
    ),
    "backend": (
        {"NNODES": "2", "RDZV_ENDPOINT": "h:1", "RDZV_BACKEND": "etcd"},
        "RDZV_BACKEND: 'etcd' is not one of static, c10d",
    ),
    "c10d-no-endpoint": (
        {"NNODES": "2", "RDZV_BACKEND": "c10d", "MASTER_ADDR": "h"},
        "RDZV_ENDPOINT: not set; RDZV_BACKEND = c10d needs HOST[:PORT] of the rendezvous",
    ),
    "endpoint-port": (
        {"NNODES": "2", "RDZV_ENDPOINT": "h:99999"},
        "RDZV_ENDPOINT: 'h:99999' is not HOST or HOST:PORT (a port in 1..65535)",
    ),
}


@pytest.mark.parametrize("case", BAD_VARIABLES)
def test_bad_variables_are_one_error_naming_them(case):
    env, message = BAD_VARIABLES[case]
    with pytest.raises(ConfigError) as err:
        nodes_from_env(env)
    assert str(err.value) == message


def test_the_launcher_execs_torchrun_as_one_node(monkeypatch, capsys):
    """The whole check-and-exec path of ``./run_train.sh`` with NGPU=2 on node 1 of 2; the exec is
    caught to read the command it would run."""
    for name in (*NODE_VARIABLES, "TITAN_MORPH_RUN_ID", "LOG_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29611"}.items():
        monkeypatch.setenv(name, value)
    execs: list[list[str]] = []

    def fake_exec(path: str, argv: list[str]) -> None:
        execs.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", fake_exec)
    config = str(DEFAULT_CONFIG)
    with pytest.raises(SystemExit):
        launcher.main(["run", "--nproc", "2", config, "--training.steps", "3"])
    py = sys.executable
    assert execs == [
        [
            py, "-m", "titan_morph.launch", "supervise", "--",
            py, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "static",
            "--master-addr", "127.0.0.1", "--master-port", "29611", "--nproc-per-node=2", "--local-ranks-filter", "1",
            "-m", "titan_morph.train", "--job.config_file", config, "--training.steps", "3",
        ]
    ]  # fmt: skip
    assert os.environ["TITAN_MORPH_RUN_ID"].endswith("-127.0.0.1-29611")
    assert os.environ["LOG_RANK"] == "3"  # the job's loss rank, for TorchTitan's check on the ranks
    # LOG_RANK names ranks of the whole job; NNODES must split the config's ranks when NGPU is unset
    assert launcher.main(["run", "--log-rank", "4", config]) == 2
    monkeypatch.setenv("NNODES", "3")
    assert launcher.main(["run", config]) == 2
    assert capsys.readouterr().err.splitlines()[-2:] == [
        "error: LOG_RANK: '4' must name ranks of this job, 0..3, separated by commas",
        "error: NNODES: 3 nodes cannot share the config's 4 ranks equally: set NNODES to a divisor of 4, or NGPU"
        " (ranks per node) and the parallel degrees to match",
    ]
    assert len(execs) == 1


def test_nic_settings_must_name_interfaces_of_this_node():
    present = network_interfaces()
    assert present and "lo" in present  # Linux lists them in /sys/class/net
    check_interfaces(resolve_morph(Morph(data_ifname="lo", host_ifnames="lo")))
    check_interfaces(resolve_morph(Morph()), present=[])  # nothing named, nothing needed
    with pytest.raises(ConfigError) as err:
        check_interfaces(resolve_morph(Morph(data_ifname="eth0")), present=["lo", "ib0"])
    assert str(err.value).startswith("morph.data_ifname: 'eth0' is not a network interface of this node (")
    assert str(err.value).endswith("); it has ib0, lo") or str(err.value).endswith("); it has lo, ib0")
    with pytest.raises(ConfigError) as err:
        check_interfaces(resolve_morph(Morph(host_ifnames=" eth1")), present=["lo", "ib0"])
    assert str(err.value).startswith("morph.host_ifnames: 'eth1' is not a network interface")


# --------------------------------------------------------------------------------------------
# Real ./run_train.sh: bad input stops before any rank

TWO_NODES = {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
BAD_RUNS = {
    "node-rank-2": ({**TWO_NODES, "NODE_RANK": "2"}, [], "error: NODE_RANK: '2' is not a node rank of NNODES = 2"),
    "master-addr-missing": ({"NNODES": "2", "NODE_RANK": "1"}, [], "error: MASTER_ADDR: not set"),
    "nnodes-word": ({"NNODES": "2x"}, [], "error: NNODES: '2x' is not a number of nodes (an integer >= 1)"),
    "world-mismatch": (
        {**TWO_NODES, "NGPU": "3"},
        [],
        "error: NGPU: 3 ranks per node x NNODES 2 = 6 ranks, but the parallel degrees need 4 "
        "(pipeline_parallel_degree 4): set NGPU = 2",
    ),
    "data-ifname": ({}, ["--morph.data_ifname", "tm_nope0"], "error: morph.data_ifname: 'tm_nope0' is not a network"),
    "orchestrator": (
        {**TWO_NODES, "CONFIG_FILE": str(HYBRID)},
        [],
        "error: morph.orchestrator: 'pp' moves ranks by relaunching the job, which ./run_train.sh does on one node",
    ),
    "partition-auto": (
        TWO_NODES,
        ["--checkpoint.enable", "--morph.partition", "auto"],
        "error: morph.partition: 'auto' moves layers by relaunching the job, which ./run_train.sh does on one node",
    ),
}


@pytest.mark.parametrize("case", BAD_RUNS)
def test_the_launchers_check_refuses_bad_node_input_in_one_line(case, tmp_path, monkeypatch, capsys):
    """The same inputs through the launcher's check in this process (every case; one also end to end)."""
    variables, args, expected = BAD_RUNS[case]
    config = Path(variables.get("CONFIG_FILE", DEFAULT_CONFIG))
    dump = tmp_path / "run"
    code, lines = check_like_run_train(config, [*args, "--job.dump_folder", str(dump)], variables, monkeypatch, capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(expected), (code, lines)
    assert not dump.exists()


@pytest.mark.parametrize(
    "case", [c if c == "world-mismatch" else pytest.param(c, marks=pytest.mark.slow) for c in BAD_RUNS]
)
def test_bad_node_input_is_one_line_and_exit_2_before_any_rank(case, tmp_path):
    variables, args, expected = BAD_RUNS[case]
    dump = tmp_path / "run"
    result = subprocess.run(
        [str(REPO / "run_train.sh"), *args, "--job.dump_folder", str(dump)],
        cwd=REPO,
        env=_env(**{"CONFIG_FILE": str(DEFAULT_CONFIG), **variables}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[setup]")]
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
    if case == "data-ifname":
        assert lines[0].endswith(", ".join(network_interfaces() or [])), lines[0]
    assert result.stdout == "" and "torch.distributed.run" not in result.stderr
    assert not dump.exists(), "no rank may have started"


# --------------------------------------------------------------------------------------------
# A real two-node job on loopback


@pytest.mark.slow
def test_two_nodes_on_loopback_train_with_the_losses_of_one_node(tmp_path, one_node_losses):
    """Two ``./run_train.sh`` (NNODES=2, NODE_RANK=0/1, NGPU=2, static rendezvous on 127.0.0.1):
    4 ranks in all, the loss on node 1's local rank 1 (global rank 3), nothing left behind."""
    marker = f"nodes-test-{os.getpid()}-{time.monotonic_ns()}"
    port, dump, before = str(free_port()), tmp_path / "run", shm_segments()
    procs, logs = [], [tmp_path / "node0.log", tmp_path / "node1.log"]
    for rank, log in enumerate(logs):
        env = _env(
            CONFIG_FILE=str(DEFAULT_CONFIG), NNODES="2", NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port, NGPU="2", TMPDIR=str(tmp_path), **{MARKER_ENV: marker},
        )  # fmt: skip
        with open(log, "w") as out:
            procs.append(
                subprocess.Popen(
                    [str(REPO / "run_train.sh"), "--training.steps", "3", "--job.dump_folder", str(dump)],
                    cwd=REPO,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    try:
        codes = [proc.wait(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    out0, out1 = (log.read_text(errors="replace") for log in logs)
    assert codes == [0, 0], (codes, out0[-3000:], out1[-3000:])
    losses = {int(step): float(loss) for step, loss in LOSS_RE.findall(out1)}
    assert [losses.get(step) for step in (1, 2, 3)] == one_node_losses[:3], out1[-3000:]
    assert not LOSS_RE.search(out0) and "showing no rank here; node 0 of 2" in out0
    assert "loss is not visible" not in out1  # LOG_RANK names the job's loss rank for TorchTitan
    run_ids = [re.search(r"run id (\S+),", out).group(1) for out in (out0, out1)]  # type: ignore[union-attr]
    assert run_ids[0] == run_ids[1], run_ids
    deadline = time.monotonic() + 5
    while (left := marked_processes(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left behind: {left}"
    assert not [p for p in Path(tmp_path).iterdir() if p.name.startswith("torchelastic_")]
    assert not (shm_segments() - before) - segments_in_use()
