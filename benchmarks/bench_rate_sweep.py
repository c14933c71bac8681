"""The rate the monitor reads on a real link, swept over link positions, rates and message sizes.

One ``netlab compare`` job per cell: the synthetic testbed (``train_configs/synthetic_cpu.toml``:
PP = 4, N = 24, F = B = W = 10 ms) under ZBH2 on a netlab of 4 nodes x 1 rank, pipeline link
``p`` (nodes p <-> p+1) limited by ``tc`` (htb) to ``rate`` Mbit/s in both directions on both NICs,
messages of ``size`` KiB (``[morph.synthetic] message_kb``). ZBH2's messages are spaced by compute
and rarely queue, so the rate comes from the monitor's rate probes (:mod:`titan_morph.monitor.rate_probes`)
unless the pipeline's own messages queue. Per cell, printed side by side:

* ``read``: ``morph/bandwidth_mbps/link<p>``, the median over the steps that name a rate, and in
  how many steps after the first ``--skip`` it was named;
* ``TCP``: the payload rate a TCP transfer measured over the limited path just before the job
  (every 1448-byte segment carries 66 bytes of headers: a limit of R Mbit/s carries about 0.96 R);
* ``read / TCP`` and whether it is within ``--tolerance``;
* any rate the monitor named on a link that was not limited (there should be none).

Every job also keeps its exchanged message stamps (``[morph] profiles_file``, ``profiles.jsonl``
in its folder), so a cell that reads wrong can be replayed offline through a fresh monitor
(``benchmarks/replay_profiles.py``) and kept as a test fixture.

    .venv/bin/python benchmarks/bench_rate_sweep.py [--positions 0,1,2] [--rates 12,25,50]
        [--sizes 48,160] [--steps 10] [--logdir outputs/rate_sweep] [--report-only] [--out FILE]

Needs root (network namespaces). Not a test: run it on a quiet host (``uptime`` load < 3).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from bench_emulated_bandwidth import CONFIG  # the same testbed as the emulated-bandwidth benchmark
from logdir_report import run_then_report

from titan_morph.compare.results import read_scalars
from titan_morph.compare.variants import parse_variants
from titan_morph.netlab.compare import CompareOptions, compare
from titan_morph.netlab.lab import Lab
from titan_morph.netlab.run import parse_shape_spec
from titan_morph.netlab.schedule import Event
from titan_morph.netlab.shape import shape, unshape
from titan_morph.netlab.transfer import measure

NODES = 4
PREFIX = "tmsweep"
VARIANT = "ZBH2"
CELL_FILE = "cell.json"
"""In each cell's folder: the cell and its TCP payload rate."""
PROFILES_FILE = "profiles.jsonl"
TCP_SECONDS = 1.5  # a TCP transfer long enough to cross the shaper's burst many times over


@dataclass(frozen=True)
class Cell:
    link: int
    rate: float  # Mbit/s
    size_kb: float

    @property
    def name(self) -> str:
        return f"link{self.link}-{self.rate:g}mbit-{self.size_kb:g}kb"

    @property
    def transmit_ms(self) -> float:
        """One message's time on the wire at the limit (headers left out)."""
        return self.size_kb * 1024 * 8 / (self.rate * 1e3)


def _limits(cell: Cell) -> list[Event]:
    a, b = cell.link, cell.link + 1
    return [parse_shape_spec(f"{x}-{y}:{nic}:{cell.rate:g}") for nic in ("data", "host") for x, y in ((a, b), (b, a))]


def _tcp_mbit(lab: Lab, cell: Cell) -> float:
    """TCP's payload rate over the limited ``data`` path, one way."""
    nbytes = max(2**19, int(cell.rate * 1e6 / 8 * TCP_SECONDS))
    shape(lab, cell.link, cell.link + 1, "data", cell.rate)
    try:
        seconds = measure(lab, cell.link, cell.link + 1, "data", nbytes, 60.0)
    finally:
        unshape(lab, cell.link, cell.link + 1, "data")
    return nbytes * 8 / seconds / 1e6


def run_cell(cell: Cell, opts: argparse.Namespace, logdir: Path) -> None:
    """One job under the cell's limit; the TCP rate is measured on the same lab first."""
    folder = logdir / cell.name
    tcp: dict[str, float] = {}

    def on_lab(lab: Lab) -> None:
        tcp["mbit"] = _tcp_mbit(lab, cell)

    copts = CompareOptions(
        nodes=NODES,
        ranks_per_node=1,
        variants=parse_variants(VARIANT),
        shapes=_limits(cell),
        steps=opts.steps,
        skip=opts.skip,
        train_args=[
            "--morph.synthetic.message_kb",
            f"{cell.size_kb:g}",
            "--morph.profiles_file",
            str((folder / VARIANT / PROFILES_FILE).resolve()),
        ],
        logdir=logdir,
        name=cell.name,
        prefix=PREFIX,
        command=f"benchmarks/bench_rate_sweep.py ({cell.name})",
    )
    (folder / VARIANT).mkdir(parents=True, exist_ok=True)
    (folder / VARIANT / PROFILES_FILE).unlink(missing_ok=True)  # the runtime appends
    started = time.monotonic()
    compare(copts, echo=lambda _: None, on_lab=on_lab)
    record = {"link": cell.link, "rate": cell.rate, "size_kb": cell.size_kb, "tcp_mbit": tcp.get("mbit")}
    (folder / CELL_FILE).write_text(json.dumps(record) + "\n")
    print(f"{cell.name}: done in {time.monotonic() - started:.0f} s; {_row(cell, logdir, opts)}", flush=True)


