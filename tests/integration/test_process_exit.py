"""A job's processes end promptly: a finished rank skips the interpreter's teardown but not what an
exit promises (threads joined, exit handlers run, output flushed, its exit code), and the supervisor
that outlives the job imports no torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)},
    )


def test_exit_without_teardown_keeps_what_an_exit_promises_and_skips_the_teardown(tmp_path: Path) -> None:
    got = _run(
        """
        import atexit, os, sys, threading, time
        from pathlib import Path
        from titan_morph.comm.machine.system import exit_without_teardown

        out = Path(os.environ["OUT"])

        class Finalized:
            def __del__(self):  # runs only in the interpreter's teardown of this module
                (out / "teardown").write_text("ran")

        kept = Finalized()

        def late():
            time.sleep(0.3)
            (out / "thread").write_text("joined")

        threading.Thread(target=late).start()  # not a daemon: an exit waits for it
        atexit.register(lambda: (out / "atexit").write_text((out / "thread").read_text()))
        print("buffered", end="")  # no newline, the pipe is block-buffered: only a flush shows it
        sys.stderr.write("to stderr")
        exit_without_teardown(3)
        """,
        tmp_path,
    )
    assert got.returncode == 3, got.stderr
    assert got.stdout == "buffered" and got.stderr == "to stderr"
    assert (tmp_path / "atexit").read_text() == "joined"  # the handler ran after the thread was joined
    assert not (tmp_path / "teardown").exists()


def test_the_supervisor_imports_no_torch(tmp_path: Path) -> None:
    got = _run(
        """
        import sys
        from titan_morph.launch import main

        code = main(["supervise", "--", sys.executable, "-c", "raise SystemExit(5)"])
        print(code, sorted(m for m in ("torch", "torchtitan") if m in sys.modules))
        """,
        tmp_path,
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["5", "[]"]
