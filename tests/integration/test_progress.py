"""Progress of long commands (comparisons, benchmarks): job i of n, elapsed time, estimate left."""

from __future__ import annotations

from titan_morph.compare.runner import Progress


def test_progress_counts_jobs_and_estimates_from_the_mean_job_time():
    now = [0.0]
    lines: list[str] = []
    progress = Progress(4, lines.append, clock=lambda: now[0])
    progress.start("fig16/last-60ms ZBH2")
    now[0] = 30.0
    progress.done("fig16/last-60ms ZBH2")
    progress.start("fig16/last-60ms PipeMorph")
    now[0] = 90.0
    progress.done("fig16/last-60ms PipeMorph", "failed at step 3: LinkDownError")
    progress.start("fig16/none ZBH2")
    now[0] = 100.0
    progress.done("fig16/none ZBH2")
    progress.start("fig16/none PipeMorph")
    now[0] = 3700.0
    progress.done("fig16/none PipeMorph")
    assert lines == [
        "[job 1/4] fig16/last-60ms ZBH2 ... (elapsed 0 s, estimate after the first job)",
        "[job 1/4] fig16/last-60ms ZBH2: ok (30 s; elapsed 30 s, about 1m30s left)",
        "[job 2/4] fig16/last-60ms PipeMorph ... (elapsed 30 s, about 1m30s left)",
        "[job 2/4] fig16/last-60ms PipeMorph: failed at step 3: LinkDownError (1m00s; elapsed 1m30s, about 1m30s left)",
        "[job 3/4] fig16/none ZBH2 ... (elapsed 1m30s, about 1m30s left)",
        "[job 3/4] fig16/none ZBH2: ok (10 s; elapsed 1m40s, about 33 s left)",
        "[job 4/4] fig16/none PipeMorph ... (elapsed 1m40s, about 33 s left)",
        "[job 4/4] fig16/none PipeMorph: ok (1h00m; elapsed 1h01m, all done)",
    ]
