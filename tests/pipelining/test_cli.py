"""The planning CLI ``python -m titan_morph.pipelining.plan`` (``cli.py``; in-process via ``main(argv)``,
plus real subprocesses). Run: ``.venv/bin/pytest tests/pipelining/test_cli.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from titan_morph.pipelining.core.model import Op
from titan_morph.pipelining.output.export import read_csv
from titan_morph.pipelining.plan import main

FIG4 = ["--stages", "4", "--microbatches", "12", "--fwd", "10", "--bwd", "10", "--wgt", "10"]

# Fig. 4's straggler-free ZB-H2 pipeline (S=4, N=12, x = 7,5,3,1), torch compute-only CSV.
_ZB_H2_ROWS = []
for _s, _x in enumerate((7, 5, 3, 1)):
    _ops = [f"F{m}" for m in range(_x)]
    _f, _w = _x, 0
    for _i in range(12):
        _ops.append(f"I{_i}")
        _ops.append(f"F{_f}" if _f < 12 else f"W{_w}")
        _f, _w = (_f + 1, _w) if _f < 12 else (_f, _w + 1)
    _ops += [f"W{m}" for m in range(_w, 12)]
    _ZB_H2_ROWS.append(",".join(f"{_s}{op}" for op in _ops))
ZB_H2_CSV = "\n".join(_ZB_H2_ROWS) + "\n"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _json(capsys, *argv: str) -> dict:
    rc, out, err = _run(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


@pytest.fixture
def zb_h2_csv(tmp_path: Path) -> Path:
    path = tmp_path / "zb-h2.csv"
    path.write_text(ZB_H2_CSV)
    return path


def test_load_csv_fig4_and_fig5(capsys, zb_h2_csv: Path) -> None:
    """Fixed ZB-H2 orders: 390 ms without delay, 440 ms with a 20 ms straggler on link 0 (§3.1)."""
    d = _json(capsys, "--load-csv", str(zb_h2_csv))
    assert d["makespan_ms"] == pytest.approx(390.0) and d["planned_makespan_ms"] == pytest.approx(390.0)
    assert d["warmup"] == [7, 5, 3, 1] and d["slackness"] == [2, 2, 2] and d["stages"] == 4
    d = _json(capsys, "--load-csv", str(zb_h2_csv), "--run-delays", "20,0,0")
    assert d["makespan_ms"] == pytest.approx(440.0) and d["planned_makespan_ms"] == pytest.approx(390.0)
    d = _json(capsys, "--load-csv", str(zb_h2_csv), "--run-delays", "10,0,0")
    assert d["makespan_ms"] == pytest.approx(400.0)


def test_json_fields_zb_h2(capsys) -> None:
    d = _json(capsys, *FIG4, "--schedule", "zb-h2")
    assert d["warmup"] == [7, 5, 3, 1]
    assert d["slackness"] == [2, 2, 2]
    assert d["makespan_ms"] == pytest.approx(390.0)
    assert d["planned_makespan_ms"] == pytest.approx(390.0)
    assert d["bubble_rate"] == pytest.approx(sum(d["stage_bubble_rate"]) / 4)
    assert isinstance(d["plan_id"], str) and len(d["plan_id"]) == 12
    assert sorted(d["orders"]) == ["0", "1", "2", "3"]
    for ops in d["orders"].values():
        assert len(ops) == 36 and sorted(ops) == sorted(f"{k}{m}" for k in "FIW" for m in range(12))
    assert d["orders"]["3"][:2] == ["F0", "I0"]


def test_fig5_fixed_zb_h2_under_run_delays(capsys) -> None:
    d = _json(capsys, *FIG4, "--schedule", "zb-h2", "--run-delays", "20,0,0")
    assert d["makespan_ms"] == pytest.approx(440.0)
    assert d["planned_makespan_ms"] == pytest.approx(390.0)
    assert d["run_delays_ms"] == [20.0, 0.0, 0.0] and d["delays_ms"] == [0.0, 0.0, 0.0]


def test_pipemorph_plans_for_the_delay(capsys) -> None:
    """Planned for a 20 ms straggler on link 0, PipeMorph beats fixed ZB-H2 orders (440 ms)."""
    for extra in ([], ["--no-search"]):
        d = _json(capsys, *FIG4, "--schedule", "pipemorph", "--delays", "20,0,0", *extra)
        assert d["makespan_ms"] == pytest.approx(d["planned_makespan_ms"])  # run delays default to planning ones
        assert d["makespan_ms"] < 440.0
        assert d["slackness"][0] >= 2


@pytest.mark.parametrize("schedule", ["1f1b", "1f1b-iw", "gpipe", "zb-h1", "zb-h2", "pipemorph"])
def test_summary_is_readable(capsys, schedule: str) -> None:
    rc, out, err = _run(capsys, *FIG4, "--schedule", schedule, "--delays", "0,5,0", "--show-orders")
    assert rc == 0, err
    for needle in ("x_i", "Eq.1 tolerance", "makespan", "critical path", "Rank 3", f"schedule {schedule}"):
        assert needle in out


def test_output_files(capsys, tmp_path: Path, zb_h2_csv: Path) -> None:
    png, trace, csv = tmp_path / "t.png", tmp_path / "t.json", tmp_path / "out.csv"
    d = _json(
        capsys,
        "--load-csv",
        str(zb_h2_csv),
        "--run-delays",
        "20,0,0",
        "--depth",
        "1",
        "--png",
        str(png),
        "--chrome-trace",
        str(trace),
        "--csv",
        str(csv),
    )
    assert d["files"] == {"csv": str(csv), "png": str(png), "chrome_trace": str(trace)}
    import matplotlib.image

    img = matplotlib.image.imread(png)
    assert img.ndim == 3 and img.shape[1] > 600 and img[..., :3].std() > 0.05
    events = json.loads(trace.read_text())["traceEvents"]
    ops = [e for e in events if e["ph"] == "X" and e.get("cat") in ("F", "I", "W", "B")]
    assert len(ops) == 3 * 12 * 4
    assert d["depth"] == 1 and d["blocked_ms"][0] > 0
    assert sum(e["dur"] for e in events if e.get("cat") == "blocked") / 1000 == pytest.approx(sum(d["blocked_ms"]))
    assert read_csv(csv) == tuple(tuple(Op.parse(t) for t in d["orders"][str(s)]) for s in range(4))
    assert csv.read_text().replace("\r\n", "\n") == ZB_H2_CSV


def test_csv_from_builder_reads_back(capsys, tmp_path: Path) -> None:
    csv = tmp_path / "p.csv"
    d = _json(capsys, *FIG4, "--schedule", "pipemorph", "--delays", "0,30,0", "--csv", str(csv))
    assert [[str(op) for op in order] for order in read_csv(csv)] == [d["orders"][str(s)] for s in range(4)]
    d2 = _json(capsys, "--load-csv", str(csv), "--delays", "0,30,0")
    assert d2["makespan_ms"] == pytest.approx(d["makespan_ms"]) and d2["warmup"] == d["warmup"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--stages", "4", "--microbatches", "12", "--fwd", "10,10,10"], "--fwd needs 1 or 4 values"),
        (["--stages", "4", "--microbatches", "12", "--bwd", "10,x,1,1"], "--bwd: 'x' is not a number"),
        (["--stages", "4", "--microbatches", "12", "--wgt", "-1"], "--wgt: -1 is out of range: values must be >= 0"),
        (
            ["--stages", "4", "--microbatches", "12", "--delays", "0,-5,0"],
            "--delays: -5 is out of range: values must be >= 0",
        ),
        (["--stages", "4", "--microbatches", "12", "--delays", "0,1"], "--delays needs 3 values"),
        (["--stages", "4", "--microbatches", "12", "--delays", "0,inf,0"], "link 1 (1<->2) is down (inf)"),
        (
            ["--stages", "4", "--microbatches", "12", "--memory", "0"],
            "--memory: 0 is out of range: values must be >= 1",
        ),
        (["--stages", "4", "--microbatches", "12", "--memory", "2,2"], "--memory needs 1 or 4 values"),
        (["--stages", "4", "--microbatches", "12", "--depth", "0"], "--depth must be >= 1"),
        (["--stages", "0", "--microbatches", "12"], "--stages must be >= 1"),
        (["--microbatches", "12"], "--stages and --microbatches are required"),
        (
            ["--stages", "4", "--microbatches", "12", "--schedule", "nope"],
            "argument --schedule: unknown schedule 'nope': choose one of 1f1b,",
        ),
        (["--stages", "4", "--microbatches", "12", "--search-iterations", "-1"], "--search-iterations must be >= 0"),
        (["--stages", "4", "--microbatches", "12", "--schedule", "zb-h2", "--search-iterations", "5"], "apply to"),
        (["--stages", "4", "--microbatches", "12", "--no-search", "--plan-random", "30,10"], "need the search"),
        (["--stages", "4", "--microbatches", "12", "--plan-random", "30"], "--plan-random: expected MEAN,STD"),
        (["--stages", "4", "--microbatches", "12", "--plan-random", "30,-1"], "--plan-random: -1 is out of range"),
        (
            ["--stages", "4", "--microbatches", "12", "--plan-random", "30,10", "--samples", "0"],
            "--samples must be >= 1",
        ),
        (["--stages", "4", "--microbatches", "12", "--plan-random", "30,10", "--delays", "0"], "exclude each other"),
        (["--stages", "4", "--microbatches", "12", "--plan-random", "30,10", "--depth", "1"], "drop --depth"),
        (["--load-csv", "/nonexistent/x.csv"], "--load-csv: cannot read /nonexistent/x.csv"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, argv: list[str], needle: str) -> None:
    rc, out, err = _run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("python -m titan_morph.pipelining.plan: error: ")
    assert needle in err


def test_memory_below_schedule_need(capsys) -> None:
    rc, _, err = _run(capsys, *FIG4, "--schedule", "zb-h2", "--memory", "3")
    assert rc == 2 and err.count("\n") == 1
    assert "--memory 3" in err and "zb-h2" in err and "stage 0 needs 7" in err and "M_0 = 3" in err


def test_run_delay_inf_means_link_down(capsys, zb_h2_csv: Path) -> None:
    rc, _, err = _run(capsys, "--load-csv", str(zb_h2_csv), "--run-delays", "0,0,inf")
    assert rc == 2 and "link 2" in err and "down" in err and "cannot complete" in err


def test_load_csv_errors(capsys, tmp_path: Path, zb_h2_csv: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0B0\n1F0,1Q0\n")
    rc, _, err = _run(capsys, "--load-csv", str(bad))
    assert rc == 2 and "line 2, token 2 '1Q0'" in err
    rc, _, err = _run(capsys, "--load-csv", str(zb_h2_csv), "--stages", "3")
    assert rc == 2 and "--stages 3 disagrees" in err
    rc, _, err = _run(capsys, "--load-csv", str(zb_h2_csv), "--memory", "4")
    assert rc == 2 and "exceeds the memory budget" in err
    rc, _, err = _run(capsys, "--load-csv", str(zb_h2_csv), "--schedule", "zb-h1")
    assert rc == 2 and "exclude each other" in err
    stuck = tmp_path / "stuck.csv"  # stage 0 waits for B0's gradient before sending F1, stage 1 wants F1 first
    stuck.write_text("0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n")
    rc, _, err = _run(capsys, "--load-csv", str(stuck))
    assert rc == 2 and "deadlock" in err


def test_subprocess_entry_point(zb_h2_csv: Path) -> None:
    cmd = [sys.executable, "-m", "titan_morph.pipelining.plan"]
    res = subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "--run-delays" in res.stdout and "--load-csv" in res.stdout
    res = subprocess.run(
        cmd + ["--load-csv", str(zb_h2_csv), "--run-delays", "20,0,0", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["makespan_ms"] == pytest.approx(440.0)
    res = subprocess.run(
        cmd + ["--stages", "4", "--microbatches", "2", "--fwd", "1,2"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--fwd needs 1 or 4 values" in res.stderr


def test_run_trace_by_step(capsys, tmp_path: Path, zb_h2_csv: Path) -> None:
    """Fixed ZB-H2 orders under a step-keyed trace: 20 ms on link 0 from step 3 to step 5 (§7.5 style)."""
    trace = tmp_path / "trace.csv"
    trace.write_text("step,link,delay_ms\n3,0,20\n5,0,0\n")
    got = {
        step: _json(capsys, "--load-csv", str(zb_h2_csv), "--run-trace", str(trace), "--step", str(step))
        for step in (0, 3, 4, 5)
    }
    assert [got[s]["makespan_ms"] for s in (0, 3, 4, 5)] == pytest.approx([390.0, 440.0, 440.0, 390.0])
    assert got[3]["run_delays_ms"] == [20.0, 0.0, 0.0] and got[3]["step"] == 3
    assert got[3]["run_links"].startswith("trace ")


def test_run_random_is_deterministic_and_traced(capsys, tmp_path: Path, zb_h2_csv: Path) -> None:
    trace = tmp_path / "t.json"
    args = ["--load-csv", str(zb_h2_csv), "--run-random", "20,10,30,60,7"]
    a = _json(capsys, *args, "--chrome-trace", str(trace))
    b = _json(capsys, *args)
    assert a["makespan_ms"] == b["makespan_ms"] > 390.0
    assert a["run_links"].startswith("random N(20, 10)")
    delays = {round(e["args"]["delay_ms"], 6) for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "b"}
    assert len(delays) > 3  # per-message delays vary with time
    c = _json(capsys, *args[:-1], "20,10,30,60,8")
    assert c["makespan_ms"] != a["makespan_ms"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--run-random", "1,2,3"], "--run-random: expected MEAN,STD,LOW,HIGH[,SEED], got 3 values"),
        (["--run-random", "1,2,0,3"], "--run-random: interval must satisfy 0 < low <= high"),
        (["--run-random", "1,2,3,4", "--run-delays", "0"], "--run-delays and --run-random exclude each other"),
        (["--run-trace", "/nonexistent/t.csv"], "--run-trace: cannot read /nonexistent/t.csv"),
        (["--step", "-1"], "--step must be >= 0"),
    ],
)
def test_bad_run_link_model(capsys, zb_h2_csv: Path, extra: list[str], needle: str) -> None:
    rc, _, err = _run(capsys, "--load-csv", str(zb_h2_csv), *extra)
    assert rc == 2 and err.count("\n") == 1 and needle in err


@pytest.mark.parametrize("spelling", ["ZBH2", "zb-h2", "ZB_H2", "Zb-H2"])
def test_schedule_names_any_spelling(capsys, spelling: str) -> None:
    d = _json(capsys, *FIG4, "--schedule", spelling)
    assert d["schedule"] == "zb-h2" and d["makespan_ms"] == pytest.approx(390.0)


def test_search_iterations_fix_the_plan_and_report_planning_ms(capsys) -> None:
    args = [*FIG4, "--fwd", "9,11,10,12", "--delays", "0,25,5", "--memory", "6"]
    runs = [_json(capsys, *args, "--search-iterations", str(k)) for k in (0, 0, 40, 200)]
    assert runs[0]["plan_id"] == runs[1]["plan_id"]
    spans = [r["makespan_ms"] for r in runs]
    assert spans[1] >= spans[2] >= spans[3]
    for r in runs:
        assert r["planning_ms"] > 0 and r["expected_makespan_ms"] is None
    assert runs[2]["search_iterations"] == 40
    baseline = _json(capsys, *args, "--schedule", "1f1b")
    assert baseline["planning_ms"] > 0 and spans[0] <= baseline["makespan_ms"]


def test_plan_random_reports_the_expected_makespan(capsys, tmp_path: Path) -> None:
    from titan_morph.pipelining.search.robust import sample_delays

    args = [*FIG4, "--plan-random", "30,10", "--samples", "16", "--seed", "3", "--search-iterations", "20"]
    d = _json(capsys, *args)
    samples = sample_delays(30.0, 10.0, links=3, samples=16, seed=3)
    mean = [sum(v[i] for v in samples) / 16 for i in range(3)]
    assert d["delays_ms"] == pytest.approx(mean) and d["planning_samples"] == 16
    assert d["expected_makespan_ms"] > 360.0 and d["planning_ms"] > 0
    assert d == {**_json(capsys, *args), "planning_ms": d["planning_ms"]}  # deterministic for a seed
    path = tmp_path / "samples.csv"
    path.write_text("# link0,link1,link2\n" + "\n".join(",".join(f"{x:.6f}" for x in v) for v in samples) + "\n")
    e = _json(capsys, *FIG4, "--plan-samples", str(path), "--search-iterations", "20")
    assert e["orders"] == d["orders"] and e["expected_makespan_ms"] == pytest.approx(d["expected_makespan_ms"])
    # The loaded orders of a baseline get their expected makespan over the same samples.
    csv = tmp_path / "zb.csv"
    _json(capsys, *FIG4, "--schedule", "zb-h2", "--csv", str(csv))
    z = _json(capsys, "--load-csv", str(csv), "--plan-samples", str(path))
    assert z["expected_makespan_ms"] > d["expected_makespan_ms"]


def test_plan_random_in_the_v_plans_with_pipemorph_v(capsys) -> None:
    v = ["--stages", "3", "--microbatches", "6", "--fwd", "5", "--bwd", "5", "--wgt", "5", "--schedule", "pipemorph-v"]
    d = _json(capsys, *v, "--plan-random", "30,10", "--samples", "4", "--search-iterations", "10")
    assert d["planning_samples"] == 4 and d["expected_makespan_ms"] >= d["lower_bound_ms"] > 0


def test_module_entry_points(zb_h2_csv: Path) -> None:
    for module in ("titan_morph.pipelining.plan", "titan_morph.pipelining.cli.plan"):
        res = subprocess.run(
            [sys.executable, "-m", module, "--load-csv", str(zb_h2_csv), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["makespan_ms"] == pytest.approx(390.0)


def test_json_reports_the_lower_bound_on_any_schedule(capsys) -> None:
    """``lower_bound_ms``: the closed form under static run delays (memory budget counted), the
    time-varying bound under --run-random; never above the plan's makespan."""
    zb = _json(capsys, *FIG4, "--schedule", "zb-h2", "--run-delays", "0,0,60")
    # the first forward reaches the last rank at 30 + 60 ms, which then works 12 x 30 ms
    assert zb["lower_bound_ms"] == pytest.approx(450.0) and zb["makespan_ms"] > zb["lower_bound_ms"]
    pm = _json(capsys, *FIG4, "--delays", "0,0,60")
    assert pm["lower_bound_ms"] == pytest.approx(450.0) and pm["makespan_ms"] >= 450.0
    rnd = _json(capsys, *FIG4, "--delays", "30", "--run-random", "30,10,100,200,1")
    assert 0 < rnd["lower_bound_ms"] <= rnd["makespan_ms"]
    rc, out, _ = _run(capsys, *FIG4, "--delays", "30", "--run-random", "30,10,100,200,1")
    assert rc == 0 and "lower bound on any schedule under these delays" in out
