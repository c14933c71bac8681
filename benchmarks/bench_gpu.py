"""titan_morph on a GPU: the delegated data plane's figures (§5) and PP = 4 training on the GPUs there are.

Parts (``--parts``, default all, in this order; each prints its table, and appends it to ``--out``,
as soon as it is done, so a part that fails or runs out of time loses only itself):

* ``throughput``: a stream of messages of 1, 16 and 64 MiB from rank 0 to rank 1 (two gloo ranks
  sharing ``cuda:0``). Delegated (``DelegateTransport``, CUDA tensors: device→pinned shared
  memory→delegates→pinned→device) against gloo's own send/recv of the same bytes from host memory;
  the ratio delegated / gloo (goal ≥ 0.8 at 16 and 64 MiB). Each trial streams at least
  ``STREAM_MIB`` (and ``--repeat`` messages), timed on the receiver from a barrier (outside the
  window) to its last message on the device; the median of ``TRIALS`` trials after a warm-up one;
* ``isolation``: a chain of matmuls on rank 0 alone, then the same chain with a 64 MiB send over a
  link delayed by 60 ms issued in the middle and waited at the end, where torch's schedules wait
  their sends (so the device→host copy can hide under the second half); ratio of medians (goal ≤
  1.05), and the chain with a blocking ``.cpu()`` of the same tensor instead (the head-of-line
  blocking the delegates remove). Rank 1 meanwhile times a receive's ``wait`` whose data arrived
  while ~100 ms of matmuls are queued on the device (goal < 0.5 ms: the copy is queued, never waited);
* ``profiler``: the op clock's CUDA events (:class:`~titan_morph.runtime.optime.EventTimer`) against
  torch.profiler's kernel times of the same ops (goal: within 10 %);
* ``train``: llama3 debug, PP = 4 on the GPUs there are (on one GPU the four ranks share it: Gloo,
  the delegated pipeline, ``titan_morph/integration/cpu.py``), ``--steps`` steps with PipeMorph and
  with ZBH2 (``transport = "auto"``, deterministic algorithms): the losses must be equal (a schedule
  orders the work, it changes no result), and the op clock must be CUDA events;
* ``compare``: ``python -m titan_morph.compare --scenario last-link-60ms`` on the same model and
  ranks (``--variants``, ``--compare-steps``): its table of step times and speedups.

    python benchmarks/bench_gpu.py [--parts throughput,isolation] [--repeat 20] [--check] [--out FILE]

Figures depend on the device and the host. ``--check`` exits 1 when a goal above is missed
(``scripts/gpu_check.sh``), 2 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
SIZES_MIB = (1, 16, 64)
STREAM_MIB = 512  # at least this much per throughput trial
TRIALS = 3
PARTS = ("throughput", "isolation", "profiler", "train", "compare")
TRAIN_CONFIG = REPO / "train_configs" / "debug_cpu.toml"  # the llama3 debug model; the device is the host's
COMPARE_VARIANTS = "1F1B,ZBH2,PipeMorph"


def _entry(rank: int, world: int, port: int, out: str, name: str, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=300)
    )
    try:
        result = globals()[name](rank, *args)
        Path(out, f"{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def spawn(name: str, *args: Any) -> list[dict]:
    """Run module function ``name(rank, *args)`` on two gloo ranks; their JSON results."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="titan_morph_bench_gpu_") as out:
        mp.start_processes(_entry, args=(2, port, out, name, args), nprocs=2, start_method="spawn")
        return [json.loads(Path(out, f"{r}.json").read_text()) for r in range(2)]


def messages(mib: int, repeat: int) -> int:
    """Messages of ``mib`` MiB per throughput trial: at least ``repeat``, and at least STREAM_MIB."""
    return max(repeat, math.ceil(STREAM_MIB / mib))


