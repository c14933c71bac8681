"""``netlab run``: one training job across the nodes of a lab, as ``./run_train.sh`` runs it on one.

Order of work: the configuration check of ``./run_train.sh`` (for nodes x ranks-per-node ranks;
a bad value is one line and exit code 2, before any namespace exists), the lab, its initial
limits, then one torchrun agent per node inside its namespace, all under ``titan_morph.launch
supervise``, with one run id and so one run folder.

Which traffic uses which NIC: the rendezvous and the job's c10d store (``MASTER_ADDR``) are on
node 0's ``host`` address (``store_nic``); the job runs with ``--morph.data_ifname data
--morph.host_ifnames host`` unless its own arguments name them, so the per-link groups use
``data`` and the delegates, their store and the per-step exchange use ``host``; torch's own
groups (``GLOO_SOCKET_IFNAME``: TorchTitan's collectives, e.g. the grad-norm all-reduce across the
pipeline, which no failover covers) use ``host`` too, so a broken ``data`` path meets only the
pipeline's default path, which ``auto`` routes around. ``host2`` (a lab with two host NICs) carries
what a job names it for: the delegates do not yet move between host NICs.

The console shows the rank that logs the loss, as ``./run_train.sh`` does; every node's output
and per-rank logs go to ``RUN_FOLDER/netlab/``.

A failing node stops the others; Ctrl-C stops the job (twice: at once). Afterwards nothing is
left: every process in the lab's namespaces is stopped, the lab is removed, and the
``/dev/shm/titan_morph_*`` segments made during the run are deleted. The exit code is the job's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from titan_morph.comm.machine.system import SHM_DIR, die_with_parent, segments_in_use, shm_segments
from titan_morph.integration.supervisor import TRAIN_MODULE
from titan_morph.netlab.lab import NICS, Lab, LabError, ip, kill_namespace_processes
from titan_morph.netlab.schedule import Controller, Event, StepLog, apply, check_events, node_index

__all__ = [
    "DEFAULT_CONFIG",
    "MASTER_PORT",
    "NIC_BYTES_FILE",
    "RunOptions",
    "nic_bytes",
    "parse_shape_spec",
    "resolve_config",
    "run",
    "with_lab_nics",
]

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = "train_configs/debug_cpu.toml"
MASTER_PORT = 29500
NIC_BYTES_FILE = "nic_bytes.json"
"""In ``RUN_FOLDER/netlab/``: every node's bytes sent and received per NIC over the job."""
EXIT_BAD_CONFIG = 2
STOP_GRACE_S = 30.0
"""Seconds the other nodes get to stop (torchrun stops its ranks in order) before SIGKILL."""
JOBINFO_TIMEOUT_S = 300.0
POLL_S = 0.2


@dataclass
class RunOptions:
    nodes: int
    ranks_per_node: int
    train_args: list[str] = field(default_factory=list)
    shapes: list[Event] = field(default_factory=list)
    schedule: list[Event] = field(default_factory=list)
    prefix: str = "tmlab"
    timeout_s: float = 6 * 3600.0
    store_nic: str = "host"
    """The NIC of node 0 that serves the rendezvous and the job's c10d store (``MASTER_ADDR``)."""
    host_nics: int = 1
    """Host NICs per node (2: ``host2`` as well, for failover across host NICs)."""
    python: str = sys.executable
    keep_lab: bool = False
    """Run on the lab that is up (made by the caller, with no job's processes in it) and leave it up
    afterwards, its processes stopped: for several jobs on one lab (``netlab compare``)."""
    quiet: bool = False
    """The shown node's output goes to its log only, not to the console."""


def parse_shape_spec(spec: str) -> Event:
    """``A-B:NIC:RATE`` (traffic A -> B on NIC limited to RATE Mbit/s) as an event at time 0."""
    try:
        pair, nic, rate = spec.split(":")
        a, b = pair.split("-")
        if nic not in NICS or float(rate) < 0:
            raise ValueError
        return Event(0.0, node_index(a), node_index(b), nic, float(rate))
    except (ValueError, LabError):
        raise LabError(f"--shape {spec!r}: expected A-B:NIC:RATE, e.g. 0-1:data:100 (NIC one of {NICS})") from None