def _reading(cell: Cell, logdir: Path, opts: argparse.Namespace) -> tuple[float | None, int, int, list[str]]:
    """(median rate read on the limited link, steps that named one, steps after the skip, rates
    named on other links) from the cell's TensorBoard events."""
    scalars = read_scalars(logdir / cell.name / VARIANT)
    values = {s: v for s, v in scalars.get(f"morph/bandwidth_mbps/link{cell.link}", {}).items() if s > opts.skip}
    steps = max((s for tag in scalars.values() for s in tag), default=0)
    others = [
        f"link{i} {statistics.median(vals.values()):.1f}"
        for i in range(NODES - 1)
        if i != cell.link and (vals := scalars.get(f"morph/bandwidth_mbps/link{i}"))
    ]
    read = statistics.median(values.values()) if values else None
    return read, len(values), max(0, steps - opts.skip), others


def _row(cell: Cell, logdir: Path, opts: argparse.Namespace) -> str:
    path = logdir / cell.name / CELL_FILE
    if not path.is_file():
        return f"| {cell.link} | {cell.rate:g} | {cell.size_kb:g} | {cell.transmit_ms:.1f} | not run | | | | | |"
    tcp = json.loads(path.read_text())["tcp_mbit"]
    read, named, steps, others = _reading(cell, logdir, opts)
    ratio = read / tcp if read is not None and tcp else None
    ok = ratio is not None and abs(ratio - 1.0) <= opts.tolerance
    return (
        f"| {cell.link} | {cell.rate:g} | {cell.size_kb:g} | {cell.transmit_ms:.1f} | {tcp:.2f}"
        f" | {'—' if read is None else f'{read:.2f}'} | {named}/{steps}"
        f" | {'—' if ratio is None else f'{ratio:.3f}'} | {'yes' if ok else 'NO'} | {', '.join(others) or 'none'} |"
    )


def report(cells: list[Cell], logdir: Path, opts: argparse.Namespace) -> str:
    rows = [_row(c, logdir, opts) for c in cells]
    within = sum(1 for r in rows if r.split("|")[9].strip() == "yes")
    return "\n".join(
        [
            f"Rate read by the monitor (ZBH2, `morph/bandwidth_mbps/link<p>`, median of steps {opts.skip + 1}-"
            f"{opts.steps} that name one) against TCP's payload rate over the limited path:",
            "",
            "| link | limit Mbit/s | message KiB | size / limit ms | TCP Mbit/s | read Mbit/s | steps naming a rate"
            f" | read / TCP | within {opts.tolerance * 100:g} % | rates named on other links |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---|",
            *rows,
            "",
            f"Within {opts.tolerance * 100:g} %: {within} of {len(cells)} cells.",
        ]
    )


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--positions", default="0,1,2", help="pipeline links to limit, one per cell (default 0,1,2)")
    parser.add_argument("--rates", default="12,25,50", help="Mbit/s (default 12,25,50)")
    parser.add_argument("--sizes", default="48,160", help="message KiB (default 48,160)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per job")
    parser.add_argument("--skip", type=int, default=2, help="first steps left out of the reading")
    parser.add_argument("--tolerance", type=float, default=0.10, help="read / TCP within 1 +- this (default 0.10)")
    parser.add_argument("--logdir", type=Path, help="keep the jobs here (default: a temporary folder)")
    parser.add_argument("--report-only", action="store_true", help="re-read --logdir, run nothing")
    parser.add_argument("--out", type=Path, help="also write the table to this markdown file")
    opts = parser.parse_args()
    if opts.steps <= opts.skip:
        parser.error("--steps must exceed --skip")
    links = [int(x) for x in _floats(opts.positions)]
    if any(not 0 <= p < NODES - 1 for p in links):
        parser.error(f"--positions: pipeline links 0..{NODES - 2}")
    rates, sizes = _floats(opts.rates), _floats(opts.sizes)
    if any(r <= 0 for r in rates) or any(s <= 0 for s in sizes):
        parser.error("--rates and --sizes: positive numbers")
    cells = [Cell(p, r, s) for p in links for r in rates for s in sizes]
    os.environ["CONFIG_FILE"] = str(CONFIG)

    def run(logdir: Path) -> None:
        for cell in cells:
            run_cell(cell, opts, logdir)

    run_then_report("bench_rate_sweep_", opts.logdir, opts.report_only, run, lambda d: report(cells, d, opts), opts.out)


if __name__ == "__main__":
    main()