def throughput(rank: int, repeat: int) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateTransport

    out: dict = {}
    with DelegateTransport(stage=rank, num_stages=2, device="cuda:0") as tr:
        for mib in SIZES_MIB:
            n, count = mib * MIB // 4, messages(mib, repeat)
            host = torch.randn(n)
            dev = host.cuda()
            for label in ("gloo", "delegate"):
                rates = []
                for trial in range(TRIALS + 1):  # trial 0 warms up
                    torch.cuda.synchronize()
                    dist.barrier()  # both ranks start together; the barrier is outside the window
                    t0 = time.monotonic()
                    for _ in range(count):
                        if label == "gloo":
                            if rank == 0:
                                dist.send(host, 1)
                            else:
                                dist.recv(host, 0)
                        elif rank == 0:
                            for h in tr.batch_p2p([dist.P2POp(dist.isend, dev, 1)]):
                                h.wait()
                        else:
                            (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, dev, 0)])
                            h.wait()
                    torch.cuda.synchronize()  # the receiver's last copy has landed
                    if trial:
                        rates.append(mib * count / (time.monotonic() - t0))
                if rank == 1:
                    out[f"{label}_{mib}"] = statistics.median(rates)  # MiB/s
                    out[f"{label}_{mib}_spread"] = (min(rates), max(rates))
                    out[f"count_{mib}"] = count
    return out


def _chain(a: Any, n: int) -> Any:
    for _ in range(n):
        a = (a @ a).tanh_()
    return a


def isolation(rank: int, repeat: int) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateTransport
    from titan_morph.pipelining.core.links import StaticDelays

    out: dict = {"alone": [], "delegated": [], "blocking": [], "unpack_ms": []}
    with DelegateTransport(stage=rank, num_stages=2, links=StaticDelays((60.0,)), device="cuda:0") as tr:
        x = torch.randn(64 * MIB // 4, device="cuda")
        a = torch.randn(2048, 2048, device="cuda")
        torch.cuda.synchronize()
        for i in range(repeat + 1):  # round 0 warms up
            dist.barrier()
            if rank == 0:
                for label in ("alone", "delegated", "blocking"):
                    torch.cuda.synchronize()
                    t0 = time.monotonic()
                    b = _chain(a, 10)
                    sends = []
                    if label == "delegated":
                        sends = tr.batch_p2p([dist.P2POp(dist.isend, x, 1)])
                    elif label == "blocking":
                        x.cpu()
                    _chain(b, 10)
                    for h in sends:  # at the end, as torch's schedules wait their sends
                        h.wait()
                    torch.cuda.synchronize()
                    if i:
                        out[label].append((time.monotonic() - t0) * 1e3)
            else:
                buf = torch.empty_like(x)
                (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, buf, 0)])
                time.sleep(0.3)  # the message arrives (60 ms link)
                _chain(a, 40)  # a busy device queue ahead of the copy
                t0 = time.monotonic()
                h.wait()
                if i:
                    out["unpack_ms"].append((time.monotonic() - t0) * 1e3)
                torch.cuda.synchronize()
            dist.barrier()
    return out


def profiler_agreement(repeat: int) -> dict:
    """Per-op CUDA-event times (the op clock of a GPU stage) against torch.profiler's kernel times."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from titan_morph.runtime.optime import EventTimer

    a = torch.randn(4096, 4096, device="cuda")  # kernels of ms: the host queues far ahead of the device
    timer = EventTimer(torch.device("cuda", 0))
    _chain(a, 5)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        timer.start_step()
        for i in range(repeat):
            token = timer.begin()
            _chain(a, 10)
            timer.end(token, "F", i, 0)
        torch.cuda.synchronize()
    spans = timer.collect()
    events_ms = sum(span.ms for span in spans)
    kernels_ms = sum(e.self_device_time_total for e in prof.key_averages()) / 1e3
    return {"ops": len(spans), "events_ms": events_ms, "kernels_ms": kernels_ms}


class Report:
    """Prints each part's lines and appends them to ``out`` as soon as the part is done."""

    def __init__(self, out: Path | None) -> None:
        self.out, self.missed = out, []

    def emit(self, lines: list[str]) -> None:
        text = "\n".join(lines) + "\n"
        print(text, flush=True)
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            with open(self.out, "a") as fh:
                fh.write("\n" + text)

    def goal(self, ok: bool, what: str) -> None:
        if not ok:
            self.missed.append(what)
            self.emit([f"Goal missed: {what}."])


