"""The delegated data plane on a GPU: throughput, head-of-line isolation, unpack host time (§5).

Two gloo ranks share ``cuda:0`` (each measurement side by side in one run):

* **throughput**: a stream of messages of 1, 16 and 64 MiB from rank 0 to rank 1. Delegated
  (``DelegateTransport``, CUDA tensors: device→pinned shared memory→delegates→pinned→device) against
  gloo's own send/recv of the same bytes from host memory; the ratio delegated / gloo (goal ≥ 0.8);
* **isolation**: a chain of matmuls on rank 0 alone, then the same chain with a 64 MiB send over a
  link delayed by 60 ms issued in the middle and waited at the end, where torch's schedules wait
  their sends (so the device→host copy can hide under the second half); ratio (goal ≤ 1.05), and
  the chain with a blocking ``.cpu()`` of the same tensor instead (the head-of-line blocking the
  delegates remove);
* **unpack**: host time of a receive's ``wait`` whose data has arrived while ~100 ms of matmuls
  are queued on the device (goal < 0.5 ms: the copy is queued, never waited for);
* **profiler**: the op clock's CUDA events (:class:`~titan_morph.runtime.optime.EventTimer`) against
  torch.profiler's kernel times of the same ops (goal: within 10 %);
* **training** (two GPUs or more): llama3 debug, PP=2, one GPU per rank, with ``transport =
  "default"``, ``"delegate"`` and ``"auto"``: the losses must be equal (the transport moves bytes,
  it changes none). One GPU cannot hold both ranks of a TorchTitan job (NCCL refuses two ranks on
  one device; ``./run_train.sh`` says so).

    .venv/bin/python benchmarks/bench_gpu.py [--repeat 10] [--check] [--out docs/results.md]

Figures depend on the device and the host. ``--out`` appends the tables, naming the device;
``--check`` exits 1 when a goal above is missed (``scripts/gpu_check.sh``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
SIZES_MIB = (1, 16, 64)


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


def throughput(rank: int, repeat: int) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateTransport

    out: dict = {}
    with DelegateTransport(stage=rank, num_stages=2, device="cuda:0") as tr:
        for mib in SIZES_MIB:
            n = mib * MIB // 4
            host = torch.randn(n)
            dev = host.cuda()
            for label in ("gloo", "delegate"):
                for warm in (True, False):
                    dist.barrier()
                    t0 = time.monotonic()
                    for _ in range(1 if warm else repeat):
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
                    torch.cuda.synchronize()
                    dist.barrier()
                    if not warm and rank == 1:
                        out[f"{label}_{mib}"] = mib * repeat / (time.monotonic() - t0)  # MiB/s
    return out


def _chain(a: Any, n: int) -> Any:
    for _ in range(n):
        a = (a @ a).tanh_()
    return a


def isolation(rank: int, repeat: int) -> dict:
    import torch
    import torch.distributed as dist

    from titan_morph.comm.delegate.transport import DelegateTransport
    from titan_morph.pipelining.links import StaticDelays

    out: dict = {"alone": [], "delegated": [], "blocking": [], "unpack_ms": []}
    with DelegateTransport(stage=rank, num_stages=2, links=StaticDelays((60.0,)), device="cuda:0") as tr:
        x = torch.randn(64 * MIB // 4, device="cuda")
        a = torch.randn(2048, 2048, device="cuda")
        torch.cuda.synchronize()
        for _ in range(repeat):
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
                    out[label].append((time.monotonic() - t0) * 1e3)
            else:
                buf = torch.empty_like(x)
                (h,) = tr.batch_p2p([dist.P2POp(dist.irecv, buf, 0)])
                time.sleep(0.3)  # the message arrives (60 ms link)
                _chain(a, 40)  # a busy device queue ahead of the copy
                t0 = time.monotonic()
                h.wait()
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


def training(steps: int) -> dict:
    """PP=2 llama3 debug on two GPUs with each transport: the losses of every step."""
    from titan_morph.compare.results import read_scalars
    from titan_morph.compare.runner import run_checked

    config = REPO / "train_configs" / "debug_cpu.toml"
    args = ["--training.steps", str(steps), "--training.seq_len", "32"]
    args += ["--parallelism.pipeline_parallel_schedule", "PipeMorph"]
    losses = {}
    with tempfile.TemporaryDirectory(prefix="titan_morph_bench_gpu_train_") as tmp:
        for transport in ("default", "delegate", "auto"):
            dump = run_checked(
                config, Path(tmp) / transport, [*args, "--morph.transport", transport], timeout_s=300, nproc=2
            )
            losses[transport] = read_scalars(dump).get("loss_metrics/global_avg_loss", {})
    equal = all(losses[t] == losses["default"] and losses[t] for t in losses)
    return {"losses": losses, "equal": equal}


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5, help="training steps of the PP=2 comparison")
    parser.add_argument("--out", type=Path, default=None, help="append the tables to this markdown file")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    opts = parser.parse_args(argv)
    missed: list[str] = []
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing to measure")
        return 2
    device = torch.cuda.get_device_name(0)
    lines = [f"### Delegated data plane on {device} (torch {torch.__version__}; two gloo ranks share cuda:0)", ""]
    tput = spawn("throughput", opts.repeat)[1]
    lines += ["| message | gloo (host memory) MiB/s | delegated (CUDA) MiB/s | delegated / gloo |", "|---|---|---|---|"]
    for mib in SIZES_MIB:
        g, d = tput[f"gloo_{mib}"], tput[f"delegate_{mib}"]
        lines.append(f"| {mib} MiB | {g:.0f} | {d:.0f} | {d / g:.2f} |")
        if d / g < 0.8:
            missed.append(f"delegated throughput {d / g:.2f}x gloo at {mib} MiB (goal >= 0.8)")
    iso0, iso1 = spawn("isolation", opts.repeat)
    alone, deleg, block = (statistics.median(iso0[k]) for k in ("alone", "delegated", "blocking"))
    lines += [
        "",
        "| matmul chain (rank 0) | median ms | / alone |",
        "|---|---|---|",
        f"| alone | {alone:.2f} | 1.00 |",
        f"| with a 64 MiB delegated send over a 60 ms link | {deleg:.2f} | {deleg / alone:.3f} |",
        f"| with a blocking `.cpu()` of the same tensor | {block:.2f} | {block / alone:.2f} |",
        "",
        f"Receive `wait` host time behind a busy device queue: median {statistics.median(iso1['unpack_ms']):.3f} ms, "
        f"max {max(iso1['unpack_ms']):.3f} ms.",
        "",
    ]
    unpack = statistics.median(iso1["unpack_ms"])
    if deleg / alone > 1.05:
        missed.append(f"isolation {deleg / alone:.3f}x (goal <= 1.05)")
    if unpack >= 0.5:
        missed.append(f"unpack host time {unpack:.3f} ms (goal < 0.5 ms)")
    prof = profiler_agreement(opts.repeat)
    agreement = prof["events_ms"] / prof["kernels_ms"] if prof["kernels_ms"] > 0 else float("inf")
    lines += [
        f"CUDA-event op times against torch.profiler's kernel times ({prof['ops']} ops): "
        f"{prof['events_ms']:.2f} ms / {prof['kernels_ms']:.2f} ms = {agreement:.3f}.",
        "",
    ]
    if not 0.9 <= agreement <= 1.1:
        missed.append(f"CUDA events / profiler kernel time {agreement:.3f} (goal within 10 %)")
    if torch.cuda.device_count() >= 2:
        t = training(opts.steps)
        lines.append(
            "PP=2 llama3 debug, one GPU per rank, losses per transport: "
            + "; ".join(f"{k} {v}" for k, v in t["losses"].items())
            + (": equal." if t["equal"] else ": NOT equal.")
        )
        if not t["equal"]:
            missed.append("PP=2 losses differ between transports")
    else:
        lines.append("PP=2 training skipped: it needs two GPUs (one rank per GPU; NCCL cannot pair two ranks on one).")
    if missed:
        lines += ["", "Goals missed: " + "; ".join(missed) + "."]
    text = "\n".join(lines) + "\n"
    print(text)
    if opts.out is not None:
        with open(opts.out, "a") as fh:
            fh.write("\n" + text)
    return 1 if missed and opts.check else 0


if __name__ == "__main__":
    sys.exit(main())
