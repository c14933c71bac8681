"""Time a TCP transfer between two lab nodes: what a shaped or broken path does to a payload.

``measure(lab, src, dst, nic, nbytes)`` starts a receiver in ``dst``'s namespace and a sender in
``src``'s; the sender reports the seconds from its first byte to the receiver's one-byte
acknowledgement of the last. Both ends run as ``python -m titan_morph.netlab.transfer serve|send``
with bounded timeouts.
"""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import time

from titan_morph.netlab.lab import Lab, LabError

__all__ = ["PORT", "TransferError", "measure", "theory_s"]

PORT = 18_018
CHUNK = 1 << 16


class TransferError(LabError):
    """The transfer did not complete (the path is broken or too slow for the timeout)."""


def theory_s(nbytes: int, rate_mbit: float) -> float:
    """Seconds ``nbytes`` of payload take at ``rate_mbit`` (headers not counted)."""
    return nbytes * 8 / (rate_mbit * 1e6)


def _serve(addr: str, port: int, nbytes: int, timeout_s: float) -> None:
    with socket.create_server((addr, port)) as srv:
        srv.settimeout(timeout_s)
        print("ready", flush=True)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(timeout_s)
            got = 0
            while got < nbytes:
                data = conn.recv(CHUNK)
                if not data:
                    raise SystemExit(f"receiver: connection closed after {got} of {nbytes} bytes")
                got += len(data)
            conn.sendall(b"k")


def _send(addr: str, port: int, nbytes: int, timeout_s: float) -> None:
    payload = b"\x5a" * CHUNK
    with socket.create_connection((addr, port), timeout=timeout_s) as conn:
        conn.settimeout(timeout_s)
        start = time.perf_counter()
        left = nbytes
        while left:
            left -= conn.send(payload[: min(left, CHUNK)])
        if conn.recv(1) != b"k":
            raise SystemExit("sender: no acknowledgement")
        print(f"{time.perf_counter() - start:.6f}", flush=True)


def measure(lab: Lab, src: int, dst: int, nic: str, nbytes: int, timeout_s: float = 20.0) -> float:
    """Seconds to send ``nbytes`` from ``src`` to ``dst`` over ``nic``; :class:`TransferError` when the
    transfer fails (a connect error or a timeout: a broken path)."""
    addr = lab.address(dst, nic)
    args = [addr, str(PORT), str(nbytes), str(timeout_s)]
    me = [sys.executable, "-m", "titan_morph.netlab.transfer"]
    server = subprocess.Popen(
        ["ip", "netns", "exec", lab.node(dst), *me, "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], timeout_s)
        if not ready or server.stdout.readline().strip() != "ready":
            server.kill()
            why = server.stderr.read().strip() if server.stderr else ""
            raise TransferError(f"receiver on node {dst} did not start: {why or 'no answer'}")
        try:
            out = subprocess.run(
                ["ip", "netns", "exec", lab.node(src), *me, "send", *args],
                capture_output=True,
                text=True,
                timeout=timeout_s + 5,
            )
        except subprocess.TimeoutExpired:
            raise TransferError(f"{src} -> {dst} on {nic}: no transfer within {timeout_s} s") from None
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["?"])[-1]
            raise TransferError(f"{src} -> {dst} on {nic}: {last}")
        return float(out.stdout.strip())
    finally:
        server.kill()
        server.wait(timeout=5)
        for stream in (server.stdout, server.stderr):
            if stream is not None:
                stream.close()


def main(argv: list[str]) -> int:
    role, addr, port, nbytes, timeout_s = argv
    (_serve if role == "serve" else _send)(addr, int(port), int(nbytes), float(timeout_s))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