def with_lab_nics(train_args: list[str], lab: Lab) -> list[str]:
    """``train_args`` behind the lab's NIC options (``[morph] data_ifname = "data"``,
    ``host_ifnames = "host"``), each left out when ``train_args`` names it itself. ``lab``: the
    NICs must exist there (every lab has ``data`` and ``host``)."""
    given = {a[2:].split("=", 1)[0].replace("-", "_") for a in train_args if a.startswith("--")}
    defaults = {"morph.data_ifname": NICS[0], "morph.host_ifnames": lab.nics[1]}
    return [word for key, value in defaults.items() if key not in given for word in (f"--{key}", value)] + train_args


def resolve_config(env: dict[str, str] | None = None) -> str:
    """``$CONFIG_FILE`` (default :data:`DEFAULT_CONFIG`) as an absolute path: relative to the current
    folder, else to the repository, as ``./run_train.sh`` resolves it."""
    name = (os.environ if env is None else env).get("CONFIG_FILE") or DEFAULT_CONFIG
    for base in (Path.cwd(), REPO):
        path = base / name
        if path.is_file():
            return str(path.resolve())
    raise LabError(f"CONFIG_FILE: {name}: file not found")


def _job_info(opts: RunOptions, config_file: str) -> dict[str, object] | str:
    """The job's config check (``titan_morph.netlab.jobinfo``): its JSON, or its error line."""
    ranks = opts.nodes * opts.ranks_per_node
    train_args = with_lab_nics(opts.train_args, Lab(opts.nodes, opts.prefix, opts.host_nics))
    cmd = [opts.python, "-m", "titan_morph.netlab.jobinfo", str(ranks), config_file, *train_args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=JOBINFO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"error: the configuration check took more than {JOBINFO_TIMEOUT_S:.0f} s"
    if out.returncode != 0:
        lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")] or out.stderr.splitlines()[-1:]
        return lines[-1] if lines else f"error: the configuration check failed (exit code {out.returncode})"
    info: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return info


def _agent_command(opts: RunOptions, lab: Lab, i: int, info: dict[str, object], logs: Path) -> list[str]:
    loss_rank = int(str(info["loss_rank"]))
    shown = ["--local-ranks-filter", str(loss_rank % opts.ranks_per_node)]
    py = opts.python
    overrides = [str(a) for a in info["overrides"]] if isinstance(info["overrides"], list) else []
    return [
        "ip", "netns", "exec", lab.node(i), py, "-m", "titan_morph.launch", "supervise", "--",
        py, "-m", "torch.distributed.run",
        "--nnodes", str(opts.nodes), "--nproc-per-node", str(opts.ranks_per_node), "--node-rank", str(i),
        "--rdzv-backend", "static", "--master-addr", lab.address(0, opts.store_nic),
        "--master-port", str(MASTER_PORT), "--local-addr", lab.address(i, opts.store_nic),
        "--role", "rank", "--tee", "3", "--log-dir", str(logs / f"node{i}"),
        *(shown if i == loss_rank // opts.ranks_per_node else []),
        "-m", TRAIN_MODULE, "--job.config_file", str(info["config_file"]), *overrides,
    ]  # fmt: skip


def nic_bytes(lab: Lab) -> dict[str, dict[str, dict[str, int]]]:
    """Bytes each node's NICs sent and received so far (``{"node0": {"data": {"tx": .., "rx": ..}}}``;
    the counters start at 0 when the lab is made)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for i in range(lab.nodes):
        words = ip("netns", "exec", lab.node(i), "cat", *(
            f"/sys/class/net/{nic}/statistics/{way}_bytes" for nic in lab.nics for way in ("tx", "rx")
        )).split()  # fmt: skip
        counts = iter(int(w) for w in words)
        out[f"node{i}"] = {nic: {"tx": next(counts), "rx": next(counts)} for nic in lab.nics}
    return out


def _save_nic_bytes(lab: Lab, path: Path) -> None:
    """Which NIC carried how much of the job: saved next to the node logs and summed up on stderr."""
    try:
        counts = nic_bytes(lab)
    except (LabError, ValueError, StopIteration) as err:
        _say(f"NIC byte counters not read: {err}")
        return
    path.write_text(json.dumps(counts, indent=1) + "\n")
    sent = {nic: sum(node[nic]["tx"] for node in counts.values()) for nic in lab.nics}
    _say("bytes sent per NIC, all nodes: " + ", ".join(f"{nic} {n / 2**20:.1f} MiB" for nic, n in sent.items()))


def _pump(src: IO[bytes], copies: list[IO[bytes]]) -> None:
    """Copy the shown node's output to the console and its log, line by line, until it closes."""
    for line in iter(src.readline, b""):
        for dst in copies:
            with contextlib.suppress(OSError, ValueError):
                dst.write(line)
                dst.flush()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        with path.open("rb") as fh:
            return b"".join(deque(fh, lines)).decode(errors="replace")
    except OSError:
        return ""


def _remove_new_segments(before: set[str]) -> list[str]:
    stale = sorted(shm_segments() - before - segments_in_use())
    for name in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))
    return stale


