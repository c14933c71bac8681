"""The launcher behind ``./run_train.sh``: check the whole configuration, then run torchrun and
leave nothing behind.

``python -m titan_morph.launch run [--nproc N] [--log-rank R] CONFIG.toml [--section.key value ...]``
    Resolves the TOML and the command-line overrides exactly as TorchTitan does (its
    ``ConfigManager``, with titan_morph's ``[morph]`` section), runs every check the ranks would run
    (:func:`validate`), and only then starts ``torchrun`` under :func:`supervise`. A bad input is
    one line ``error: <key>: <what is wrong and what is allowed>`` on stderr and exit code 2,
    before any rank starts.
``python -m titan_morph.launch check CONFIG.toml [overrides ...]``
    The checks alone (exit 0 or 2).
``python -m titan_morph.launch supervise -- COMMAND ...``
    Runs a torchrun command so that nothing outlives it (used by :func:`torchrun_command`), and
    restarts it when the ranks ask for a new rank order (below).
``python -m titan_morph.launch ngpu CONFIG.toml [overrides ...]``
    Prints the number of ranks the config needs (product of the parallel degrees).

What :func:`supervise` guarantees, after a run, a failed run or Ctrl-C:

* torchrun writes its per-rank logs into a private folder (``--log-dir``), removed afterwards, so
  no ``/tmp/torchelastic_*`` folder stays;
* the supervisor is the child subreaper of everything it starts (``PR_SET_CHILD_SUBREAPER``):
  processes orphaned by a dying torchrun or rank come back to it and are stopped (SIGTERM, then
  SIGKILL); torchrun itself gets SIGTERM if the supervisor dies (``PR_SET_PDEATHSIG``), and
  ``titan_morph.train`` asks for the same on every rank;
* shared-memory segments ``/dev/shm/titan_morph_*`` created during the run that no live process
  maps or holds open any more are removed.

Relaunch with a new rank order (the DP x PP orchestrator, :mod:`titan_morph.integration.hybrid`;
the protocol is :mod:`titan_morph.integration.relaunch`). The supervisor gives the ranks
``$TITAN_MORPH_RELAUNCH_FILE``. When the orchestrator moves hosts between ranks, the ranks
checkpoint, rank 0 writes the new host of every rank there and they exit cleanly; the supervisor
then starts torchrun again in the same run folder (``$TITAN_MORPH_RUN_ID`` is kept), with
``$TITAN_MORPH_HOSTS`` naming each rank's host, ``$TITAN_MORPH_TOPOLOGY_CHANGES`` the moves made
so far and ``$TITAN_MORPH_SLOW_PAIRS`` the pairs measured slow, and the ranks resume from the
checkpoint. At most :data:`MAX_RELAUNCHES` times per run.
"""

import contextlib
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from titan_morph.comm.system import (
    SHM_DIR,
    become_subreaper,
    descendants,
    die_with_parent,
    proc_status,
    segments_in_use,
    shm_segments,
)
from titan_morph.integration.relaunch import HOSTS_ENV, MOVES_ENV, RELAUNCH_ENV, SLOW_ENV, take_request

CONFIG_MODULE = "titan_morph.integration.config"
TRAIN_MODULE = "titan_morph.train"
DEGREES = (
    "pipeline_parallel_degree",
    "tensor_parallel_degree",
    "context_parallel_degree",
    "data_parallel_replicate_degree",
    "data_parallel_shard_degree",
)
STOP_GRACE_S = 10.0
"""Seconds stray processes get between SIGTERM and SIGKILL once torchrun has exited."""
EXIT_BAD_CONFIG = 2
MAX_RELAUNCHES = 8


class LaunchError(Exception):
    """A configuration problem, reported as one line before any rank starts."""


# --------------------------------------------------------------------------------------------
# Reading and checking the configuration


def load_toml(path: str | Path) -> dict[str, Any]:
    """The parsed TOML file; a missing file or a syntax error is a :class:`LaunchError` naming the
    file and, for syntax errors, the line and column."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise LaunchError(f"job.config_file: {str(path)!r}: file not found") from None
    except tomllib.TOMLDecodeError as err:
        where = re.search(r"\(at line (\d+), column (\d+)\)", str(err))
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(err))
        at = f":{where.group(1)}:{where.group(2)}" if where else ""
        raise LaunchError(f"{path}{at}: invalid TOML: {message}") from None


def config_file_of(argv: Sequence[str]) -> str | None:
    """The ``--job.config_file`` value of a TorchTitan command line (None when absent)."""
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if key in ("--job.config_file", "--job.config-file"):
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def without_config_file(argv: Sequence[str]) -> list[str]:
    """``argv`` less its ``--job.config_file`` option (either spelling, ``=`` or separate value)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--job.config_file", "--job.config-file"):
            skip = True
        elif not arg.startswith(("--job.config_file=", "--job.config-file=")):
            out.append(arg)
    return out


