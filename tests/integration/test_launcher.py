"""The launcher behind ./run_train.sh: bad inputs stop before any rank starts; nothing is left behind.

Bad inputs run the real ``./run_train.sh`` (set-up, launcher, TorchTitan's config resolution): exit
code 2, one line on stderr naming the key, no torchrun output, no run folder. Runs (finished,
failed, interrupted by SIGINT) are checked for leftovers: the run's private TMPDIR must hold
nothing but torch's compile cache (no ``torchelastic_*`` folder), no process may carry the run's
environment marker, and no ``/dev/shm/titan_morph_*`` segment created during the run may remain unused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch import DEFAULT_CONFIG, REPO, check_like_run_train
from titan_morph.comm.machine.system import segments_in_use, shm_segments
from titan_morph.compare.runner import MARKER_ENV, marked_processes
from titan_morph.config import ConfigError
from titan_morph.integration.titan022.jobconfig import load_toml

SYNTHETIC = REPO / "train_configs" / "synthetic_cpu.toml"
HANG_GUARD_S = 120


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "VENV": sys.prefix, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}
    env.pop("TITAN_MORPH_RUN_ID", None)
    env.update(extra)
    return env


def _with_morph(tmp_path: Path, morph: str, name: str = "custom.toml", base: Path = DEFAULT_CONFIG) -> Path:
    """``base`` with its ``[morph]`` tables replaced by ``morph``."""
    text = base.read_text()
    path = tmp_path / name
    path.write_text(text[: text.index("\n[morph]\n") + 1] + morph)
    return path


def _bad_trace(tmp_path: Path) -> Path:
    trace = tmp_path / "trace.csv"
    trace.write_text("step,link,delay_ms\n3,2,40\n8,2\n")
    return trace


BAD_INPUTS = {
    "transport": (
        ["--morph.transport", "bogus"],
        "error: morph.transport: 'bogus' is not one of default, delegate, auto",
    ),
    "schedule-typo": (
        ["--parallelism.pipeline_parallel_schedule", "ZBH3"],
        "error: parallelism.pipeline_parallel_schedule:",
    ),
    "delegates-65": (["--morph.delegates_per_link", "65"], "error: morph.delegates_per_link: 65 is out of range"),
    "1f1b-microbatches": (
        ["--parallelism.pipeline_parallel_schedule", "1F1B", "--training.local_batch_size", "2"],
        "error: parallelism.pipeline_parallel_schedule: '1F1B'",
    ),
    "delay-1e6": (["--morph.inject.delays_ms", "1e6"], "error: morph.inject.delays_ms: 1000000.0 is out of range"),
    "list-typo": (["--morph.inject.delays_ms", "0,x,0"], "error: morph.inject.delays_ms: 'x' is not a number"),
    "bool-value": (["--morph.monitor", "maybe"], "error: morph.monitor: 'maybe' is not a boolean"),
    "monitor-off-adapt-on": (["--morph.no-monitor"], "error: morph.adapt: True needs morph.monitor = true"),
    "unknown-cli-option": (["--morph.transprot", "auto"], "error: unrecognized option(s): --morph.transprot"),
    "short-trace-row": (
        ["--morph.inject.mode", "trace", "--morph.inject.trace_file", "{trace}"],
        "error: morph.inject.trace_file:",
    ),
    "toml-syntax": ("[morph]\ntransport = auto\n", "invalid TOML"),
    "toml-unknown-morph-key": (
        '[morph]\ntransprot = "auto"\n',
        "morph.transprot: unknown key (did you mean transport?)",
    ),
    "toml-bad-value": ('[morph]\nmonitor = "false"\n', "error: morph.monitor: 'false' is not a boolean"),
    "pp-degree-0": (
        ["--parallelism.pipeline_parallel_degree", "0"],
        "error: parallelism.pipeline_parallel_degree: 0 must be >= 1",
    ),
    "steps-0": (["--training.steps", "0"], "error: training.steps: 0 must be >= 1"),
    "microbatch-size-3": (
        ["--parallelism.pipeline_parallel_microbatch_size", "3"],
        "error: parallelism.pipeline_parallel_microbatch_size: 3 must be >= 1 and divide training.local_batch_size (8)",
    ),
    "timeout-0": (["--comm.train_timeout_seconds", "0"], "error: comm.train_timeout_seconds: 0.0 must be"),
    "compute-factor-0": (
        ["--morph.inject.mode", "static", "--morph.inject.compute_factor", "1,1,0,1"],
        "error: morph.inject.compute_factor: 0.0 is out of range: must be > 0",
    ),
    "compute-factor-count": (
        ["--morph.inject.mode", "static", "--morph.inject.compute_factor", "1,2"],
        "error: morph.inject.compute_factor: [1.0, 2.0] needs 1 or 4 values (one per rank, 4 ranks), got 2",
    ),
    "manual-without-split": (["--morph.partition", "manual"], "error: morph.partition: 'manual' needs a split"),
    "split-over-memory": (
        ["--morph.rank_memory_gb", "0.003"],
        "error: morph.rank_memory_gb: [0.003, 0.003, 0.003, 0.003] GB cannot hold the split [1, 2, 2, 1]",
    ),
}

BAD_LAUNCHER_VARIABLES = {
    "ngpu-3": ({"NGPU": "3"}, "error: NGPU: 3 ranks, but the parallel degrees need 4 (pipeline_parallel_degree 4)"),
    "ngpu-zero": ({"NGPU": "0"}, "error: NGPU: '0' is not a number of ranks (>= 1)"),
    "log-rank-7": ({"LOG_RANK": "7"}, "error: LOG_RANK: '7' must name ranks of this job, 0..3"),
}


# end to end through ./run_train.sh (each ~13 s, most of it importing TorchTitan): one case of each
# kind in the default run, every case under ``slow``; every case runs in process below
END_TO_END = ("toml-syntax", "steps-0", "ngpu-3")


def _bad_case(case: str, tmp_path: Path) -> tuple[Path, list[str], dict[str, str], str]:
    """The config, overrides, launcher variables and expected message of a bad-input case."""
    if case in BAD_LAUNCHER_VARIABLES:
        variables, expected = BAD_LAUNCHER_VARIABLES[case]
        return DEFAULT_CONFIG, [], variables, expected
    spec, expected = BAD_INPUTS[case]
    if isinstance(spec, str):  # a TOML file with this [morph] section
        return _with_morph(tmp_path, spec), [], {}, expected
    return DEFAULT_CONFIG, [a.replace("{trace}", str(_bad_trace(tmp_path))) for a in spec], {}, expected


def _check_line(case: str, config: Path, line: str, expected: str) -> None:
    assert expected in line, line
    if case == "toml-syntax":
        at = config.read_text().splitlines().index("transport = auto") + 1
        assert line.startswith(f"error: {config}:{at}:13: invalid TOML"), line
    if case == "short-trace-row":
        assert "line 3 has 2 fields, the header has 3" in line
    if case == "delay-1e6":
        assert "train_timeout_seconds" in line


@pytest.mark.parametrize("case", [*BAD_INPUTS, *BAD_LAUNCHER_VARIABLES])
def test_the_launchers_check_refuses_bad_input_in_one_line(case, tmp_path, monkeypatch, capsys):
    """The check ``./run_train.sh`` runs, in this process: exit code 2 and one line, no torchrun."""
    config, args, variables, expected = _bad_case(case, tmp_path)
    dump = tmp_path / "run"
    code, lines = check_like_run_train(config, [*args, "--job.dump_folder", str(dump)], variables, monkeypatch, capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, lines)
    _check_line(case, config, lines[0], expected)
    assert not dump.exists()


@pytest.mark.parametrize(
    "case",
    [c if c in END_TO_END else pytest.param(c, marks=pytest.mark.slow) for c in [*BAD_INPUTS, *BAD_LAUNCHER_VARIABLES]],
)
def test_bad_input_is_one_line_and_exit_2_before_any_rank(case, tmp_path):
    config, args, variables, expected = _bad_case(case, tmp_path)
    dump = tmp_path / "run"
    start = time.monotonic()
    result = subprocess.run(
        [str(REPO / "run_train.sh"), *args, "--job.dump_folder", str(dump)],
        cwd=REPO,
        env=_env(CONFIG_FILE=str(config), **variables),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    seconds = time.monotonic() - start
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[setup]")]
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    _check_line(case, config, lines[0], expected)
    assert result.stdout == "" and "torch.distributed.run" not in result.stderr and "rank" not in result.stdout
    assert not dump.exists(), "no rank may have started"
    print(f"{case}: exit 2 after {seconds:.1f} s: {lines[0]}")


def test_overrides_are_checked_against_the_schema_before_the_parser():
    """Unknown options, choices and numbers are named by key from the dataclass tree itself."""
    from torchtitan.config import JobConfig as TitanJobConfig

    from titan_morph.config.cli import check_overrides, option_fields
    from titan_morph.config.schema import JobConfig as MorphJobConfig

    options = {**option_fields(TitanJobConfig), **option_fields(MorphJobConfig)}
    cases = {
        ("--morph.inject.mode", "x"): "morph.inject.mode: 'x' is not one of none, static, random, trace, break",
        ("--training.stepz", "3"): "unrecognized option(s): --training.stepz (did you mean --training.steps?)",
        ("--training.steps=ten",): "training.steps: 'ten' is not an integer",
        ("--morph.detect-margin", "wide"): "morph.detect_margin: 'wide' is not a number",
    }
    for argv, message in cases.items():
        with pytest.raises(ConfigError) as err:
            check_overrides(list(argv), options)
        assert str(err.value) == message
    good = ["--training.steps", "3", "--compile.enable", "--compile.no-enable", "--morph.no-adapt", "--morph.search"]
    check_overrides([*good, "--morph.inject.delays_ms", "0,0,60", "--parallelism.pipeline_parallel_degree=2"], options)


def test_toml_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[job]\ndump_folder = "x"\n[training]\nsteps = \n')
    with pytest.raises(ConfigError, match=rf"^{bad}:4:9: invalid TOML: Invalid value$"):
        load_toml(bad)
    with pytest.raises(ConfigError, match="file not found"):
        load_toml(tmp_path / "missing.toml")


# --------------------------------------------------------------------------------------------
# Nothing left behind


class _Run:
    """``./run_train.sh`` in its own process group with a private TMPDIR and an environment marker
    that every process it starts inherits."""

    def __init__(self, tmp_path: Path, *args: str, config: Path = SYNTHETIC) -> None:
        self.tmpdir = tmp_path / "tmp"
        self.tmpdir.mkdir()
        self.log = tmp_path / "out.log"
        self.run_id = f"launcher-test-{os.getpid()}-{time.monotonic_ns()}"
        self.segments_before = shm_segments()
        dump = tmp_path / "run"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [str(REPO / "run_train.sh"), *args, "--job.dump_folder", str(dump)],
                cwd=REPO,
                env=_env(CONFIG_FILE=str(config), TMPDIR=str(self.tmpdir), **{MARKER_ENV: self.run_id}),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout_s: float = 300) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"run_train.sh did not finish within {timeout_s} s:\n{self.output()[-4000:]}")

    def assert_nothing_left(self) -> None:
        deadline = time.monotonic() + 5  # exited processes may take a moment to be reaped by init
        while (procs := marked_processes(self.run_id)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not procs, f"processes left behind: {procs}"
        # torch's compile cache (torchinductor_<user>) is shared between runs on purpose
        left = sorted(p.name for p in self.tmpdir.iterdir() if not p.name.startswith("torchinductor_"))
        assert not left, f"files left in the run's TMPDIR (torchrun logs?): {left}"
        stale = (shm_segments() - self.segments_before) - segments_in_use()
        assert not stale, f"shared-memory segments left behind: {sorted(stale)}"


@pytest.mark.slow
def test_finished_run_with_delegates_leaves_nothing(tmp_path):
    run = _Run(tmp_path, "--training.steps", "3", "--morph.transport", "delegate")
    assert run.wait() == 0, run.output()[-4000:]
    assert "step:  3" in run.output()
    run.assert_nothing_left()


@pytest.mark.slow
def test_failed_run_leaves_nothing(tmp_path):
    """A link goes down at step 2 on the default transport: the ranks fail, torchrun reports it."""
    down = ("--morph.inject.mode", "static", "--morph.inject.delays_ms", "0,inf,0", "--morph.inject.start_step", "2")
    run = _Run(tmp_path, "--training.steps", "4", *down)
    code = run.wait()
    assert code not in (0, 2), run.output()[-4000:]
    assert "LinkDownError" in run.output()
    run.assert_nothing_left()


def test_ctrl_c_stops_every_rank_and_leaves_nothing(tmp_path):
    """SIGINT to run_train.sh's process group (what Ctrl-C in a terminal does) mid-training."""
    run = _Run(tmp_path, "--training.steps", "500", "--morph.transport", "delegate")
    deadline = time.monotonic() + 240
    while "step:  2" not in run.output():
        assert run.proc.poll() is None, run.output()[-4000:]
        assert time.monotonic() < deadline, "training did not reach step 2:\n" + run.output()[-4000:]
        time.sleep(0.5)
    assert shm_segments() - run.segments_before, "the delegate transport should have shared-memory segments"
    sent = time.monotonic()
    os.killpg(run.proc.pid, signal.SIGINT)
    code = run.wait(timeout_s=90)
    stopped_s = time.monotonic() - sent
    assert code == 128 + signal.SIGINT, (code, run.output()[-4000:])
    assert "step:  500" not in run.output()
    run.assert_nothing_left()
    print(f"Ctrl-C: every process gone {stopped_s:.1f} s after SIGINT")


def test_a_stopped_process_asked_to_terminate_is_released_at_once() -> None:
    """torchrun stops a failed job with SIGTERM; a rank stopped by SIGSTOP would keep it until the
    SIGKILL 30 s later. The launcher continues such a process so that its SIGTERM ends it now."""

    from titan_morph.integration.supervisor import release_stopped, stopped_with_termination_pending

    proc = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while Path(f"/proc/{proc.pid}/status").read_text().find("State:\tT") < 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not stopped_with_termination_pending(proc.pid)  # stopped, nothing pending: left alone
        assert release_stopped([proc.pid]) == []
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.1)
        assert proc.poll() is None and stopped_with_termination_pending(proc.pid)
        assert release_stopped([proc.pid]) == [proc.pid]
        assert proc.wait(timeout=5) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
