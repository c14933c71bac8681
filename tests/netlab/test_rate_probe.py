"""A rate probe on a real kernel-shaped link: the monitor reads the rate TCP's payload gets, from the
probe's own timings, where the pipeline's spaced messages could not tell rate from latency."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from titan_morph.comm.recorded import ProbeTimes
from titan_morph.monitor.delays import estimate_links
from titan_morph.monitor.profile import StepProfile
from titan_morph.netlab.lab import NICS, Lab
from titan_morph.netlab.shape import shape
from titan_morph.runtime.exchange import probe_stamps

pytestmark = pytest.mark.netlab

MESSAGE = 64 * 1024
PAYLOAD_SHARE = 1448 / 1514  # TCP payload per full frame (the lab caps segments at one frame)


def _probe(lab: Lab, port: int) -> list[StepProfile]:
    """Both sides' stamps of one train each way between nodes 0 and 1, as two stages' profiles."""
    store = lab.address(0, "data")
    env = {"GLOO_SOCKET_IFNAME": NICS[0], "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    procs = [
        subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                lab.node(rank),
                "env",
                *[f"{k}={v}" for k, v in env.items()],
                sys.executable,
                "-m",
                "tests.netlab.probe_pair",
                str(rank),
                store,
                str(port),
                str(MESSAGE),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    profiles = []
    for stage, proc in enumerate(procs):
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err[-2000:]
        prof = StepProfile(stage, 0, 0.0, 0.0)
        for times in json.loads(out.strip().splitlines()[-1]):
            prof.messages += probe_stamps(
                ProbeTimes(**{k: tuple(v) if isinstance(v, list) else v for k, v in times.items()})
            )
        profiles.append(prof)
    return profiles


def test_a_probe_reads_a_limited_links_rate_both_ways(lab3: Lab) -> None:
    for src, dst in ((0, 1), (1, 0)):
        shape(lab3, src, dst, "data", 20)
    # a train whose stamps a starved host spread out can read as no rate (one did with a busy loop per core): up to
    # three trains, the first that names a rate both ways is judged (a wrong rate still fails)
    tried = []
    for port in (29_510, 29_511, 29_512):
        (est,) = estimate_links(_probe(lab3, port), 2)
        assert est.exact == [] and est.bounds == []  # a probe is no delay sample of the pipeline
        wires = [est.wires[("rate-probe", direction)] for direction in ("fwd", "bwd")]
        tried.append(wires)
        if all(w.identified and w.bandwidth_mbps is not None for w in wires):
            break
    else:
        raise AssertionError(f"no train of three named the rate both ways: {tried}")
    expected = 20 * PAYLOAD_SHARE
    for wire in wires:
        assert wire.bandwidth_mbps is not None
        assert abs(wire.bandwidth_mbps - expected) <= 0.1 * expected, (wire.bandwidth_mbps, expected)


def test_on_an_unlimited_link_a_probe_finds_no_rate_near_a_limit(lab3: Lab) -> None:
    (est,) = estimate_links(_probe(lab3, 29_520), 2)
    for direction in ("fwd", "bwd"):
        wire = est.wires.get(("rate-probe", direction))
        if wire is not None and wire.bandwidth_mbps is not None:
            assert wire.bandwidth_mbps > 200, (direction, wire)