def _say(text: str) -> None:
    print(f"netlab: {text}", file=sys.stderr, flush=True)


class _Signals:
    """Terminal signals, counted; the main loop acts on them (first: stop in order, second: kill)."""

    HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, object] = {}

    def _on(self, sig: int, _frame: FrameType | None) -> None:
        self.received.append(sig)

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._on) for sig in self.HANDLED}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def run(opts: RunOptions) -> int:
    """Run the job on a fresh lab (see the module docstring); returns the job's exit code."""
    if opts.nodes < 2:
        raise LabError(f"nodes: {opts.nodes}: a lab job needs 2..8 nodes")
    if opts.ranks_per_node < 1:
        raise LabError(f"ranks-per-node: {opts.ranks_per_node}: at least 1")
    lab = Lab(opts.nodes, opts.prefix, opts.host_nics)
    if opts.store_nic not in lab.nics:
        raise LabError(f"store-nic {opts.store_nic!r}: one of {', '.join(lab.nics)}")
    check_events(lab, [*opts.shapes, *opts.schedule])
    config_file = resolve_config()
    info = _job_info(opts, config_file)
    if isinstance(info, str):
        print(info, file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
    run_id = os.environ.get("TITAN_MORPH_RUN_ID") or f"netlab-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    dump = Path(str(info["dump_folder"]).replace("{run_id}", run_id))
    dump = dump if dump.is_absolute() else (REPO / dump).resolve()
    logs = dump / "netlab"
    logs.mkdir(parents=True, exist_ok=True)
    loss_rank = int(str(info["loss_rank"]))
    shown_node = loss_rank // opts.ranks_per_node
    _say(
        f"{opts.nodes} nodes x {opts.ranks_per_node} ranks, config {info['config_file']}, run id {run_id}, "
        f"showing rank {loss_rank} (node {shown_node}); node logs in {logs}"
    )
    env = dict(os.environ)
    env.update(TITAN_MORPH_RUN_ID=run_id, GLOO_SOCKET_IFNAME=NICS[1], TP_SOCKET_IFNAME=NICS[1])
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets for several ranks per host
    segments_before = shm_segments()
    agents: list[subprocess.Popen[bytes]] = []
    files: list[IO[bytes]] = []
    pump: threading.Thread | None = None
    controller: Controller | None = None
    try:
        if not opts.keep_lab:
            lab.up()
        for e in opts.shapes:
            apply(lab, e)
            _say(f"shaped {e.src}->{e.dst} on {e.nic}: {e.rate_mbit:g} mbit")
        with _Signals() as signals:
            for i in range(opts.nodes):
                log = (logs / f"node{i}.log").open("wb")
                files.append(log)
                proc = subprocess.Popen(
                    _agent_command(opts, lab, i, info, logs),
                    stdout=subprocess.PIPE if i == shown_node else log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=REPO,
                    start_new_session=True,  # Ctrl-C reaches netlab only, which stops the nodes in order
                    preexec_fn=die_with_parent,
                )
                agents.append(proc)
                if proc.stdout is not None:
                    copies = [log] if opts.quiet else [sys.stdout.buffer, log]
                    pump = threading.Thread(target=_pump, args=(proc.stdout, copies), daemon=True)
                    pump.start()
            if opts.schedule:
                progress = StepLog(logs / f"node{shown_node}.log")  # step=N rows: the loss lines
                controller = Controller(lab, opts.schedule, progress=progress).start()
            code = _wait(opts, lab, agents, signals, logs)
            _save_nic_bytes(lab, logs / NIC_BYTES_FILE)
        if pump is not None:
            pump.join(10.0)
        return code
    finally:
        if controller is not None:
            controller.stop()
        kill_namespace_processes(lab.namespaces)
        for proc in agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
        if not opts.keep_lab:
            lab.down()
        for fh in files:
            fh.close()
        _remove_new_segments(segments_before)
        _say(f"lab {opts.prefix} {'kept' if opts.keep_lab else 'removed'}; node logs in {logs}")


def _wait(opts: RunOptions, lab: Lab, agents: list[subprocess.Popen[bytes]], signals: _Signals, logs: Path) -> int:
    """Wait for every node; returns the job's exit code."""
    deadline = time.monotonic() + opts.timeout_s
    stop_at: float | None = None
    code = 0
    killed = False

    def stop(reason: str) -> float:
        _say(f"stopping every node: {reason}")
        for proc in agents:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)  # the supervisor passes it on to torchrun
        return time.monotonic() + STOP_GRACE_S

    while None in [p.poll() for p in agents]:  # every node polled: a failed one is seen at once
        now = time.monotonic()
        if signals.received and stop_at is None:
            code = 128 + signals.received[0]
            stop_at = stop(f"signal {signals.received[0]}")
        failed = [(i, p.returncode) for i, p in enumerate(agents) if p.returncode not in (None, 0)]
        if failed and stop_at is None:
            node, code = failed[0]
            _say(f"node {node} exited with code {code}; the end of its log ({logs / f'node{node}.log'}):")
            print(_tail(logs / f"node{node}.log"), file=sys.stderr, end="", flush=True)
            stop_at = stop(f"node {node} failed")
        if now > deadline and stop_at is None:
            code = 124
            stop_at = stop(f"the job ran past --timeout-s {opts.timeout_s:g}")
        if not killed and stop_at is not None and (now > stop_at or len(signals.received) > 1):
            kill_namespace_processes(lab.namespaces, grace_s=0.0)
            killed = True
        time.sleep(POLL_S)
    if stop_at is None:
        failed = [(i, p.returncode) for i, p in enumerate(agents) if p.returncode != 0]
        if failed:
            node, code = failed[0]
            _say(f"node {node} exited with code {code}; see {logs / f'node{node}.log'}")
    if code not in (0, 124) and not signals.received:
        errors = [(i, _last_error(logs / f"node{i}.log")) for i in range(len(agents))]
        for i, line in errors:
            if line:
                _say(f"node {i}: {line}")
    return code


_ERROR_RE = re.compile(r"\b((?:titan_morph\.[\w.]+\.)?\w*(?:Error|Timeout)\w*): (.+)$")


def _last_error(path: Path) -> str:
    """The last titan_morph error of a node's log, one line (its ranks' waits name rank, link and
    operation, so the nodes' lines together show which link broke and who waited on it)."""
    found = ""
    try:
        with path.open(errors="replace") as fh:
            for line in fh:
                m = _ERROR_RE.search(line)
                if m and m.group(1).startswith("titan_morph."):
                    found = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}"[:400]
    except OSError:
        return ""
    return found