def with_config_module(argv: list[str], toml: Mapping[str, Any]) -> list[str]:
    """Add ``--job.custom_config_module titan_morph.integration.config`` unless the command line or
    the TOML names a config module, so that the ``[morph]`` section always exists."""
    named_on_cli = any(a.split("=")[0] in ("--job.custom_config_module", "--job.custom-config-module") for a in argv)
    job = toml.get("job", {})
    named_in_toml = isinstance(job, Mapping) and bool(job.get("custom_config_module"))
    return argv if named_on_cli or named_in_toml else [*argv, "--job.custom_config_module", CONFIG_MODULE]


def check_toml_keys(toml: Mapping[str, Any], *, titan: bool = True) -> None:
    """Reject keys that titan_morph's ``[morph]`` (and, with ``titan``, TorchTitan's JobConfig) do
    not define. ``titan=False`` needs no torchtitan import (fast)."""
    from titan_morph.integration.config import Morph, check_unknown_keys

    if "morph" in toml:
        morph = toml["morph"]
        check_unknown_keys({"morph": morph} if not isinstance(morph, Mapping) else morph, Morph, "morph")
    if titan:
        from torchtitan.config import JobConfig as TitanJobConfig

        check_unknown_keys({k: v for k, v in toml.items() if k != "morph"}, TitanJobConfig, "")


@contextlib.contextmanager
def _captured_output() -> Iterator[list[str]]:
    """Send everything written to file descriptors 1 and 2 (tyro's messages, TorchTitan's log) to a
    temporary file; the list yielded receives the text when the block ends."""
    sink: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        os.dup2(tmp.fileno(), 2)
        try:
            yield sink
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            sink.append(tmp.read().decode(errors="replace"))


def _option_key(flag: str) -> str:
    """``--morph.inject.delays-ms`` -> ``morph.inject.delays_ms``."""
    return flag.lstrip("-").replace("-", "_")


def tyro_error_line(text: str) -> str:
    """One line from tyro's boxed error message (the first part of its box, options named as keys)."""
    title, sections = "", [[]]  # type: ignore[var-annotated]
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("╭"):
            title = line.strip("╭╮─ ")
            sections = [[]]
            continue
        if line.startswith("╰"):
            break
        line = line.strip("│").strip()
        if line and set(line) <= set("─ "):
            sections.append([])
        elif line:
            sections[-1].append(line)
    body = " ".join(" ".join(sections[0]).split())
    if not title:  # not a tyro box: its last line
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return lines[-1] if lines else "the command line could not be parsed"
    choice = re.match(r"invalid choice '(.*)' for argument '(--[\w.-]+)'\. Expected one of \((.*)\)", body)
    if choice:
        allowed = ", ".join(v.strip().strip("'\"") for v in choice.group(3).split(",") if v.strip())
        return f"{_option_key(choice.group(2))}: {choice.group(1)!r} is not one of {allowed}"
    parsing = re.match(r"Error parsing (--[\w.-]+): (.*)", body)
    if parsing:
        return f"{_option_key(parsing.group(1))}: {parsing.group(2)}"
    if body.startswith("Unrecognized options:"):
        hint = ""
        for section in sections[1:]:
            if section and section[0].startswith("Perhaps you meant"):
                flags = [s.split()[0] for s in section[1:] if s.startswith("--")]
                hint = f" (did you mean {flags[0]}?)" if flags else ""
        return f"unrecognized option(s): {body.split(':', 1)[1].strip()}{hint}"
    return f"{title.lower()}: {body}" if title else body


