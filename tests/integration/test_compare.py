"""``python -m titan_morph.compare``: scenarios, variants, tables, and a real 2-variant comparison.

The fast tests check scenario expansion (every scenario's overrides are accepted by TorchTitan's
config parser and titan_morph's validator), name errors, the error-line parser and the tables.
The end-to-end test runs the harness as a subprocess on the synthetic testbed (ZBH2 vs PipeMorph,
3 steps, 60 ms on the last link), reads the TensorBoard events back from both run folders, checks
the printed table and the PNG, regenerates the report, and checks nothing is left running.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch import REPO, processes_mentioning
from titan_morph.compare.__main__ import main as compare_main
from titan_morph.compare.configs import ComparisonError, resolve_settings
from titan_morph.compare.results import RunSummary
from titan_morph.compare.runner import MARKER_ENV, Outcome, error_line, marked_processes, run_job
from titan_morph.compare.scenarios import SCENARIOS, ScenarioError, expand, get_scenario
from titan_morph.compare.tables import case_table, sweep_table
from titan_morph.compare.variants import DEFAULT_VARIANTS, VARIANTS, UnknownVariantError, parse_variants

CONFIG = REPO / "train_configs" / "synthetic_cpu.toml"


def _opt(overrides: tuple[str, ...], key: str) -> str | None:
    args = list(overrides)
    return args[args.index(key) + 1] if key in args else None


# ------------------------------------------------------------------ scenarios and variants (fast)


def test_last_link_60ms_targets_the_last_link() -> None:
    for pp, delays in ((4, "0,0,60"), (2, "60"), (8, "0,0,0,0,0,0,60")):
        (case,) = expand("last-link-60ms", pp - 1)
        assert _opt(case.overrides, "--morph.inject.mode") == "static"
        assert _opt(case.overrides, "--morph.inject.delays_ms") == delays
        assert _opt(case.overrides, "--morph.inject.start_step") == "1"
        assert case.name == ""  # single case: runs go straight into <logdir>/<scenario>/<variant>


def test_fig15_sweeps_the_last_link() -> None:
    cases = expand("fig15", 3)
    assert [c.x for c in cases] == [0, 15, 30, 45, 60]
    assert [c.name for c in cases] == ["0ms", "15ms", "30ms", "45ms", "60ms"]
    assert _opt(cases[0].overrides, "--morph.inject.mode") == "none"
    assert [c.delays_ms for c in cases[1:]] == [(0, 0, d) for d in (15, 30, 45, 60)]


def test_fig16_first_vs_last_and_needs_two_links() -> None:
    cases = {c.name: c.delays_ms for c in expand("fig16", 3)}
    assert cases == {
        "first-30ms": (30, 0, 0),
        "first-60ms": (60, 0, 0),
        "last-30ms": (0, 0, 30),
        "last-60ms": (0, 0, 60),
    }
    with pytest.raises(ScenarioError, match="PP >= 3"):
        expand("fig16", 1)


def test_fig17_link_sets_depend_on_the_pipeline() -> None:
    pp4 = {c.name: c.delays_ms for c in expand("fig17", 3)}
    assert pp4 == {"adjacent": (30, 30, 0), "skip": (30, 0, 30)}  # first+last = skip at PP = 4
    pp8 = {c.name: c.delays_ms for c in expand("fig17", 7)}
    assert pp8["first-last"] == (30, 0, 0, 0, 0, 0, 30)
    assert pp8["three-skip"] == (30, 0, 0, 30, 0, 0, 30)
    with pytest.raises(ScenarioError, match="at least 3 pipeline links"):
        expand("fig17", 2)


def test_fig18_traces_share_seed_and_differ_in_interval() -> None:
    cases = expand("fig18", 3)
    assert [c.name for c in cases] == ["A", "B", "C"]
    assert [_opt(c.overrides, "--morph.inject.random_interval_ms") for c in cases] == ["50,100", "100,200", "200,400"]
    assert len({_opt(c.overrides, "--morph.inject.seed") for c in cases}) == 1
    for c in cases:
        assert _opt(c.overrides, "--morph.inject.random_mean_ms") == "30"
        assert _opt(c.overrides, "--morph.inject.random_std_ms") == "10"
    (b,) = expand("fig18-B", 3)
    assert b.overrides == cases[1].overrides


def test_table3_replays_the_builtin_trace() -> None:
    (case,) = expand("table3", 3)
    assert _opt(case.overrides, "--morph.inject.mode") == "trace"
    assert _opt(case.overrides, "--morph.inject.trace_file") == "table3"
    assert get_scenario("table3").default_steps == 30


def test_unknown_scenario_lists_the_allowed_ones() -> None:
    with pytest.raises(ScenarioError) as err:
        expand("fig99", 3)
    for name in SCENARIOS:
        assert name in str(err.value)
    assert get_scenario("FIG15").name == "fig15"


def test_variants_defaults_names_and_overrides() -> None:
    assert [v.name for v in parse_variants(None)] == list(DEFAULT_VARIANTS)
    cpu, full = parse_variants("pipemorph-cpu,PipeMorph")
    assert cpu.overrides == (
        "--parallelism.pipeline_parallel_schedule",
        "PipeMorph",
        "--morph.transport",
        "delegate",
        "--morph.no-adapt",
    )
    assert _opt(full.overrides, "--morph.transport") == "auto" and "--morph.adapt" in full.overrides
    with pytest.raises(UnknownVariantError, match="allowed variants are 1F1B, GPipe"):
        parse_variants("1F1B,ZB")
    with pytest.raises(UnknownVariantError, match="twice"):
        parse_variants("ZBH2,zbh2")


def test_every_scenario_and_variant_resolves() -> None:
    """TorchTitan's parser and [morph] validation accept every case and every variant's overrides."""
    cases = [(name, case) for name in SCENARIOS for case in expand(name, 3)]
    (last_link,) = expand("last-link-60ms", 3)
    pairs = [(name, case, parse_variants("PipeMorph")[0]) for name, case in cases]
    pairs += [("last-link-60ms", last_link, variant) for variant in parse_variants(",".join(VARIANTS))]
    for name, case, variant in pairs:
        cfg = resolve_settings(CONFIG, ["--training.steps", "5", *variant.overrides, *case.overrides])
        assert cfg.job.schedule == variant.schedule
        assert cfg.morph.transport == variant.transport and cfg.morph.adapt == variant.adapt
        assert cfg.morph.inject.start_step == 1, (name, case.name)
        if name.startswith("fig18"):
            assert cfg.morph.inject.links == () and cfg.morph.inject.random_mean_ms == 30.0


def test_bad_override_is_one_clear_error() -> None:
    with pytest.raises(ComparisonError, match="morph.transport"):
        resolve_settings(CONFIG, ["--morph.transport", "carrier-pigeon"])


# ------------------------------------------------------------------ CLI without training (fast)


def test_cli_list_and_name_errors(capsys) -> None:
    assert compare_main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in SCENARIOS)
    assert compare_main(["--config", str(CONFIG), "--scenario", "nope"]) == 2
    assert "allowed scenarios are none, last-link-60ms" in capsys.readouterr().err
    assert compare_main(["--config", str(CONFIG), "--scenario", "none", "--variants", "ZBH3"]) == 2
    assert "unknown variant 'ZBH3'" in capsys.readouterr().err
    assert compare_main(["--config", str(CONFIG), "--scenario", "none", "--steps", "3", "--skip-warmup", "3"]) == 2
    assert "--skip-warmup must be in 0..2" in capsys.readouterr().err
    assert compare_main(["--scenario", "none"]) == 2
    assert "--config is required" in capsys.readouterr().err


def test_cli_dry_run_prints_one_job_per_case_and_variant(tmp_path, capsys) -> None:
    argv = ["--config", str(CONFIG), "--scenario", "fig16", "--variants", "ZBH2,PipeMorph", "--logdir", str(tmp_path)]
    assert compare_main([*argv, "--dry-run", "--", "--morph.link_queue_depth", "3"]) == 0
    out = capsys.readouterr().out
    commands = [line for line in out.splitlines() if "torch.distributed.run" in line]
    assert len(commands) == 4 * 2
    assert all(line.rstrip().endswith("--morph.link_queue_depth 3") for line in commands)  # user overrides last
    assert f"--job.dump_folder {tmp_path}/fig16/last-60ms/PipeMorph" in out
    # the synthetic testbed's simulator column: ZBH2 under 60 ms on the last link (blocking, depth 3)
    assert re.search(r"last-60ms ZBH2: .*simulated \d+\.\d ms", out)
    assert not any(tmp_path.iterdir()), "a dry run must not launch or write anything"


def test_simulator_only_scenario_fig5_8(tmp_path, capsys) -> None:
    assert compare_main(["--scenario", "fig5-8", "--logdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # Fig. 5: ZB-H2 planned without delay: 390 ms; c_0 = 10 ms: 400 ms; 20 ms: 440 ms (the cascade)
    assert re.search(r"\| 0 \| 390 \(", out) and re.search(r"\| 10 \| 400 \(", out) and re.search(r"\| 20 \| 440 ", out)
    assert (tmp_path / "fig5-8" / "fig5-8.png").stat().st_size > 10_000
    meta = json.loads((tmp_path / "fig5-8" / "comparison.json").read_text())
    assert meta["kind"] == "simulator" and "fig5-8" in meta["command"]


# ------------------------------------------------------------------ outcome parsing and tables (fast)


def test_error_line_prefers_the_root_cause() -> None:
    log = "\n".join(
        [
            "[rank2]:[titan] 2026-11-21 16:46:44,269 - root - WARNING - Error running lspci: [Errno 2] No such file",
            "[rank0]:[rank0]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:62601.",
            "[rank2]:[rank2]: titan_morph.pipelining.core.links.LinkDownError: pipeline link 1 (1<->2, fwd) is down",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        ]
    )
    assert error_line(log) == "LinkDownError: pipeline link 1 (1<->2, fwd) is down"
    assert error_line("titan_morph: configuration error: invalid [morph] option x") == (
        "configuration error: invalid [morph] option x"
    )
    assert error_line("all fine\n") == ""


def test_run_job_start_up_failure_and_timeout_with_a_stray_process(tmp_path) -> None:
    """Outcomes of real (non-torch) jobs: a start-up error, and a job that hangs after step 1 and
    leaves a process outside its process group, which the harness finds by its marker and stops."""
    fail = [sys.executable, "-c", "print('titan_morph: configuration error: bad key'); raise SystemExit(2)"]
    outcome = run_job(fail, tmp_path / "fail", variant="X", case="", timeout_s=30)
    assert outcome.status() == "failed at start-up: configuration error: bad key"
    assert json.loads((tmp_path / "fail" / "outcome.json").read_text())["returncode"] == 2

    hang = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        "print('Training starts at step 1'); print('step:  1  loss:  8.0', flush=True); time.sleep(120)\n"
    )
    started = time.monotonic()
    outcome = run_job(
        [sys.executable, "-c", hang], tmp_path / "hang", variant="X", case="", timeout_s=3, cleanup_grace_s=1
    )
    assert time.monotonic() - started < 30
    assert outcome.timed_out and outcome.status().startswith("timed out at step 2 after")
    assert len(outcome.leftover_pids) == 1  # the stray sleeper: found by its marker, killed
    assert not marked_processes(str(tmp_path / "hang"))


def _row(variant: str, step_ms: float, ok: bool = True, failed_step: int | None = None) -> RunSummary:
    """A run of 5 steps at ``step_ms`` each (step 1: start-up, twice as long; skip = 1), or only
    the steps before ``failed_step``."""
    outcome = Outcome(variant, "", [], 0 if ok else 1, 1.0, error="" if ok else "LinkDownError: x")
    outcome.failed_step = failed_step
    last = 5 if ok else failed_step - 1
    series = {step: (2 * step_ms if step == 1 else step_ms) for step in range(1, last + 1)}
    return RunSummary(variant, "", "", outcome, 1, step_ms=step_ms, tokens_per_s=10.0, step_series=series)


def test_case_table_speedups_and_failures() -> None:
    pipemorph_row = _row("PipeMorph", 1000.0)
    pipemorph_row.bound_ms = 987.6
    table = case_table([_row("1F1B", 2000.0, ok=False, failed_step=4), _row("ZBH2", 1500.0), pipemorph_row])
    lines = table.splitlines()
    assert lines[0].startswith("| variant | step ms (median) |") and "× vs 1F1B | × vs ZBH2 |" in lines[0]
    assert "| simulated ms | bound ms | × vs 1F1B |" in lines[0]
    assert "| 1F1B | 2000.0† |" in table and "failed at step 4: LinkDownError: x" in table
    pipemorph = next(line for line in lines if line.startswith("| PipeMorph |"))
    # against the failed 1F1B: over steps 2-3 (both completed), marked; against ZBH2: 1500 / 1000
    assert "| 2.00×† | 1.50× |" in pipemorph
    assert "| — | 987.6 | 2.00×† |" in pipemorph  # simulated unknown, the bound from morph/bound_ms
    assert "| 1.00× | 1.00×" not in pipemorph


def test_sweep_table_ratios_to_the_target_and_to_no_delay() -> None:
    cases = [
        [_row("ZBH2", 750.0), _row("PipeMorph", 750.0)],
        [_row("ZBH2", 1600.0), _row("PipeMorph", 800.0)],
    ]
    table = sweep_table(["0 ms", "60 ms"], cases, {"ZBH2": 750.0, "PipeMorph": 750.0}, "0 ms")
    header, _, zero, sixty = table.splitlines()
    assert header == "| case | ZBH2 ms | PipeMorph ms | ZBH2 / PipeMorph | ZBH2 / 0 ms | PipeMorph / 0 ms |"
    assert zero == "| 0 ms | 750.0 | 750.0 | 1.00× | 1.00× | 1.00× |"
    assert sixty == "| 60 ms | 1600.0 | 800.0 | 2.00× | 2.13× | 1.07× |"


# ------------------------------------------------------------------ end to end (torchrun jobs)


def _tb_scalars(run_dir: Path, tag: str) -> dict[int, float]:
    from titan_morph.compare.results import read_scalars

    return read_scalars(run_dir).get(tag, {})


def _shm_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("titan_morph_")}


def _compare(logdir: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "titan_morph.compare", "--config", str(CONFIG), "--logdir", str(logdir), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, env=env)


def _assert_nothing_left(logdir: Path, run_dirs: list[Path], shm_before: set[str]) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        procs = processes_mentioning(str(logdir)) + [p for d in run_dirs for p in marked_processes(str(d))]
        if not procs:
            break
        time.sleep(0.2)
    assert not procs, f"processes left behind: {procs}"
    for d in run_dirs:
        outcome = json.loads((d / "outcome.json").read_text())
        assert outcome["leftover_pids"] == [] and outcome["leftover_segments"] == [], outcome
    # Other tests may run delegates concurrently: only segments that appeared and stay count.
    new = _shm_segments() - shm_before
    deadline = time.monotonic() + 15
    while new and time.monotonic() < deadline:
        time.sleep(0.5)
        new &= _shm_segments()
    assert not new, f"/dev/shm segments left behind: {new}"


def test_compare_two_variants_end_to_end(tmp_path) -> None:
    logdir = tmp_path / "logs"
    shm_before = _shm_segments()
    started = time.monotonic()
    proc = _compare(
        logdir, "--scenario", "last-link-60ms", "--variants", "ZBH2,PipeMorph", "--steps", "3", "--skip-warmup", "1"
    )
    seconds = time.monotonic() - started
    assert proc.returncode == 0, f"exit {proc.returncode} after {seconds:.0f} s\n{proc.stdout[-4000:]}\n{proc.stderr}"
    scenario_dir = logdir / "last-link-60ms"
    run_dirs = [scenario_dir / "ZBH2", scenario_dir / "PipeMorph"]

    # TensorBoard events of both runs, one folder per variant (tensorboard --logdir overlays them)
    for run_dir in run_dirs:
        steps = _tb_scalars(run_dir, "time_metrics/end_to_end(s)")
        assert sorted(steps) == [1, 2, 3], (run_dir, steps)
        assert all(math.isfinite(v) and v > 0 for v in steps.values())
        assert sorted(_tb_scalars(run_dir, "morph/pipeline_ms")) == [1, 2, 3]
    losses = [_tb_scalars(d, "loss_metrics/global_avg_loss") for d in run_dirs]
    for step in (1, 2, 3):  # same seed and data: the schedule changes timing, not the losses
        assert losses[0][step] == pytest.approx(losses[1][step], rel=1e-5)

    # the printed table: both rows, finite numbers, the bound, ZBH2's speedup column
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert {"ZBH2", "PipeMorph"} <= set(rows), proc.stdout
    for name in ("ZBH2", "PipeMorph"):
        cells = [c.strip() for c in rows[name].strip("|").split("|")]
        step_ms, tps, pipeline_ms, simulated_ms, bound = (float(c) for c in cells[1:6])
        assert all(math.isfinite(v) and v > 0 for v in (step_ms, tps, pipeline_ms, simulated_ms)), rows[name]
        # 30 ms of forwards and 60 ms to the last rank, then 24 x 30 ms; a plan re-made during the run (its
        # model holds the measured stage times, at least the nominal 30 ms) can only raise it
        changes = cells[-2]
        assert bound == 810.0 if changes in ("0", "—") else bound >= 810.0, rows[name]
        assert re.fullmatch(r"\d+\.\d\d×", cells[6]), rows[name]
        assert cells[-1] == "ok"
    assert (scenario_dir / "step_time.png").stat().st_size > 10_000
    assert "ZBH2" in (scenario_dir / "table.md").read_text()
    meta = json.loads((scenario_dir / "comparison.json").read_text())
    assert meta["variants"] == ["ZBH2", "PipeMorph"] and "last-link-60ms" in meta["command"]

    # the report regenerates the same table from the log directory
    out = tmp_path / "results.md"
    report = subprocess.run(
        [sys.executable, "-m", "titan_morph.compare.report", str(logdir), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    text = out.read_text()
    assert rows["ZBH2"].strip() in text and rows["PipeMorph"].strip() in text
    assert "python -m titan_morph.compare" in text and "--variants ZBH2,PipeMorph" in text
    _assert_nothing_left(logdir, run_dirs, shm_before)


@pytest.mark.slow
def test_compare_reports_a_failing_variant_and_goes_on(tmp_path) -> None:
    """1F1B on the default transport cannot cross a link that is down: reported, not fatal."""
    logdir = tmp_path / "logs"
    shm_before = _shm_segments()
    down = ("--morph.inject.mode", "static", "--morph.inject.delays_ms", "0,inf,0", "--morph.inject.start_step", "2")
    proc = _compare(
        logdir, "--scenario", "none", "--variants", "1F1B", "--steps", "2", "--skip-warmup", "0", "--", *down
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| 1F1B |"))
    assert "failed at step 2: LinkDownError: pipeline link 1" in row, row
    assert "1F1B: failed at step 2" in proc.stdout  # the progress line
    run_dir = logdir / "none" / "1F1B"
    assert sorted(_tb_scalars(run_dir, "time_metrics/end_to_end(s)")) == [1]
    assert MARKER_ENV not in os.environ
    _assert_nothing_left(logdir, [run_dir], shm_before)
