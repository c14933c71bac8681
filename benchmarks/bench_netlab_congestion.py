"""Real congestion on the lab: 1F1B, ZBH2 and PipeMorph side by side under a kernel rate limit.

The synthetic testbed (``train_configs/synthetic_cpu.toml``: PP=4, N=24, F=B=W=10 ms) on a netlab
of 4 nodes x 1 rank, one job per variant on one lab (``netlab compare``). Link 2 (nodes 2 <-> 3)
is limited by ``tc`` (htb) to ``--rate`` Mbit/s in both directions on both NICs (``data``: the
per-link groups; ``host``: the delegates, and torch's own groups, which carry the default
transport of torch's schedules), so every transport of that link crosses the same limit and only
head-of-line blocking differs between them. The lab's NICs send segments of one
1514-byte frame (``netlab.lab.GSO_MAX_BYTES``): htb lets a whole segment through on credit, so
with the kernel's 64 KiB segments a message spaced out by compute crosses at line rate and the
limit only holds on average (measured: the runs come out faster than size / rate allows).
Messages are ``[morph.synthetic] message_kb``: with
64 KiB at 20 Mbit/s one message takes 26 ms on the wire (2.6 forwards) and the link's 24 messages
per direction and step (629 ms) still fit in a step.

Comparisons (each one ``netlab compare`` folder under ``--logdir``):

* ``unshaped``: ZBH2 and PipeMorph without limits: each one's own unshaped time, and the base
  latency per message (the monitor's ``morph/delay_ms`` median over the links) the simulated
  links carry;
* ``shaped``: 1F1B, ZBH2, PipeMorph under the limit from the first step. PipeMorph's initial plan
  knows nothing of the limit (no emulated links): the monitor detects the slow link, re-plans for
  its measured latency and transmit time and delegates it (``transport = auto``, ``adapt``);
* ``shaped-delegate``: ZBH2 with ``--morph.transport delegate`` under the same limit (the
  head-of-line cost of the blocking default path, the paper's Fig. 15 gap);
* ``shaped-planned`` / ``shaped-replan``: PipeMorph on the default path, its initial plan told
  the link's delay (``--morph.plan_delays_ms`` = size / rate, ``adapt`` off), and re-planning
  after detection without delegation (``PipeMorph-replan``);
* ``trace``: ZBH2 and PipeMorph under netlab schedule rows that change the rate during the run
  (by training step);
* ``rate-2`` .. ``rate-<repeats>``: ZBH2 again under the limit (with ``shaped``'s, ``--repeats``
  runs): the rate the monitor reads on the default path (``morph/bandwidth_mbps``, its rate probes:
  ZBH2's messages never queue) against TCP's payload rate, run by run;
* ``sweep-<latency>-<transmit>``: the best achievable on this link, measured: PipeMorph's static
  plan for a grid of link latencies and transmit times (``--morph.plan_delays_ms`` /
  ``plan_transmit_ms``, ``adapt`` off), on the default path and on the delegates, beside what
  ``auto`` (``shaped``'s PipeMorph) converged to.

Printed: measured step time (``morph/pipeline_ms`` for titan_morph's schedules, TorchTitan's step
time for torch's 1F1B; medians after warm-up), the simulator's prediction on the link model of
the limit (transmit = bytes x 8 / rate, plus the measured base latency; again at the payload rate
TCP measured over the limited path, which counts the packets' headers), the monitor's own model
of each step (``morph/modelled_ms``: the running plan simulated on the links as the monitor
measured them in that step, per direction, with each rank's host time between ops: no parameter
taken from step times) and measured / each, ZBH2 / PipeMorph, PipeMorph shaped / unshaped,
``morph/bound_ms`` (any schedule's lower bound on the measured links), the monitor's per-message
delay and rate against size / rate, the steps until the link was detected slow, ZBH2 default /
delegate, the trace's per-phase times, the rate runs, the sweep, and a TCP transfer over the
limited path.

    .venv/bin/python benchmarks/bench_netlab_congestion.py [--rate 20] [--message-kb 64] [--steps 16]
        [--repeats 5] [--logdir outputs/netlab_congestion] [--report-only]

Needs root (network namespaces). Not a test: timings depend on the host's load (run it with
``uptime`` load < 3; rerun rather than tune).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from bench_emulated_bandwidth import CONFIG  # the same testbed as the emulated-bandwidth benchmark
from logdir_report import run_then_report

from titan_morph.compare.results import PIPELINE_TAG, STEP_TIME_TAG, read_scalars
from titan_morph.compare.variants import parse_variants
from titan_morph.netlab.compare import CompareOptions, compare
from titan_morph.netlab.lab import Lab
from titan_morph.netlab.run import parse_shape_spec
from titan_morph.netlab.schedule import Event
from titan_morph.netlab.shape import shape, unshape
from titan_morph.netlab.transfer import measure

LINK = 2
NODES = 4
PREFIX = "tmcong"
MODELLED_TAG = "morph/modelled_ms"
TCP_FILE = "tcp.json"
"""In ``--logdir``: a TCP transfer over the limited path (seconds, payload Mbit/s)."""


def _limits(rate: float) -> list[Event]:
    a, b = LINK, LINK + 1
    return [parse_shape_spec(f"{x}-{y}:{nic}:{rate:g}") for nic in ("data", "host") for x, y in ((a, b), (b, a))]


def _trace(rates: list[tuple[int, float]]) -> list[Event]:
    """Rows at training steps: every path of the limited link set to the rate (0 = none)."""
    a, b = LINK, LINK + 1
    return [
        Event(0.0, x, y, nic, rate, step=step)
        for step, rate in rates
        for nic in ("data", "host")
        for x, y in ((a, b), (b, a))
    ]


def _mean_pipeline(scalars: dict[str, dict[int, float]]) -> float | None:
    """The mean of a run's steps after the first (titan_morph's pipeline span, else the step)."""
    values = scalars.get(PIPELINE_TAG) or scalars.get(STEP_TIME_TAG) or {}
    kept = [v for s, v in values.items() if s >= 2]
    return statistics.fmean(kept) if kept else None


def _median(values: dict[int, float], first: int, last: int | None = None) -> float | None:
    kept = [v for s, v in values.items() if s >= first and (last is None or s <= last)]
    return statistics.median(kept) if kept else None


def _measured(scalars: dict[str, dict[int, float]], first: int, last: int | None = None) -> tuple[float | None, str]:
    """The pipeline's span where the schedule reports it (titan_morph's), else the whole step."""
    if PIPELINE_TAG in scalars:
        return _median(scalars[PIPELINE_TAG], first, last), "pipeline"
    step = {s: v * 1e3 for s, v in scalars.get(STEP_TIME_TAG, {}).items()}
    return _median(step, first, last), "step"


def _detected(scalars: dict[str, dict[int, float]], since: int) -> int | None:
    """Steps from ``since`` until ``morph/straggling/link<LINK>`` first reads 1 (1 = that step)."""
    flags = scalars.get(f"morph/straggling/link{LINK}", {})
    hits = sorted(s for s, v in flags.items() if s >= since and v > 0.5)
    return hits[0] - since + 1 if hits else None


def _run(opts: argparse.Namespace, logdir: Path, base_latency: float, tcp: dict[str, float]) -> None:
    """The four comparisons, one lab each."""
    os.environ["CONFIG_FILE"] = str(CONFIG)
    common = ["--morph.synthetic.message_kb", f"{opts.message_kb:g}"]

    def lab_compare(name: str, variants: str, shapes: list[Event], schedule: list[Event], extra: list[str]) -> None:
        def on_lab(lab: Lab) -> None:
            if name == "shaped":  # the limit as TCP sees it, once
                shape(lab, LINK, LINK + 1, "data", opts.rate)
                nbytes = 2 * 2**20
                tcp["seconds"] = measure(lab, LINK, LINK + 1, "data", nbytes, 60.0)
                tcp["mbit"] = nbytes * 8 / tcp["seconds"] / 1e6
                unshape(lab, LINK, LINK + 1, "data")
                logdir.mkdir(parents=True, exist_ok=True)
                (logdir / TCP_FILE).write_text(json.dumps(tcp) + "\n")

        copts = CompareOptions(
            nodes=NODES,
            ranks_per_node=1,
            variants=parse_variants(variants),
            shapes=shapes,
            schedule=schedule,
            steps=opts.steps,
            skip=opts.skip,
            train_args=[*common, *extra],
            logdir=logdir,
            name=name,
            base_latency_ms=base_latency,
            prefix=PREFIX,
            command=f"benchmarks/bench_netlab_congestion.py ({name})",
        )
        markdown, _ = compare(copts, on_lab=on_lab)
        print(markdown, flush=True)

    limits = _limits(opts.rate)
    if "unshaped" in opts.only:
        lab_compare("unshaped", "ZBH2,PipeMorph", [], [], [])
    base_latency = _base_latency(logdir, opts.skip) if opts.base_latency is None else opts.base_latency
    if "shaped" in opts.only:
        lab_compare("shaped", "1F1B,ZBH2,PipeMorph", limits, [], [])
        lab_compare("shaped-delegate", "ZBH2", limits, [], ["--morph.transport", "delegate"])
    if "planned" in opts.only:  # PipeMorph on the default path: told the link's delay, or re-planning
        delays = ["0"] * (NODES - 1)
        delays[LINK] = f"{opts.message_kb * 1024 * 8 / (opts.rate * 1e3):.1f}"
        lab_compare("shaped-planned", "PipeMorph-noadapt", limits, [], ["--morph.plan_delays_ms", ",".join(delays)])
        lab_compare("shaped-replan", "PipeMorph-replan", limits, [], [])
    if "trace" in opts.only:
        lab_compare("trace", "ZBH2,PipeMorph", [], _trace(_trace_rows(opts)), [])
    if "rate" in opts.only:
        for run in range(2, opts.repeats + 1):
            lab_compare(f"rate-{run}", "ZBH2", limits, [], [])
    if "sweep" in opts.only:
        for latency, transmit in _sweep_grid(opts, logdir, tcp):
            plan = ["0"] * (NODES - 1), ["0"] * (NODES - 1)
            plan[0][LINK], plan[1][LINK] = f"{latency:g}", f"{transmit:g}"
            extra = ["--morph.plan_delays_ms", ",".join(plan[0])]
            extra += ["--morph.plan_transmit_ms", ",".join(plan[1])] if transmit else []
            lab_compare(_sweep_name(latency, transmit), "PipeMorph-noadapt,PipeMorph-CPU", limits, [], extra)


SWEEP_LATENCY_MS = (0.0, 20.0, 50.0, 100.0)


def _sweep_grid(opts: argparse.Namespace, logdir: Path, tcp: dict[str, float]) -> list[tuple[float, float]]:
    """(latency, transmit) per plan of the sweep: the latencies of :data:`SWEEP_LATENCY_MS`, each
    without a transmit time and with one message's time at TCP's payload rate (else the limit's)."""
    if not tcp and (logdir / TCP_FILE).is_file():
        tcp.update(json.loads((logdir / TCP_FILE).read_text()))
    mbit = tcp.get("mbit", opts.rate)
    tau = round(opts.message_kb * 1024 * 8 / (mbit * 1e3), 1)
    return [(lat, tx) for lat in SWEEP_LATENCY_MS for tx in (0.0, tau)]


def _sweep_name(latency: float, transmit: float) -> str:
    return f"sweep-{latency:g}-{transmit:g}"


def _trace_rows(opts: argparse.Namespace) -> list[tuple[int, float]]:
    q = opts.steps // 4
    return [(q, opts.rate), (2 * q, opts.rate * 2), (3 * q, 0.0)]


def _base_latency(logdir: Path, skip: int) -> float:
    """Per-message delay of an unlimited link: the monitor's ``morph/delay_ms`` median over links."""
    values = []
    for variant in ("ZBH2", "PipeMorph"):
        scalars = read_scalars(logdir / "unshaped" / variant)
        for link in range(NODES - 1):
            med = _median(scalars.get(f"morph/delay_ms/link{link}", {}), skip + 1)
            if med is not None:
                values.append(med)
    return statistics.median(values) if values else 0.0


def _simulated(logdir: Path, name: str) -> dict[str, float | None]:
    meta = json.loads((logdir / name / "comparison.json").read_text())
    return {r["variant"]: r["simulated_ms"] for r in meta["runs"]}


def _simulated_at(logdir: Path, name: str, rate: float) -> dict[str, float | None]:
    """The simulated column again, the limited link at ``rate`` (the payload rate TCP measured:
    the wire's bytes include the headers of every packet)."""
    from titan_morph.netlab.compare import plan_runs

    meta = json.loads((logdir / name / "comparison.json").read_text())
    os.environ["CONFIG_FILE"] = str(CONFIG)
    copts = CompareOptions(
        nodes=NODES,
        ranks_per_node=1,
        variants=parse_variants(",".join(meta["variants"])),
        shapes=_limits(rate),
        steps=int(meta["steps"]),
        skip=int(meta["skip"]),
        train_args=list(meta["extra"]),
        base_latency_ms=float(meta["lab"]["base_latency_ms"]),
        prefix=PREFIX,
    )
    return {r.variant.name: r.simulated_ms for r in plan_runs(copts)[1]}


def _bound_under_limit(opts: argparse.Namespace, base: float) -> float:
    """Any schedule's lower bound (``pipelining.timing.bounds.lower_bound_under``, what ``morph/bound_ms``
    is for emulated links) under the link model of the limit: the runtime's own figure cannot know
    a kernel limit, so on the lab it is the compute-only bound."""
    from titan_morph.compare.configs import resolve_settings
    from titan_morph.config.links import configured_message_bytes, link_model
    from titan_morph.integration.plans import cost_model
    from titan_morph.pipelining.timing.bounds import lower_bound_under

    rates = ["0"] * (NODES - 1)
    rates[LINK] = f"{opts.rate:g}"
    args = ["--morph.synthetic.message_kb", f"{opts.message_kb:g}", "--morph.inject.mode", "static"]
    args += ["--morph.inject.delays_ms", f"{base:g}", "--morph.inject.bandwidth_mbit", ",".join(rates)]
    settings = resolve_settings(CONFIG, args)
    links = link_model(settings.morph.inject, NODES - 1, message_bytes=configured_message_bytes(settings))
    assert links is not None
    model = cost_model(settings.morph, settings.stages, settings.microbatches, memory=False)
    return lower_bound_under(model, links, step=opts.skip + 1)


def report(opts: argparse.Namespace, logdir: Path, tcp: dict[str, float]) -> str:
    tau = opts.message_kb * 1024 * 8 / (opts.rate * 1e3)
    first = opts.skip + 1
    out: list[str] = []
    base = _base_latency(logdir, opts.skip)
    shaped_meta = logdir / "shaped" / "comparison.json"
    if shaped_meta.is_file():  # the latency the shaped runs' simulated column was computed with
        base = float(json.loads(shaped_meta.read_text())["lab"]["base_latency_ms"])
    tb = {
        (name, v): read_scalars(logdir / name / v)
        for name, variants in (
            ("unshaped", ("ZBH2", "PipeMorph")),
            ("shaped", ("1F1B", "ZBH2", "PipeMorph")),
            ("shaped-delegate", ("ZBH2",)),
            ("shaped-planned", ("PipeMorph-noadapt",)),
            ("shaped-replan", ("PipeMorph-replan",)),
            ("trace", ("ZBH2", "PipeMorph")),
        )
        for v in variants
        if (logdir / name / v / "tb").is_dir()
    }
    out.append(
        f"Link {LINK}-{LINK + 1} limited to {opts.rate:g} Mbit/s (htb, both directions, data and host NICs);"
        f" {opts.message_kb:g} KiB messages: size / rate = {tau:.2f} ms each ({tau / 10:.1f} forwards);"
        f" medians of steps {first}-{opts.steps}; base latency per message (unshaped, monitor) {base:.2f} ms."
    )
    if not tcp and (logdir / TCP_FILE).is_file():
        tcp = json.loads((logdir / TCP_FILE).read_text())
    if tcp:
        out.append(f"TCP over the limited path (2 MiB, data NIC): {tcp['mbit']:.2f} Mbit/s of payload.")
    out.append(f"Lower bound under the limit's link model (any schedule): {_bound_under_limit(opts, base):.1f} ms.")
    out += ["", "| run | schedule | measured ms | what | simulated ms | measured / simulated"
            " | simulated at the TCP rate | measured / that | modelled by the monitor | measured / that"
            " | morph/bound_ms |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    measured: dict[tuple[str, str], float | None] = {}
    for name in ("unshaped", "shaped", "shaped-delegate", "shaped-planned", "shaped-replan"):
        done = (logdir / name / "comparison.json").is_file()
        sims = _simulated(logdir, name) if done else {}
        limited = done and tcp and name != "unshaped"
        at_tcp = _simulated_at(logdir, name, tcp["mbit"]) if limited else sims
        for (n, v), scalars in tb.items():
            if n != name:
                continue
            m, what = _measured(scalars, first)
            measured[(n, v)] = m
            modelled = _median(scalars.get(MODELLED_TAG, {}), first)
            bound = _median(scalars.get("morph/bound_ms", {}), first)
            label = "ZBH2 (delegate)" if name == "shaped-delegate" else v
            cells = []
            for value in (sims.get(v), at_tcp.get(v), modelled):
                cells += [f"{value or 0:.1f}", f"{m / value:.3f}" if m and value else "—"]
            out.append(
                f"| {name} | {label} | {m or 0:.1f} | {what} | {' | '.join(cells)} |"
                f" {'—' if bound is None else f'{bound:.1f}'} |"
            )

    def r(a: tuple[str, str], b: tuple[str, str]) -> str:
        x, y = measured.get(a), measured.get(b)
        return f"{x / y:.3f}" if x and y else "—"

    out += [
        "",
        f"* ZBH2 / PipeMorph (shaped): {r(('shaped', 'ZBH2'), ('shaped', 'PipeMorph'))}",
        f"* 1F1B step / PipeMorph pipeline (shaped): {r(('shaped', '1F1B'), ('shaped', 'PipeMorph'))}",
        f"* PipeMorph shaped / unshaped: {r(('shaped', 'PipeMorph'), ('unshaped', 'PipeMorph'))};"
        f" ZBH2 shaped / unshaped: {r(('shaped', 'ZBH2'), ('unshaped', 'ZBH2'))}",
        f"* ZBH2 default / ZBH2 delegate (shaped): {r(('shaped', 'ZBH2'), ('shaped-delegate', 'ZBH2'))}",
        f"* ZBH2 / PipeMorph-noadapt planned for the delay (shaped):"
        f" {r(('shaped', 'ZBH2'), ('shaped-planned', 'PipeMorph-noadapt'))}; ZBH2 / PipeMorph-replan:"
        f" {r(('shaped', 'ZBH2'), ('shaped-replan', 'PipeMorph-replan'))}",
    ]
    for (n, v), scalars in tb.items():
        if not n.startswith("shaped") or v == "1F1B":
            continue
        delay = _median(scalars.get(f"morph/delay_ms/link{LINK}", {}), first)
        bw = _median(scalars.get(f"morph/bandwidth_mbps/link{LINK}", {}), first)
        tx = _median(scalars.get(f"morph/transmit_ms/link{LINK}", {}), first)
        det = _detected(scalars, 1)
        fmt = lambda x, u: "—" if x is None else f"{x:.2f} {u}"  # noqa: E731
        out.append(
            f"* monitor, {n} {v}: delay {fmt(delay, 'ms')}, transmit {fmt(tx, 'ms')} (size / rate {tau:.2f} ms),"
            f" bandwidth {fmt(bw, 'Mbit/s')} (limit {opts.rate:g}); detected slow after"
            f" {'never' if det is None else f'{det} step(s)'}"
        )
    rows = _trace_rows(opts)
    if any(n == "trace" for n, _ in tb):
        phases = [(1, rows[0][0] - 1, 0.0), *[(s, (rows[i + 1][0] - 1 if i + 1 < len(rows) else opts.steps), rt)
                  for i, (s, rt) in enumerate(rows)]]  # fmt: skip
        out += ["", "Trace (rate by step): " + ", ".join(f"steps {a}-{b}: {rt:g} Mbit/s" for a, b, rt in phases), ""]
        # each phase from its (settle + 1)-th step: what a schedule reached in it, not how it got there
        firsts = [max(a + opts.settle, 2) if a > 1 else max(a, 2) for a, _, _ in phases]
        heads = " | ".join(f"steps {f}-{b} ms" for f, (_, b, _) in zip(firsts, phases))
        out += [f"| schedule | {heads} | detected after |", "|---|" + "---:|" * (len(phases) + 1)]
        got: dict[str, list[float | None]] = {}
        for v in ("ZBH2", "PipeMorph"):
            if ("trace", v) not in tb:
                continue
            scalars = tb["trace", v]
            times = got[v] = [_measured(scalars, f, b)[0] for f, (_, b, _) in zip(firsts, phases)]
            det = _detected(scalars, rows[0][0])
            out.append(
                f"| {v} | "
                + " | ".join("—" if c is None else f"{c:.1f}" for c in times)
                + f" | {'never' if det is None else f'{det} step(s)'} |"
            )
        if len(got) == 2:
            ratios = [m / z if m and z else None for m, z in zip(got["PipeMorph"], got["ZBH2"])]
            out.append("| PipeMorph / ZBH2 | " + " | ".join("—" if r is None else f"{r:.3f}" for r in ratios) + " | |")
            means = {v: _mean_pipeline(tb["trace", v]) for v in got}
            if all(means.values()):
                out.append(f"\nWhole run: ZBH2 / PipeMorph = {means['ZBH2'] / means['PipeMorph']:.3f} (mean step)")
    out += _rate_runs(opts, logdir, tcp)
    out += _sweep_table(opts, logdir, tcp, measured.get(("shaped", "PipeMorph")), measured)
    return "\n".join(out)


def _rate_runs(opts: argparse.Namespace, logdir: Path, tcp: dict[str, float]) -> list[str]:
    """The rate the monitor read on the default path in each ZBH2 run under the limit."""
    runs = [("shaped", logdir / "shaped" / "ZBH2")]
    runs += [(f"rate-{k}", logdir / f"rate-{k}" / "ZBH2") for k in range(2, opts.repeats + 1)]
    read = []
    for name, folder in runs:
        if (folder / "tb").is_dir():
            read.append((name, _median(read_scalars(folder).get(f"morph/bandwidth_mbps/link{LINK}", {}), 1)))
    if not read or not tcp:
        return []
    within = sum(1 for _, bw in read if bw is not None and abs(bw - tcp["mbit"]) <= 0.1 * tcp["mbit"])
    cells = ", ".join(f"{name} {'—' if bw is None else f'{bw:.2f}'}" for name, bw in read)
    return [
        "",
        f"Rate read by the monitor on the default path (ZBH2, `morph/bandwidth_mbps/link{LINK}`, median over"
        f" the run), Mbit/s: {cells}; TCP's payload rate {tcp['mbit']:.2f}: within 10 % in {within} of"
        f" {len(read)} runs.",
    ]


def _sweep_table(
    opts: argparse.Namespace,
    logdir: Path,
    tcp: dict[str, float],
    auto: float | None,
    measured: dict[tuple[str, str], float | None],
) -> list[str]:
    """Every static plan of the sweep, measured, and ``auto`` against the best of them and the baselines."""
    first = opts.skip + 1
    rows, best = [], (float("inf"), "")
    for latency, transmit in _sweep_grid(opts, logdir, tcp):
        name = _sweep_name(latency, transmit)
        cells = []
        for variant, path in (("PipeMorph-noadapt", "default"), ("PipeMorph-CPU", "delegates")):
            folder = logdir / name / variant
            m = _measured(read_scalars(folder), first)[0] if (folder / "tb").is_dir() else None
            cells.append("—" if m is None else f"{m:.1f}")
            if m is not None and m < best[0]:
                best = (m, f"planned for {latency:g} ms + {transmit:g} ms transmit, {path}")
        rows.append(f"| {latency:g} | {transmit:g} | {' | '.join(cells)} |")
    if not best[1]:
        return []
    for key in (("shaped", "ZBH2"), ("shaped-delegate", "ZBH2"), ("shaped", "1F1B")):
        m = measured.get(key)
        if m is not None and m < best[0]:
            best = (m, f"{key[1]} ({key[0]})")
    out = ["", "Static plans on the same lab (PipeMorph, `adapt` off; pipeline ms, medians):", ""]
    out += ["| planned latency ms | planned transmit ms | default path | delegates |", "|---:|---:|---:|---:|", *rows]
    out.append("")
    out.append(f"* best measured (the sweep and the baselines): {best[0]:.1f} ms, {best[1]}")
    if auto is not None:
        out.append(f"* PipeMorph (auto, shaped) {auto:.1f} ms: {auto / best[0]:.3f} x the best")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=20.0, help="Mbit/s of the limited link (default 20)")
    parser.add_argument("--message-kb", type=float, default=64.0, help="KiB per message (default 64)")
    parser.add_argument("--steps", type=int, default=16, help="training steps per job")
    parser.add_argument("--skip", type=int, default=6, help="first steps left out of the medians")
    parser.add_argument("--settle", type=int, default=6, help="trace: each phase's first steps left out of its median")
    parser.add_argument("--base-latency", type=float, help="ms per message in the simulated links (default: measured)")
    parser.add_argument("--logdir", type=Path, help="keep the comparisons here (default: a temporary folder)")
    parser.add_argument("--repeats", type=int, default=5, help="ZBH2 runs under the limit whose rate is read")
    parser.add_argument(
        "--only", default="unshaped,shaped,planned,trace,rate,sweep", help="comparisons to run (comma-separated)"
    )
    parser.add_argument("--report-only", action="store_true", help="re-read --logdir, run nothing")
    parser.add_argument("--out", type=Path, help="also write the summary to this markdown file")
    opts = parser.parse_args()
    if opts.steps <= opts.skip:
        parser.error("--steps must exceed --skip")
    opts.only = set(opts.only.split(","))
    tcp: dict[str, float] = {}
    run_then_report(
        "bench_netlab_congestion_",
        opts.logdir,
        opts.report_only,
        lambda logdir: _run(opts, logdir, 0.0, tcp),
        lambda logdir: report(opts, logdir, tcp),
        opts.out,
    )


if __name__ == "__main__":
    main()