def resolve(config_file: str | Path, overrides: Sequence[str] = ()) -> Any:
    """TorchTitan's JobConfig for ``--job.config_file CONFIG *overrides``, the way ``torchtitan.train``
    builds it (TOML, then the command line), with the ``[morph]`` section. Raises
    :class:`LaunchError` (one line) for a missing file, bad TOML, unknown keys or a rejected option."""
    from titan_morph.integration.config import MorphConfigError, expand_negated_flags

    toml = load_toml(config_file)
    argv = with_config_module(expand_negated_flags(["--job.config_file", str(config_file), *overrides]), toml)
    try:
        check_toml_keys(toml, titan=False)
        if "torchtitan.tools.utils" not in sys.modules:  # as titan_morph.train: adapt before torchtitan loads
            from titan_morph.integration.cpu import adapt_torchtitan_to_cpu

            adapt_torchtitan_to_cpu()
        check_toml_keys(toml)
    except MorphConfigError as err:
        raise LaunchError(f"{config_file}: {err}") from None
    from torchtitan.config import ConfigManager

    error = ""
    with _captured_output() as output:
        try:
            job_config = ConfigManager().parse_args(argv)
        except SystemExit as exit_:
            error = "help" if exit_.code in (0, None) else "tyro"
        except MorphConfigError as err:
            error = str(err)
        except (ValueError, TypeError, ImportError) as err:
            error = " ".join(str(err).split())
    if error == "help":
        print(output[0], end="")
        raise SystemExit(0)
    if error == "tyro":
        raise LaunchError(tyro_error_line(output[0]))
    if error:
        raise LaunchError(error)
    return job_config


def validate(job_config: Any) -> None:
    """Every check of a resolved configuration, the same on the launcher and on each rank:
    ``[morph]`` against the pipeline (:func:`~titan_morph.integration.config.validate_job_config`)
    and, for titan_morph's TrainSpec, the schedule name (after importing ``[experimental]
    custom_import``, which may register schedules). Raises ``MorphConfigError``."""
    from titan_morph.integration.config import MorphConfigError, validate_job_config
    from titan_morph.integration.train_spec import TRAIN_SPEC_NAME

    par = job_config.parallelism
    per_rank: int | None = 1  # per-stage [morph] lists hold one value per stage: 2 per rank in a V
    if par.pipeline_parallel_degree > 1 and job_config.model.name == TRAIN_SPEC_NAME:
        from titan_morph.integration.schedules import stages_per_rank_of

        per_rank = stages_per_rank_of(par.pipeline_parallel_schedule, par.pipeline_parallel_layers_per_stage)
    validate_job_config(job_config, stages_per_rank=per_rank)

    if par.pipeline_parallel_degree > 1 and job_config.model.name == TRAIN_SPEC_NAME:
        from titan_morph.integration.schedules import check_schedule_name, schedule_names

        custom = job_config.experimental.custom_import
        if custom:  # what TorchTitan's Trainer imports first: it may register schedules
            try:
                importlib.import_module(custom)
            except ImportError as err:
                raise MorphConfigError(f"experimental.custom_import: {custom!r} cannot be imported: {err}") from None

        name = par.pipeline_parallel_schedule
        try:
            check_schedule_name(name)
        except ValueError:
            allowed = ", ".join(schedule_names())
            raise MorphConfigError(
                f"parallelism.pipeline_parallel_schedule: {name!r} is not one of {allowed}"
            ) from None


def check(config_file: str | Path, overrides: Sequence[str] = ()) -> Any:
    """:func:`resolve` then :func:`validate`; any problem is one :class:`LaunchError` line."""
    from titan_morph.integration.config import MorphConfigError

    job_config = resolve(config_file, overrides)
    try:
        validate(job_config)
    except MorphConfigError as err:
        raise LaunchError(str(err)) from None
    return job_config


def _ranks(degrees: Mapping[str, Any]) -> int:
    size = 1
    for name in DEGREES:
        size *= max(int(degrees.get(name, 1)), 1)  # a negative shard degree (TorchTitan: "the rest") counts 1
    return size


def world_size(config_file: str, overrides: list[str]) -> int:
    """Ranks needed by ``config_file`` with ``--parallelism.*`` overrides applied (TOML only: fast)."""
    toml_par = load_toml(config_file).get("parallelism", {})
    par = dict(toml_par) if isinstance(toml_par, Mapping) else {}
    for i, arg in enumerate(overrides):
        key, eq, value = arg.partition("=")
        name = key.removeprefix("--parallelism.").replace("-", "_")
        if key.startswith("--parallelism.") and name in DEGREES:
            par[name] = int(value if eq else overrides[i + 1])
    return _ranks(par)


# --------------------------------------------------------------------------------------------
# Running torchrun with nothing left behind


