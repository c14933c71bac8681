"""The lab itself: nodes come and go without a trace, shaped paths run at their rate, broken paths
fail and heal."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.netlab.conftest import PREFIX
from titan_morph.netlab.lab import Lab, LabError, down, ip, lab_namespaces, namespace_pids
from titan_morph.netlab.schedule import Controller, parse_schedule
from titan_morph.netlab.shape import Break, break_path, breaks, heal, shape, shapes, unshape
from titan_morph.netlab.transfer import TransferError, measure, theory_s

pytestmark = pytest.mark.netlab

PAYLOAD = 4 * 2**20
FASTER = 0.25  # a shaped path may beat its rate by its burst bucket, no more
SLOWER = 1.0  # headers (~5 %) and a busy host only ever slow a transfer down


def best_of_two(lab: Lab, src: int, dst: int, nic: str) -> float:
    """The faster of two timed transfers: load on the host only adds time, so the minimum is what
    the path allows."""
    return min(measure(lab, src, dst, nic, PAYLOAD) for _ in range(2))


def assert_at_rate(took: float, rate_mbit: float) -> None:
    theory = theory_s(PAYLOAD, rate_mbit)
    assert (1 - FASTER) * theory <= took <= (1 + SLOWER) * theory, (rate_mbit, took, theory)


def _root_links() -> str:
    return ip("-br", "link")


def _everything_named(prefix: str) -> list[str]:
    found = [ns for ns in ip("netns", "list").split() if ns.startswith(prefix)]
    found += [line.split()[0] for line in _root_links().splitlines() if prefix in line]
    return found


def test_up_makes_nodes_with_two_nics_and_down_leaves_nothing(namespaces_ok: None):
    lab = Lab(3, PREFIX)
    lab.up()
    try:
        assert lab_namespaces(PREFIX) == sorted([f"{PREFIX}-sw", f"{PREFIX}-n0", f"{PREFIX}-n1", f"{PREFIX}-n2"])
        for i in range(3):
            addrs = ip("-br", "addr", netns=lab.node(i))
            assert f"{lab.address(i, 'data')}/24" in addrs and f"{lab.address(i, 'host')}/24" in addrs
            assert "UNKNOWN" in ip("-br", "link", "show", "lo", netns=lab.node(i))  # loopback up
        bridges = ip("-br", "link", "show", "type", "bridge", netns=lab.switch)
        assert f"{PREFIX}-data" in bridges and f"{PREFIX}-host" in bridges
        assert not any(PREFIX in line for line in _root_links().splitlines())  # nothing in the root namespace
        sleeper = subprocess.Popen(["ip", "netns", "exec", lab.node(1), "sleep", "60"])
        deadline = time.monotonic() + 10
        while not namespace_pids(lab.node(1)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert namespace_pids(lab.node(1))
        Lab(2, PREFIX).up()  # up removes what was there, processes included
        assert sleeper.wait(timeout=10) != 0
        assert lab_namespaces(PREFIX) == sorted([f"{PREFIX}-sw", f"{PREFIX}-n0", f"{PREFIX}-n1"])
    finally:
        down(PREFIX)
    assert _everything_named(PREFIX) == []
    assert lab_namespaces(PREFIX) == []


def test_lab_names_are_checked():
    with pytest.raises(LabError, match="prefix"):
        Lab(2, "a-much-too-long-prefix")
    with pytest.raises(LabError, match="nodes"):
        Lab(9)
    with pytest.raises(LabError, match="nic"):
        Lab(2).address(0, "eth0")
    assert Lab(8).address(7, "data") == "198.18.1.17" and Lab(8).address(0, "host") == "198.18.2.10"


def test_a_shaped_path_delays_a_payload_as_its_rate_predicts(lab3: Lab):
    unshaped = measure(lab3, 0, 1, "data", PAYLOAD)
    shape(lab3, 0, 1, "data", 100)
    shape(lab3, 0, 2, "data", 50)  # a second destination, shaped on its own
    limits = {(s.src, s.dst, s.nic, s.rate) for s in shapes(lab3)}
    assert limits == {(0, 1, "data", "100Mbit"), (0, 2, "data", "50Mbit")}
    for dst, rate in ((1, 100), (2, 50)):
        assert_at_rate(best_of_two(lab3, 0, dst, "data"), rate)
    assert best_of_two(lab3, 1, 0, "data") < theory_s(PAYLOAD, 100) / 2  # the other direction is free
    assert best_of_two(lab3, 0, 1, "host") < theory_s(PAYLOAD, 100) / 2  # and so is the other NIC
    shape(lab3, 0, 1, "data", 200)  # changed in place
    assert_at_rate(best_of_two(lab3, 0, 1, "data"), 200)
    unshape(lab3, 0, 1, "data")
    shape(lab3, 0, 2, "data", 0)
    assert shapes(lab3) == []
    assert measure(lab3, 0, 1, "data", PAYLOAD) < max(10 * unshaped, theory_s(PAYLOAD, 100) / 2)


def test_break_fails_the_path_both_ways_and_heal_restores_it(lab3: Lab):
    break_path(lab3, 0, 2, "data")
    assert set(breaks(lab3)) == {Break(0, 2, "data"), Break(2, 0, "data")}
    for src, dst in ((0, 2), (2, 0)):
        with pytest.raises(TransferError):
            measure(lab3, src, dst, "data", 2**16, timeout_s=3)
    assert measure(lab3, 0, 2, "host", 2**16) < 2  # the other NIC still works
    assert measure(lab3, 0, 1, "data", 2**16) < 2  # and so does the other peer
    heal(lab3, 2, 0, "data")
    assert breaks(lab3) == []
    assert measure(lab3, 0, 2, "data", 2**16) < 2


def test_a_schedule_comes_and_goes_during_a_run(lab3: Lab):
    events = parse_schedule("time_s,from,to,nic,rate_mbit\n0,0,1,data,100\n0.8,n1,n2,host,break\n1.6,0,1,data,0\n")
    controller = Controller(lab3, events, log=sys.stdout).start()
    deadline = time.monotonic() + 0.7
    while time.monotonic() < deadline and not shapes(lab3):
        time.sleep(0.02)
    assert [(s.src, s.dst) for s in shapes(lab3)] == [(0, 1)]
    assert controller.wait(10)
    assert controller.applied == events
    assert shapes(lab3) == [] and {(b.a, b.b) for b in breaks(lab3)} == {(1, 2), (2, 1)}


def test_the_command_line_shapes_breaks_and_reports(lab3: Lab):
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "titan_morph.netlab", args[0], "--prefix", PREFIX, *args[1:]]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    assert cli("shape", "--from", "0", "--to", "n2", "--nic", "host", "--rate-mbit", "30").returncode == 0
    assert cli("break", "--nodes", "1,2", "--nic", "data").returncode == 0
    status = cli("status").stdout
    assert "0 -> 2 on host: 30Mbit" in status and "1 <-> 2 on data" in status and "198.18.2.12/24" in status
    bad = cli("shape", "--from", "0", "--to", "5", "--nic", "data", "--rate-mbit", "1")
    assert bad.returncode == 2 and bad.stderr.startswith("error: node 5") and len(bad.stderr.splitlines()) == 1
    assert cli("heal").returncode == 0 and cli("unshape", "--from", "0", "--to", "2", "--nic", "host").returncode == 0
    assert "limits: none" in cli("status").stdout
    assert cli("down").returncode == 0 and lab_namespaces(PREFIX) == []


def test_a_second_host_nic_has_its_own_bridge_and_breaks_alone(namespaces_ok: None):
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "titan_morph.netlab", args[0], "--prefix", PREFIX, *args[1:]]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    try:
        up = cli("up", "--nodes", "2", "--host-nics", "2")
        assert up.returncode == 0, up.stderr
        lab = Lab.existing(PREFIX)
        assert lab.host_nics == 2 and lab.nics == ("data", "host", "host2")
        for i in range(2):
            assert f"{lab.address(i, 'host2')}/24" in ip("-br", "addr", "show", "host2", netns=lab.node(i))
        assert lab.address(1, "host2") == "198.18.3.11" and "198.18.3.11/24" in cli("status").stdout
        assert f"{PREFIX}-host2" in ip("-br", "link", "show", "type", "bridge", netns=lab.switch)
        assert cli("break", "--nodes", "0,1", "--nic", "host2").returncode == 0
        assert set(breaks(lab)) == {Break(0, 1, "host2"), Break(1, 0, "host2")}
        with pytest.raises(TransferError):
            measure(lab, 0, 1, "host2", 2**16, timeout_s=3)
        assert measure(lab, 0, 1, "host", 2**16) < 2  # the first host NIC is another path
        assert cli("heal", "--nic", "host2").returncode == 0 and breaks(lab) == []
        assert measure(lab, 1, 0, "host2", 2**16) < 2
        cli("down")
        assert cli("up", "--nodes", "2").returncode == 0 and Lab.existing(PREFIX).nics == ("data", "host")
        bad = cli("break", "--nodes", "0,1", "--nic", "host2")  # this lab has no host2
        assert bad.returncode == 2 and bad.stderr.startswith("error: nic 'host2'") and len(bad.stderr.splitlines()) == 1
        assert cli("up", "--nodes", "2", "--host-nics", "3").returncode == 2
    finally:
        down(PREFIX)
    assert lab_namespaces(PREFIX) == []