def part_throughput(report: Report, opts: argparse.Namespace) -> None:
    tput = spawn("throughput", opts.repeat)[1]
    lines = [
        f"Throughput, rank 0 → rank 1 on one GPU (median of {TRIALS} trials; messages per trial: "
        + ", ".join(f"{tput[f'count_{m}']} × {m} MiB" for m in SIZES_MIB)
        + "):",
        "",
        "| message | gloo (host memory) MiB/s | delegated (CUDA) MiB/s | delegated / gloo |",
        "|---|---|---|---|",
    ]
    for mib in SIZES_MIB:
        g, d = tput[f"gloo_{mib}"], tput[f"delegate_{mib}"]
        lines.append(f"| {mib} MiB | {g:.0f} | {d:.0f} | {d / g:.2f} |")
    report.emit(lines)
    for mib in SIZES_MIB[1:]:
        ratio = tput[f"delegate_{mib}"] / tput[f"gloo_{mib}"]
        report.goal(ratio >= 0.8, f"delegated throughput {ratio:.2f}x gloo at {mib} MiB (goal >= 0.8)")


def part_isolation(report: Report, opts: argparse.Namespace) -> None:
    iso0, iso1 = spawn("isolation", opts.repeat)
    alone, deleg, block = (statistics.median(iso0[k]) for k in ("alone", "delegated", "blocking"))
    unpack = statistics.median(iso1["unpack_ms"])
    report.emit(
        [
            f"Head-of-line isolation (rank 0, median of {len(iso0['alone'])} rounds):",
            "",
            "| matmul chain (rank 0) | median ms | / alone |",
            "|---|---|---|",
            f"| alone | {alone:.2f} | 1.00 |",
            f"| with a 64 MiB delegated send over a 60 ms link | {deleg:.2f} | {deleg / alone:.3f} |",
            f"| with a blocking `.cpu()` of the same tensor | {block:.2f} | {block / alone:.2f} |",
            "",
            f"Receive `wait` host time behind a busy device queue: median {unpack:.3f} ms, "
            f"max {max(iso1['unpack_ms']):.3f} ms ({len(iso1['unpack_ms'])} rounds).",
        ]
    )
    report.goal(deleg / alone <= 1.05, f"isolation {deleg / alone:.3f}x (goal <= 1.05)")
    report.goal(unpack < 0.5, f"unpack host time {unpack:.3f} ms (goal < 0.5 ms)")


def part_profiler(report: Report, opts: argparse.Namespace) -> None:
    prof = profiler_agreement(opts.repeat)
    agreement = prof["events_ms"] / prof["kernels_ms"] if prof["kernels_ms"] > 0 else float("inf")
    report.emit(
        [
            f"CUDA-event op times against torch.profiler's kernel times ({prof['ops']} ops): "
            f"{prof['events_ms']:.2f} ms / {prof['kernels_ms']:.2f} ms = {agreement:.3f}."
        ]
    )
    report.goal(0.9 <= agreement <= 1.1, f"CUDA events / profiler kernel time {agreement:.3f} (goal within 10 %)")


def part_train(report: Report, opts: argparse.Namespace) -> None:
    import torch

    from titan_morph.compare.results import read_scalars
    from titan_morph.compare.runner import LOG_FILE, run_checked

    args = ["--training.steps", str(opts.steps), "--training.seq_len", "64", "--morph.transport", "auto"]
    args += ["--debug.deterministic", "--debug.deterministic_warn_only"]
    losses: dict[str, dict[int, float]] = {}
    clocks: dict[str, set[float]] = {}
    shared = ""
    with tempfile.TemporaryDirectory(prefix="titan_morph_bench_gpu_train_") as tmp:
        for schedule in ("PipeMorph", "ZBH2"):
            dump = Path(tmp) / schedule
            run_checked(TRAIN_CONFIG, dump, [*args, "--parallelism.pipeline_parallel_schedule", schedule], 240, nproc=4)
            scalars = read_scalars(dump)
            losses[schedule] = scalars.get("loss_metrics/global_avg_loss", {})
            clocks[schedule] = set(scalars.get("morph/op_clock", {}).values())
            log = (dump / LOG_FILE).read_text(errors="replace")
            shared = shared or next((ln.strip() for ln in log.splitlines() if "share" in ln and "GPU" in ln), "")
    a, b = losses["PipeMorph"], losses["ZBH2"]
    steps = sorted(a)
    worst = max((abs(a[s] - b.get(s, math.inf)) / max(abs(b.get(s, 1.0)), 1e-12) for s in steps), default=math.inf)
    lines = [
        f"PP = 4 llama3 debug on {torch.cuda.device_count()} GPU(s), {opts.steps} steps, transport auto, "
        "deterministic algorithms: losses per step",
        "",
        "| step | PipeMorph | ZBH2 |",
        "|---|---|---|",
        *(f"| {s} | {a[s]:.6f} | {b.get(s, math.nan):.6f} |" for s in steps),
        "",
        f"Largest relative difference {worst:.2e}; op clock (morph/op_clock, 2 = CUDA events): "
        f"{sorted(clocks['PipeMorph'])}.",
    ]
    if shared:
        lines.append(f"The ranks logged: `{shared}`")
    report.emit(lines)
    report.goal(
        len(steps) == opts.steps and sorted(b) == steps, f"losses of {len(steps)}/{len(b)} steps, not {opts.steps}"
    )
    report.goal(worst <= 1e-5, f"PipeMorph and ZBH2 losses differ by {worst:.2e} relative (goal: equal, <= 1e-5)")
    report.goal(clocks["PipeMorph"] == {2.0}, f"op clock {sorted(clocks['PipeMorph'])}, not CUDA events (2)")


