"""A lab: K network namespaces as nodes on one machine, each with the same NICs.

Layout (every object is named with the lab's prefix, ``tmlab`` by default):

* ``PREFIX-sw``: a namespace holding one bridge per NIC (``PREFIX-data``, ``PREFIX-host``...) and
  the switch end of every veth (``PREFIX-nI-data``, ``PREFIX-nI-host``, ``PREFIX-nI-hst2``).
  Nothing is made in the root namespace, so deleting the lab's namespaces removes every link and
  bridge with them.
* ``PREFIX-nI`` (I = 0..K-1): a node with loopback up and NICs named alike on every node:
  ``data`` (198.18.1.(10+I)/24, the pipeline's default path), ``host`` (198.18.2.(10+I)/24,
  delegates and control plane) and, with ``host_nics = 2``, ``host2`` (198.18.3.(10+I)/24, a
  second host NIC on its own bridge, to show failover across host NICs, paper §5.3).
  Addresses come from 198.18.0.0/15 (benchmarking range) only.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass

__all__ = [
    "DEFAULT_PREFIX",
    "NICS",
    "Lab",
    "LabError",
    "can_make_namespaces",
    "down",
    "ip",
    "kill_namespace_processes",
    "lab_namespaces",
    "namespace_pids",
]

DEFAULT_PREFIX = "tmlab"
NICS = ("data", "host", "host2")
"""Every NIC a lab node can have (``host2`` only in a lab made with ``host_nics = 2``)."""
SUBNETS = {"data": "198.18.1.0/24", "host": "198.18.2.0/24", "host2": "198.18.3.0/24"}
_PORT = {"data": "data", "host": "host", "host2": "hst2"}  # switch-side veth suffix (15-character names)
MAX_HOST_NICS = 2
LAB_RANGE = ipaddress.ip_network("198.18.0.0/15")
MAX_NODES = 8
COMMAND_TIMEOUT_S = 20.0
STOP_GRACE_S = 5.0
_PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,6}")  # "PREFIX-nI-data" must fit a 15-character interface name


GSO_MAX_BYTES = 1514
"""Largest segment a node's NIC hands to its queue (one Ethernet frame): see :meth:`Lab.up`."""


class LabError(RuntimeError):
    """A lab command failed or was asked something impossible (one line for the user)."""


def ip(*args: str, check: bool = True, netns: str | None = None) -> str:
    """Run ``ip [-n NETNS] ARGS`` (bounded); returns stdout, raises :class:`LabError` on failure."""
    return _run(["ip", *(("-n", netns) if netns else ()), *args], check=check)


def _run(cmd: list[str], check: bool = True) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise LabError(f"{' '.join(cmd)}: {err}") from None
    if check and out.returncode != 0:
        raise LabError(f"{' '.join(cmd)}: {out.stderr.strip() or f'exit code {out.returncode}'}")
    return out.stdout


def can_make_namespaces() -> str:
    """Empty when this process can make network namespaces, else why not (one line)."""
    if os.geteuid() != 0:
        return "netlab needs root (network namespaces, veths, tc)"
    for tool in ("ip", "tc"):
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep)):
            return f"netlab needs the {tool!r} command (iproute2)"
    probe = f"tmprobe{os.getpid() % 100000}"
    try:
        ip("netns", "add", probe)
    except LabError as err:
        return f"cannot make a network namespace: {err}"
    ip("netns", "del", probe, check=False)
    return ""


def lab_namespaces(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The namespaces of lab ``prefix`` that exist now (nodes and switch)."""
    names = [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]
    return sorted(n for n in names if re.fullmatch(rf"{re.escape(prefix)}-(sw|n\d+)", n))


def namespace_pids(netns: str) -> list[int]:
    """The processes living in ``netns`` now."""
    return [int(p) for p in ip("netns", "pids", netns, check=False).split() if p.isdigit()]


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_namespace_processes(namespaces: list[str], grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM every process in ``namespaces``, SIGKILL what is left after ``grace_s``; returns the
    pids that were found."""
    found = [pid for ns in namespaces for pid in namespace_pids(ns)]
    if not found:
        return []
    _signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(namespace_pids(ns) for ns in namespaces):
        time.sleep(0.1)
    for sig_round in range(3):  # a process forked meanwhile gets its SIGKILL on the next round
        left = [pid for ns in namespaces for pid in namespace_pids(ns)]
        if not left:
            break
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.2 * (sig_round + 1))
    return found


