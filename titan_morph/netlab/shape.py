"""Live shaping and breaking of node-to-node paths with ``tc`` and routes.

A shaped path A -> B on a NIC is an htb class on A's NIC egress with a ``u32`` filter on B's
address, so each destination is shaped on its own and the rest of A's traffic stays unshaped
(htb's default class is left unset: unclassified packets go out directly). Class ``1:(16+B)``
with filter priority ``10+B`` belongs to destination B, which lets one path be changed or removed
without touching the others.

A broken path A <-> B on a NIC is a blackhole route to the peer's address in both namespaces:
connects fail and packets of open connections are dropped until :func:`heal`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from titan_morph.netlab.lab import NICS, Lab, LabError, ip

__all__ = ["Break", "Shape", "break_path", "breaks", "heal", "shape", "shapes", "unshape"]

_CLASS_RE = re.compile(r"class htb 1:([0-9a-f]+) .*?\brate (\S+)")


def _minor(dst: int) -> int:
    return 16 + dst


def _prio(dst: int) -> int:
    return 10 + dst


def _tc(lab: Lab, node: int, *args: str, check: bool = True) -> str:
    return ip("netns", "exec", lab.node(node), "tc", *args, check=check)


@dataclass(frozen=True)
class Shape:
    """Traffic from ``src`` to ``dst`` on ``nic`` is limited to ``rate`` (tc's spelling, e.g. 100Mbit)."""

    src: int
    dst: int
    nic: str
    rate: str


@dataclass(frozen=True)
class Break:
    """The path between ``a`` and ``b`` on ``nic`` is broken (seen from ``a``)."""

    a: int
    b: int
    nic: str


def _check_pair(lab: Lab, src: int, dst: int, nic: str) -> None:
    lab.check_node(src)
    lab.check_node(dst)
    if src == dst:
        raise LabError(f"nodes {src} and {dst}: a path joins two different nodes")
    if nic not in NICS:
        raise LabError(f"nic {nic!r}: one of {', '.join(NICS)}")


def shape(lab: Lab, src: int, dst: int, nic: str, rate_mbit: float, burst_kb: float = 0.0) -> None:
    """Limit traffic ``src`` -> ``dst`` on ``nic`` to ``rate_mbit`` (0 removes the limit); changes a
    limit in place, so an open connection keeps flowing."""
    _check_pair(lab, src, dst, nic)
    if rate_mbit < 0 or burst_kb < 0:
        raise LabError("rate and burst must be >= 0")
    if rate_mbit == 0:
        unshape(lab, src, dst, nic)
        return
    if "htb" not in _tc(lab, src, "qdisc", "show", "dev", nic, "root"):
        _tc(lab, src, "qdisc", "replace", "dev", nic, "root", "handle", "1:", "htb")
    classid = f"1:{_minor(dst):x}"
    rate = f"{rate_mbit:g}mbit"
    params = ["htb", "rate", rate, "ceil", rate]
    if burst_kb:
        params += ["burst", f"{burst_kb:g}kb", "cburst", f"{burst_kb:g}kb"]
    exists = _tc(lab, src, "class", "show", "dev", nic, "classid", classid).strip()
    _tc(lab, src, "class", "change" if exists else "add", "dev", nic, "parent", "1:", "classid", classid, *params)
    if not exists:
        _tc(
            lab, src, "filter", "add", "dev", nic, "parent", "1:", "protocol", "ip", "prio", str(_prio(dst)),
            "u32", "match", "ip", "dst", f"{lab.address(dst, nic)}/32", "flowid", classid,
        )  # fmt: skip


def unshape(lab: Lab, src: int, dst: int, nic: str) -> None:
    """Remove the limit on ``src`` -> ``dst`` on ``nic`` (nothing when there is none)."""
    _check_pair(lab, src, dst, nic)
    if "htb" not in _tc(lab, src, "qdisc", "show", "dev", nic, "root"):
        return
    _tc(lab, src, "filter", "del", "dev", nic, "parent", "1:", "prio", str(_prio(dst)), check=False)
    _tc(lab, src, "class", "del", "dev", nic, "classid", f"1:{_minor(dst):x}", check=False)
    if not _tc(lab, src, "class", "show", "dev", nic).strip():
        _tc(lab, src, "qdisc", "del", "dev", nic, "root", check=False)


def shapes(lab: Lab) -> list[Shape]:
    """Every limit in place now."""
    found = []
    for src in range(lab.nodes):
        for nic in NICS:
            for line in _tc(lab, src, "class", "show", "dev", nic, check=False).splitlines():
                m = _CLASS_RE.match(line)
                if m and 0 <= int(m.group(1), 16) - 16 < lab.nodes:
                    found.append(Shape(src, int(m.group(1), 16) - 16, nic, m.group(2)))
    return found


def break_path(lab: Lab, a: int, b: int, nic: str) -> None:
    """Break the path between ``a`` and ``b`` on ``nic``, both directions."""
    _check_pair(lab, a, b, nic)
    for x, y in ((a, b), (b, a)):
        ip("route", "replace", "blackhole", f"{lab.address(y, nic)}/32", netns=lab.node(x))


def heal(lab: Lab, a: int | None = None, b: int | None = None, nic: str | None = None) -> None:
    """Heal the path between ``a`` and ``b`` on ``nic``; every broken path when they are None."""
    for brk in breaks(lab):
        if (a is None or {brk.a, brk.b} == {a, b}) and (nic is None or brk.nic == nic):
            ip("route", "del", "blackhole", f"{lab.address(brk.b, brk.nic)}/32", netns=lab.node(brk.a), check=False)


def breaks(lab: Lab) -> list[Break]:
    """Every blackhole route to a lab address, as (node, peer, nic)."""
    found = []
    for a in range(lab.nodes):
        for line in ip("route", "show", "type", "blackhole", netns=lab.node(a)).splitlines():
            words = line.split()
            target = words[1].split("/")[0] if len(words) > 1 and words[0] == "blackhole" else ""
            where = lab.node_of(target)
            if where is not None:
                found.append(Break(a, where[0], where[1]))
    return found