def part_compare(report: Report, opts: argparse.Namespace) -> None:
    from titan_morph.compare.__main__ import main as compare  # in this process: a SIGTERM still cleans up its jobs

    with tempfile.TemporaryDirectory(prefix="titan_morph_bench_gpu_compare_") as tmp:
        argv = ["--config", str(TRAIN_CONFIG), "--scenario", "last-link-60ms", "--variants", opts.variants]
        argv += ["--steps", str(opts.compare_steps), "--skip-warmup", str(max(1, opts.compare_steps // 3))]
        argv += ["--logdir", tmp, "--timeout", "240", "--", "--training.seq_len", "64"]
        code = compare(argv)
        tables = "\n".join(t.read_text() for t in sorted(Path(tmp).rglob("table.md")))
        # the figures and TensorBoard logs stay in the temporary folder: their lines go
        text = "\n".join(ln for ln in tables.splitlines() if not ln.startswith(("![", "TensorBoard:"))).strip()
    report.emit(
        [
            f"`last-link-60ms` on PP = 4 llama3 debug ({opts.compare_steps} steps, variants {opts.variants}):",
            "",
            text or f"(no table; exit {code})",
        ]
    )
    report.goal(code == 0 and bool(text), f"the comparison ended with exit {code}")


PART_RUNNERS: dict[str, Callable[[Report, argparse.Namespace], None]] = {
    "throughput": part_throughput,
    "isolation": part_isolation,
    "profiler": part_profiler,
    "train": part_train,
    "compare": part_compare,
}


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--repeat", type=int, default=20, help="messages per trial (at least), rounds, ops")
    parser.add_argument("--steps", type=int, default=10, help="training steps of the PP = 4 loss comparison")
    parser.add_argument("--compare-steps", type=int, default=12, help="training steps per comparison job")
    parser.add_argument("--variants", default=COMPARE_VARIANTS, help="the comparison's variants")
    parser.add_argument("--out", type=Path, default=None, help="append each table to this markdown file when done")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    opts = parser.parse_args(argv)
    parts = [p.strip() for p in opts.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PART_RUNNERS]
    if unknown:
        print(f"error: --parts: {', '.join(unknown)} not among {', '.join(PARTS)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing to measure", file=sys.stderr)
        return 2
    # ``timeout`` (scripts/gpu_check.sh) sends SIGTERM: exit through Python, so running jobs are cleaned up
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = Report(opts.out)
    report.emit(
        [f"### titan_morph on {torch.cuda.get_device_name(0)} (torch {torch.__version__}, parts {', '.join(parts)})"]
    )
    for part in parts:
        t0 = time.monotonic()
        try:
            PART_RUNNERS[part](report, opts)
        except Exception as e:  # the next part still runs; this one is reported (SIGTERM's SystemExit ends all)
            report.goal(False, f"part {part} failed: {type(e).__name__}: {str(e)[-2000:]}")
        print(f"bench_gpu: part {part}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    return 1 if report.missed and opts.check else 0


if __name__ == "__main__":
    sys.exit(main())