@dataclass(frozen=True)
class Lab:
    """The names and addresses of a lab of ``nodes`` nodes with ``host_nics`` host NICs each
    (``host``, then ``host2``); :meth:`up` makes it, :meth:`down` removes it."""

    nodes: int
    prefix: str = DEFAULT_PREFIX
    host_nics: int = 1

    def __post_init__(self) -> None:
        if not _PREFIX_RE.fullmatch(self.prefix):
            raise LabError(f"prefix {self.prefix!r}: 1-7 lowercase letters or digits, starting with a letter")
        if not 1 <= self.nodes <= MAX_NODES:
            raise LabError(f"nodes: {self.nodes} is not in 1..{MAX_NODES}")
        if not 1 <= self.host_nics <= MAX_HOST_NICS:
            raise LabError(f"host-nics: {self.host_nics} is not in 1..{MAX_HOST_NICS}")

    @classmethod
    def existing(cls, prefix: str = DEFAULT_PREFIX) -> Lab:
        """The lab ``prefix`` that is up now (:class:`LabError` when none is)."""
        nodes = [n for n in lab_namespaces(prefix) if not n.endswith("-sw")]
        if not nodes:
            raise LabError(f"no lab {prefix!r} is up (python -m titan_morph.netlab up --nodes K)")
        bridges = ip("-o", "link", "show", "type", "bridge", netns=f"{prefix}-sw", check=False)
        host_nics = 2 if f" {prefix}-host2:" in bridges or f" {prefix}-host2@" in bridges else 1
        return cls(len(nodes), prefix, host_nics)

    @property
    def nics(self) -> tuple[str, ...]:
        """This lab's NICs, on every node."""
        return NICS[: 1 + self.host_nics]

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def node(self, i: int) -> str:
        """The namespace of node ``i``."""
        self.check_node(i)
        return f"{self.prefix}-n{i}"

    def check_node(self, i: int) -> None:
        if not 0 <= i < self.nodes:
            raise LabError(f"node {i}: this lab has nodes 0..{self.nodes - 1}")

    def address(self, i: int, nic: str) -> str:
        """Node ``i``'s address on ``nic`` (no prefix length)."""
        if nic not in self.nics:
            raise LabError(f"nic {nic!r}: one of {', '.join(self.nics)} in this lab")
        self.check_node(i)
        addr = ipaddress.ip_network(SUBNETS[nic])[10 + i]
        assert addr in LAB_RANGE
        return str(addr)

    def node_of(self, address: str) -> tuple[int, str] | None:
        """(node, nic) of a lab address, None for another address."""
        for nic in self.nics:
            for i in range(self.nodes):
                if self.address(i, nic) == address:
                    return i, nic
        return None

    @property
    def namespaces(self) -> list[str]:
        return [self.switch, *(self.node(i) for i in range(self.nodes))]

    def up(self) -> None:
        """Make the lab, after removing whatever a crashed run of the same prefix left."""
        down(self.prefix)
        try:
            for ns in self.namespaces:
                ip("netns", "add", ns)
                ip("link", "set", "lo", "up", netns=ns)
                _quiet_ipv6(ns)
            for nic in self.nics:
                bridge = f"{self.prefix}-{nic}"
                ip("link", "add", bridge, "type", "bridge", netns=self.switch)
                ip("link", "set", bridge, "up", netns=self.switch)
                for i in range(self.nodes):
                    port = f"{self.prefix}-n{i}-{_PORT[nic]}"
                    node = self.node(i)
                    ip("link", "add", port, "type", "veth", "peer", "name", nic, "netns", node, netns=self.switch)
                    ip("link", "set", port, "master", bridge, netns=self.switch)
                    ip("link", "set", port, "up", netns=self.switch)
                    ip("addr", "add", f"{self.address(i, nic)}/24", "dev", nic, netns=node)
                    # one frame per segment: htb/tbf pass a whole (64 KiB) segment on credit, so a
                    # message spaced out by compute would cross at line rate and a limit would only
                    # hold on average (measured: runs faster than size / rate allows)
                    ip("link", "set", "dev", nic, "gso_max_size", str(GSO_MAX_BYTES), netns=node)
                    ip("link", "set", nic, "up", netns=node)
        except BaseException:
            down(self.prefix)
            raise

    def down(self) -> None:
        down(self.prefix)


def _quiet_ipv6(ns: str) -> None:
    """No IPv6 in the lab: no router solicitations or duplicate-address probes on the bridges."""
    _run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"], check=False)
    _run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"], check=False)


def down(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Remove lab ``prefix``: stop every process in its namespaces, then delete them (their veths and
    bridges go with them). Returns the namespaces removed."""
    namespaces = lab_namespaces(prefix)
    kill_namespace_processes(namespaces)
    for ns in namespaces:
        ip("netns", "del", ns, check=False)
    left = lab_namespaces(prefix)
    if left:
        raise LabError(f"could not remove namespaces {', '.join(left)}")
    return namespaces
