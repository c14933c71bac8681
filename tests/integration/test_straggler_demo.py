"""The straggler demo (train_configs/straggler_demo_cpu.toml) as a real 4-rank run, shortened: the
60 ms link is detected, planned around and delegated, recovers, and the run ends with its summary.
Only what is deterministic is asserted (the simulator's ZB-H2 and the lower bound, the links named),
never the measured times."""

from __future__ import annotations

import re

import pytest

from tests.launch import REPO, torchrun

CONFIG = REPO / "train_configs" / "straggler_demo_cpu.toml"


@pytest.mark.slow  # test_adaptation.py covers the same path in CI, on shorter windows
def test_demo_detects_adapts_recovers_and_summarises(tmp_path, no_leftovers) -> None:
    # 60 ms on link 2 during steps 4-9: detected after k = 3 slow steps, recovered after 5 healthy
    # ones (2 steps to spare)
    result = torchrun(
        4,
        tmp_path / "demo",
        "--training.steps",
        "18",
        "--morph.inject.start_step",
        "4",
        "--morph.inject.end_step",
        "9",
        config=CONFIG,
        timeout_s=300,
    )
    assert result.returncode == 0, result.tail()
    out = result.output
    assert re.search(r"titan_morph: step \d+: link 2 slow: .*delegated links \[2\]", out), result.tail()
    assert re.search(r"titan_morph: step \d+: link 2 recovered: .*delegated links \[\]", out), result.tail()
    lines = {
        m.group(1): m.group(0) for m in re.finditer(r"titan_morph:\s+(before|during|adapted|after)\s+steps.*", out)
    }
    assert set(lines) == {"before", "during", "adapted", "after"}, result.tail()
    # ZB-H2's fixed orders under 60 ms on the last link take 1580 ms in the simulator; no schedule
    # beats 30 + 60 ms to the last rank plus its 24 x 30 ms of work (810 ms), or 750 ms without delay
    for phase in ("during", "adapted"):
        assert "ZB-H2    1580 ms" in lines[phase] and "bound   810 ms" in lines[phase], lines[phase]
    for phase in ("before", "after"):
        assert "ZB-H2     750 ms" in lines[phase] and "bound   750 ms" in lines[phase], lines[phase]
    assert "delegated links [2]" in lines["adapted"]
    assert "titan_morph:   plan changes made by the monitor: 2" in out
    no_leftovers(tmp_path)