def torchrun_command(
    config_file: str | Path, dump_folder: str | Path, nproc: int, overrides: Sequence[str] = (), python: str = ""
) -> list[str]:
    """``torchrun --standalone`` (a free rendezvous port per job) of ``python -m titan_morph.train`` on
    ``nproc`` ranks, with TorchTitan's conventions (``--job.config_file``, ``--job.dump_folder``,
    overrides), run under :func:`supervise` so that nothing outlives the job."""
    python = python or sys.executable
    return [
        python,
        "-m",
        "titan_morph.launch",
        "supervise",
        "--",
        *_torchrun(python, nproc),
        "-m",
        TRAIN_MODULE,
        "--job.config_file",
        str(config_file),
        "--job.dump_folder",
        str(dump_folder),
        *overrides,
    ]


def _torchrun(python: str, nproc: int, show_ranks: str = "") -> list[str]:
    shown = ["--local-ranks-filter", show_ranks] if show_ranks else []
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *shown]


def _with_log_dir(cmd: list[str], log_dir: str) -> list[str]:
    """Insert ``--role rank --tee 3 --log-dir LOG_DIR`` after torchrun in ``cmd`` unless it sets them."""
    for i, arg in enumerate(cmd):
        if arg == "torch.distributed.run" or Path(arg).name == "torchrun":
            extra = [] if any(a.split("=")[0] in ("--log-dir", "--log_dir") for a in cmd) else ["--log-dir", log_dir]
            if "--tee" not in cmd:
                extra = ["--role", "rank", "--tee", "3", *extra]
            return [*cmd[: i + 1], *extra, *cmd[i + 1 :]]
    return cmd


_TERMINATING = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1))


