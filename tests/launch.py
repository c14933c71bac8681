"""The one place tests start real multi-rank work: bounded in time, nothing left behind.

* :func:`run_ranks` -- a function on N real gloo ranks (processes forked from a clean server, free-port TCP
  rendezvous); each rank's return value comes back through a pickle file, a rank's exception fails
  the run with its traceback, and on timeout every rank is killed.
* :func:`torchrun` / :func:`launch` -- a real ``torchrun`` training (or ``run_train.sh``) in its own
  process group, killed on timeout; :class:`RunResult` reads its TensorBoard events back with the
  library's own reader (``titan_morph.compare.results``);
* :func:`supervise_script` -- a Python script under the launcher's supervisor (relaunch requests);
* :func:`check_like_run_train` -- the launcher's check of bad input, in this process.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from titan_morph.comm.machine.system import cmdline, pids, state

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "train_configs" / "debug_cpu.toml"
LOSS_TAG = "loss_metrics/global_avg_loss"
GRAD_NORM_TAG = "grad_norm"
TPS_TAG = "throughput(tps)"
PG_TIMEOUT_S = 15.0


def free_port() -> int:
    """A TCP port on localhost that was free a moment ago (for a gloo/torchrun rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live processes (pid, cmdline) whose command line contains ``text`` (e.g. a run's dump folder)."""
    found = []
    for pid in pids():
        cmd = cmdline(pid) if pid != os.getpid() else None
        if cmd is None or state(pid) in ("", "Z"):
            continue  # gone, or a zombie that already exited
        if text in cmd:
            found.append((pid, cmd))
    return found


# ------------------------------------------------------------------ functions on N gloo ranks


def _entry(
    rank: int,
    world: int,
    port: int,
    out: str,
    fn: Callable[..., Any],
    args: tuple,
    pg_timeout_s: float,
    env: dict[str, str],
) -> None:
    os.environ.clear()  # the caller's environment now, not the fork server's at its start
    os.environ.update(env)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import faulthandler

    faulthandler.enable()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=pg_timeout_s),
    )
    try:
        result = fn(rank, world, *args)
        Path(out, f"{rank}.pkl").write_bytes(pickle.dumps(("ok", result)))
    except BaseException:
        Path(out, f"{rank}.pkl").write_bytes(pickle.dumps(("error", traceback.format_exc())))
        raise
    finally:
        import gc

        gc.collect()  # nothing holding gloo work may survive into interpreter finalization
        dist.destroy_process_group()
    # The result is on disk and the group is gone. Skip interpreter finalization: a rare race
    # between gloo's threads and interpreter teardown aborts there ("terminate called without an
    # active exception") after all work succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


RANK_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.pipelining",
    "tests.launch",
    "titan_morph.comm",
    "titan_morph.runtime",
)
"""What every rank of :func:`run_ranks` imports: loaded once, in the fork server."""


def _start_method() -> str:
    """``forkserver`` with :data:`RANK_PRELOAD` loaded in the server: each rank is a fork of a clean
    process that never ran a test, as with ``spawn``, without importing torch again (1-3 s of CPU per
    rank, most of a short test's time on 2 cores). The server starts with the first call; the
    caller's environment travels with each call (:func:`_entry`)."""
    import multiprocessing

    multiprocessing.set_forkserver_preload(list(RANK_PRELOAD))
    return "forkserver"


