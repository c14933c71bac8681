"""docs/results.md: every section that reports figures names the command that made them.

A figure without its command cannot be re-measured; a user reading one section alone must find how
to reproduce it there. A heading that only groups sub-sections (no text of its own) needs none.
"""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results.md"

HEADING = re.compile(r"^#{1,4} ")
# A runnable line: a fenced shell block, or an inline code span (it may wrap) that starts a program
# of ours or torch's. Spans are paired left to right, so prose between two spans never counts.
PROGRAM = re.compile(r"python |\.venv/bin/|run_train\.sh|torchrun|pytest|scripts/\S+\.sh|benchmarks/\S+\.py")
SPAN = re.compile(r"`([^`]+)`")


def names_a_command(body: str) -> bool:
    return "```bash" in body or any(PROGRAM.search(m.group(1)) for m in SPAN.finditer(body.replace("```", "")))


def sections(text: str) -> list[tuple[int, str, str]]:
    """(line number, heading, body) per heading outside code fences."""
    out: list[tuple[int, str, list[str]]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and HEADING.match(line):
            out.append((number, line, []))
        elif out:
            out[-1][2].append(line)
    return [(n, h, "\n".join(body).strip()) for n, h, body in out]


def test_every_section_with_figures_names_its_command() -> None:
    found = sections(RESULTS.read_text())
    assert len(found) > 10, "docs/results.md lost its sections"
    missing = [f"line {n}: {h}" for n, h, body in found if body and not names_a_command(body)]
    assert not missing, "sections without the command that made them:\n" + "\n".join(missing)


def test_the_check_finds_a_section_without_a_command() -> None:
    text = (
        "# A\n\n```bash\npython -m x\n```\n\n# B\n\n`a` ratio 1.02, measured by hand with python `b`\n\n"
        "# C\n\n## D\n\n`flock x .venv/bin/python\nbenchmarks/b.py`\n"
    )
    missing = [h for _, h, body in sections(text) if body and not names_a_command(body)]
    assert missing == ["# B"]