def stopped_with_termination_pending(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, job control) while a SIGTERM or SIGINT waits for it: a
    stopped rank that torchrun asked to stop would otherwise hold the job until torchrun's SIGKILL,
    30 s later."""
    fields = proc_status(pid)
    if not fields.get("State", "").startswith("T"):  # "t" (a debugger's trace stop) is left alone
        return False
    pending = int(fields.get("ShdPnd") or "0", 16) | int(fields.get("SigPnd") or "0", 16)
    return bool(pending & _TERMINATING)


def release_stopped(pids: Iterable[int]) -> list[int]:
    """Continue every process of ``pids`` that is stopped with a termination pending, so that it ends
    now (its pending signal is delivered on SIGCONT); returns those pids."""
    released = [pid for pid in pids if stopped_with_termination_pending(pid)]
    for pid in released:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    return released


def _reap() -> None:
    """Collect exited children (orphans re-parented to this subreaper become its zombies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_descendants(grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM every process still below this one, SIGKILL what remains after ``grace_s``; returns
    the pids that were still there."""
    _reap()
    left = descendants()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in descendants():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while descendants() and time.monotonic() < deadline:
            _reap()
            time.sleep(0.1)
        _reap()
    return left


def remove_stale_segments(existing_before: set[str]) -> list[str]:
    """Remove segments that appeared since ``existing_before`` and nobody uses any more."""
    new = shm_segments() - existing_before
    if not new:
        return []
    stale = sorted(new - segments_in_use())
    for name in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))
    return stale


def supervise(cmd: list[str], env: Mapping[str, str] | None = None) -> int:
    """Run a torchrun command and clean up after it (see the module docstring); returns its exit code,
    or 128 + the signal number when it was interrupted (130 for Ctrl-C).

    The first SIGINT/SIGTERM/SIGHUP is passed on to torchrun, which stops its ranks; a second one
    kills everything at once. A clean exit with a relaunch request starts the command again.
    """
    become_subreaper()
    log_dir = tempfile.mkdtemp(prefix="titan_morph_torchrun_")
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("TITAN_MORPH_RUN_ID", time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    request = Path(log_dir) / "relaunch.json"
    child_env[RELAUNCH_ENV] = str(request)
    received: list[int] = []
    proc: subprocess.Popen | None = None

    def on_signal(sig: int, _frame: Any) -> None:
        received.append(sig)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if len(received) == 1:
                os.killpg(proc.pid, sig)
            else:
                os.killpg(proc.pid, signal.SIGKILL)
                for pid in descendants():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, on_signal) for sig in handled}
    launches = 0
    try:
        while True:
            segments_before = shm_segments()
            try:
                proc = subprocess.Popen(
                    _with_log_dir(cmd, log_dir),
                    env=child_env,
                    start_new_session=True,  # terminal signals reach this process only; it forwards them once
                    preexec_fn=die_with_parent,
                )
                while proc.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=0.5)
                    release_stopped(descendants())
                code = proc.returncode
            finally:
                if proc is not None and proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                stop_descendants()
                remove_stale_segments(segments_before)
            wanted = take_request(request) if code == 0 and not received else None
            if wanted is None:
                break
            if launches >= MAX_RELAUNCHES:
                print(f"titan_morph.launch: not relaunching: {MAX_RELAUNCHES} relaunches already", file=sys.stderr)
                break
            launches += 1
            child_env[HOSTS_ENV] = ",".join(str(h) for h in wanted["hosts"])
            child_env[MOVES_ENV] = str(wanted["moves"])
            child_env[SLOW_ENV] = wanted.get("slow", "")
            print(
                f"titan_morph.launch: relaunching after step {wanted['step']} with the host of each rank "
                f"{wanted['hosts']} (topology move {wanted['moves']}): {wanted['reason']}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 + received[0] if received else code


def _loss_rank(job_config: Any, n: int) -> int:
    """The rank that logs the loss: the last one, or rank 0 for a V schedule (ZBVZeroBubble,
    DualPipeV, PipeMorphV), whose last stage runs there."""
    par = job_config.parallelism
    if par.pipeline_parallel_degree > 1:
        from titan_morph.integration.schedules import schedule_placement

        try:
            if schedule_placement(par.pipeline_parallel_schedule) == "v":
                return 0
        except ValueError:  # not a schedule titan_morph knows: TorchTitan's own rule below
            pass
    return n - 1


def check_devices(ranks: int, cuda_devices: int) -> None:
    """One rank per GPU: with CUDA present, ``ranks`` beyond ``cuda_devices`` is a :class:`LaunchError`
    (NCCL refuses two ranks on one device). Without CUDA (``cuda_devices == 0``) ranks run on CPU."""
    if cuda_devices and ranks > cuda_devices:
        raise LaunchError(
            f"NGPU: {ranks} ranks but this host has {cuda_devices} CUDA device(s); titan_morph runs one rank per "
            f"GPU: set NGPU <= {cuda_devices} (and a smaller pipeline_parallel_degree), or train on CPU with "
            'CUDA_VISIBLE_DEVICES=""'
        )


def run(config_file: str, overrides: list[str], *, nproc: int | None = None, log_rank: str = "") -> int:
    """``./run_train.sh``: check, then replace this process by the supervisor of torchrun (so the
    memory of the check's imports is not held during training). Returns only on a bad config."""
    job_config = check(config_file, overrides)
    n = nproc or _ranks({name: getattr(job_config.parallelism, name) for name in DEGREES})
    import torch

    check_devices(n, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    shown = log_rank or str(_loss_rank(job_config, n))
    run_id = os.environ.setdefault("TITAN_MORPH_RUN_ID", time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    print(
        f"run_train.sh: {n} ranks, config {config_file}, run id {run_id}, showing rank(s) {shown}",
        file=sys.stderr,
        flush=True,
    )
    torchrun = [*_torchrun(sys.executable, n, shown), "-m", TRAIN_MODULE, "--job.config_file", config_file, *overrides]
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "titan_morph.launch", "supervise", "--", *torchrun])
    return 0  # not reached


USAGE = """usage:
  python -m titan_morph.launch run [--nproc N] [--log-rank R] CONFIG.toml [--section.key value ...]
  python -m titan_morph.launch check CONFIG.toml [--section.key value ...]
  python -m titan_morph.launch supervise -- COMMAND ...
  python -m titan_morph.launch ngpu CONFIG.toml [--section.key value ...]"""


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("run", "check", "supervise", "ngpu"):
        print(USAGE, file=sys.stderr)
        return EXIT_BAD_CONFIG
    command, args = argv[0], argv[1:]
    if command == "supervise":
        return supervise(args[1:] if args[:1] == ["--"] else args)
    options: dict[str, str] = {}
    while command == "run" and args[:1] and args[0] in ("--nproc", "--log-rank") and len(args) > 1:
        options[args[0]], args = args[1], args[2:]
    if not args:
        print(USAGE, file=sys.stderr)
        return EXIT_BAD_CONFIG
    config_file, overrides = args[0], args[1:]
    named = config_file_of(overrides)  # --job.config_file among the overrides wins, as in TorchTitan's CLI
    if named:
        config_file, overrides = named, without_config_file(overrides)
    try:
        if command == "ngpu":
            print(world_size(config_file, overrides))
        elif command == "check":
            check(config_file, overrides)
        else:
            nproc = options.get("--nproc")
            if nproc is not None and not (nproc.isdigit() and int(nproc) >= 1):
                raise LaunchError(f"NGPU: {nproc!r} is not a number of ranks (>= 1)")
            return run(
                config_file, overrides, nproc=int(nproc) if nproc else None, log_rank=options.get("--log-rank", "")
            )
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