def run_ranks(
    fn: Callable[..., Any], world: int, *args: Any, timeout: float = 60.0, pg_timeout_s: float = PG_TIMEOUT_S
) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` gloo ranks (process group initialised); the per-rank results.

    ``fn`` must be importable by the rank processes (a module-level function of a test module).
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="titan_morph_ranks_") as out:
        ctx = mp.start_processes(
            _entry,
            args=(world, free_port(), out, fn, args, pg_timeout_s, dict(os.environ)),
            nprocs=world,
            join=False,
            start_method=_start_method(),
        )
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=0.2):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{fn.__name__} on {world} ranks did not finish within {timeout} s")
        except Exception as e:
            details = []
            for r in range(world):
                p = Path(out, f"{r}.pkl")
                if p.exists():
                    status, val = pickle.loads(p.read_bytes())
                    details.append(f"--- rank {r} ---\n{val}" if status == "error" else f"--- rank {r}: fn returned")
            raise AssertionError(f"{e}\n" + "\n".join(details)) from e
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join(5)
            assert all(not p.is_alive() for p in ctx.processes), "rank processes left running"
        results = []
        for r in range(world):
            status, val = pickle.loads(Path(out, f"{r}.pkl").read_bytes())
            assert status == "ok", val
            results.append(val)
        return results


# ------------------------------------------------------------------ torchrun trainings


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "VENV": sys.prefix}
    env.pop("TITAN_MORPH_RUN_ID", None)
    env.update(extra or {})
    return env


@dataclass
class RunResult:
    """A finished launch: exit code, combined output, its dump folder and wall time."""

    returncode: int
    output: str
    dump_folder: Path
    seconds: float

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-n:])

    def tb_dirs(self) -> list[str]:
        return sorted(glob.glob(str(self.dump_folder / "tb" / "*")))

    def scalars(self, tag: str) -> dict[int, float]:
        """Scalar ``tag`` per step, read back from the run's TensorBoard event files."""
        from titan_morph.compare.results import read_scalars

        return read_scalars(self.dump_folder).get(tag, {})

    def image_steps(self, tag: str) -> list[int]:
        """Steps at which image ``tag`` was logged."""
        from titan_morph.compare.results import read_images

        return read_images(self.dump_folder).get(tag, [])

    def losses(self) -> dict[int, float]:
        return self.scalars(LOSS_TAG)


def assert_same_training(got: RunResult, ref: RunResult, what: str, steps: int) -> None:
    """Per step 1..``steps``, the loss and the grad norm of ``got`` equal ``ref``'s (rel 1e-5): the
    same gradients, whatever plans, paths or splits ``got`` ran."""
    import pytest

    for tag in (LOSS_TAG, GRAD_NORM_TAG):
        want, have = ref.scalars(tag), got.scalars(tag)
        assert sorted(want) == sorted(have) == list(range(1, steps + 1)), f"{what}: {tag} per step: {have}"
        for step, value in want.items():
            assert have[step] == pytest.approx(value, rel=1e-5), f"{what}, step {step}: {tag} {have[step]} vs {value}"


def launch(
    cmd: list[str], dump_folder: Path, *, timeout_s: float = 240, env: dict[str, str] | None = None
) -> RunResult:
    """Run ``cmd`` (a torchrun or run_train.sh command) in its own process group; kill it on timeout."""
    import pytest

    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=_child_env(env),
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout_s} s; last output:\n" + out[-6000:])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return RunResult(proc.returncode, out, dump_folder, time.monotonic() - start)


def torchrun(
    nproc: int,
    dump_folder: Path,
    *overrides: str,
    config: Path = DEFAULT_CONFIG,
    timeout_s: float = 240,
    env: dict[str, str] | None = None,
) -> RunResult:
    """``torchrun --standalone`` (free rendezvous port) of ``python -m titan_morph.train`` on ``nproc`` ranks."""
    from titan_morph.integration.supervisor import torchrun_command

    overrides = ("--parallelism.pipeline_parallel_degree", str(nproc), *overrides)
    cmd = torchrun_command(config, dump_folder, nproc, overrides)
    return launch(cmd, dump_folder, timeout_s=timeout_s, env=env)


def supervise_script(
    folder: Path, script: str, names: tuple[str, ...], timeout_s: float = 60
) -> tuple[subprocess.CompletedProcess[str], list[list[str | None]]]:
    """Run ``script`` (Python source) under ``python -m titan_morph.launch supervise``; the script gets
    the path of a log as its argument, to which :data:`LOG_LAUNCH` (prepended) appends the variables
    ``names`` of every launch as one JSON line. Returns the supervisor's process and those lines."""
    path, log = folder / "job.py", folder / "launches.jsonl"
    path.write_text(LOG_LAUNCH.format(names=tuple(names)) + script)
    cmd = [sys.executable, "-m", "titan_morph.launch", "supervise", "--", sys.executable, str(path), str(log)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, env=env)
    lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, lines


LOG_LAUNCH = """
import json, os, sys
log = sys.argv[1]
with open(log, "a") as fh:
    fh.write(json.dumps([os.environ.get(name) for name in {names!r}]) + "\\n")
launches = sum(1 for _ in open(log))
"""


def check_like_run_train(
    config: Path, args: list[str], variables: dict[str, str], monkeypatch: Any, capsys: Any
) -> tuple[int, list[str]]:
    """``./run_train.sh``'s check of these inputs (launcher ``run``, the variables as its environment),
    in this process: the exit code and the lines on stderr. Reaching torchrun fails the test (the
    check must stop a bad input first); end-to-end runs of the script itself cost ~13 s each, most
    of it importing TorchTitan."""
    from titan_morph.integration.titan022 import launcher

    for name, value in variables.items():
        monkeypatch.setenv(name, value)

    def no_rank(*_: object, **__: object) -> int:
        raise AssertionError("the launcher went on to start torchrun")

    monkeypatch.setattr(launcher, "exec_torchrun", no_rank)
    options = [
        part
        for name, flag in (("NGPU", "--nproc"), ("LOG_RANK", "--log-rank"))
        if name in variables
        for part in (flag, variables[name])
    ]
    code = launcher.main(["run", *options, str(config), *args])
    return code, capsys.readouterr().err.splitlines()
