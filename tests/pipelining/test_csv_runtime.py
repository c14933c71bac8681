"""Real 2-rank gloo run of torch's ``_PipelineScheduleRuntime`` loading our compute-only CSV.

Each rank holds one ``PipelineStage`` of a tiny 2-stage MLP; the schedule CSV comes from
``export.write_csv`` (builders' zb-h1 / 1f1b-iw / 1f1b plans, or hand-written orders when the
builders are not there). Two training iterations (SGD) must give the same losses, gradients and
parameters as the unpipelined model in one process. Run: ``.venv/bin/pytest tests/pipelining/test_csv_runtime.py``.
The file is also the worker script: ``python test_csv_runtime.py --worker RANK INIT CSV OUT``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from titan_morph.pipelining.export import read_csv, write_csv
from titan_morph.pipelining.model import CostModel, Op, validate_orders

STAGES, MICROBATCHES, BATCH, ITERS, LR = 2, 4, 8, 2, 0.1
TIMEOUT_S = 120


def _orders(text: str) -> tuple[tuple[Op, ...], ...]:
    return tuple(tuple(Op.parse(t) for t in line.split()) for line in text.strip().splitlines())


HAND_ORDERS = {  # S=2, N=4, one stage per rank
    "zb-h1": _orders("F0 F1 I0 F2 I1 F3 I2 W0 I3 W1 W2 W3\nF0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3"),
    "1f1b-iw": _orders("F0 F1 I0 W0 F2 I1 W1 F3 I2 W2 I3 W3\nF0 I0 W0 F1 I1 W1 F2 I2 W2 F3 I3 W3"),
    "1f1b": _orders("F0 F1 B0 F2 B1 F3 B2 B3\nF0 B0 F1 B1 F2 B2 F3 B3"),
}


def _schedule_orders(name: str) -> tuple[tuple[Op, ...], ...]:
    """Orders from the builders when they exist (the point of the test), else the hand-written ones."""
    model = CostModel.uniform(STAGES, MICROBATCHES, 10.0, 10.0, 10.0)
    try:
        from titan_morph.pipelining.builders import build
    except ImportError:
        return HAND_ORDERS[name]
    return build(name, model).orders


def _build_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.Tanh()), nn.Linear(16, 4))


def _data(it: int):
    import torch

    g = torch.Generator().manual_seed(100 + it)
    return torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 4, generator=g)


def _worker(rank: int, init: str, csv_path: str, out: str) -> None:
    """One pipeline rank: stage ``rank`` of the MLP under ``_PipelineScheduleRuntime`` + our CSV."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=STAGES, timeout=timedelta(seconds=60))
    try:
        part = _build_model()[rank]
        stage = PipelineStage(part, rank, STAGES, torch.device("cpu"))
        schedule = _PipelineScheduleRuntime([stage], n_microbatches=MICROBATCHES, loss_fn=torch.nn.MSELoss())
        schedule._load_csv(csv_path, "compute_only")
        opt = torch.optim.SGD(part.parameters(), lr=LR)
        record: dict = {"losses": [], "grads": []}
        for it in range(ITERS):
            x, y = _data(it)
            opt.zero_grad()
            losses: list = []
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=y, losses=losses)
                record["losses"].append(torch.stack(losses).mean().item())
            record["grads"].append({n: p.grad.clone() for n, p in part.named_parameters()})
            opt.step()
        record["params"] = {n: p.detach().clone() for n, p in part.named_parameters()}
        torch.save(record, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _reference() -> list[dict]:
    """The same two iterations without pipelining, per stage: losses, grads, final params."""
    import torch

    model = _build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    recs: list[dict] = [{"losses": [], "grads": []} for _ in range(STAGES)]
    for it in range(ITERS):
        x, y = _data(it)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        recs[-1]["losses"].append(loss.item())
        for s in range(STAGES):
            recs[s]["grads"].append({n: p.grad.clone() for n, p in model[s].named_parameters()})
        opt.step()
    for s in range(STAGES):
        recs[s]["params"] = {n: p.detach().clone() for n, p in model[s].named_parameters()}
    return recs


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["zb-h1", "1f1b-iw", "1f1b"])
def test_torch_runtime_runs_our_csv_like_unpipelined_training(name: str, tmp_path: Path) -> None:
    import torch

    orders = _schedule_orders(name)
    validate_orders(CostModel.uniform(STAGES, MICROBATCHES, 1.0, 1.0, 1.0), orders)
    csv_path = write_csv(orders, tmp_path / f"{name}.csv")
    assert read_csv(csv_path) == tuple(tuple(o) for o in orders)
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", str(r), init, str(csv_path), str(tmp_path / f"rank{r}.pt")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(STAGES)
    ]
    logs = []
    try:
        for p in procs:
            try:
                logs.append(p.communicate(timeout=TIMEOUT_S)[0])
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name}: pipeline rank did not finish within {TIMEOUT_S} s (hang in the CSV schedule?)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"{name}: rank {r} failed (rc {p.returncode}):\n{logs[r][-4000:]}"
    ref = _reference()
    for r in range(STAGES):
        got = torch.load(tmp_path / f"rank{r}.pt")
        for it in range(ITERS):
            for n, g in ref[r]["grads"][it].items():
                torch.testing.assert_close(got["grads"][it][n], g, rtol=1e-5, atol=1e-6, msg=f"{name} it{it} {n}")
        for n, p in ref[r]["params"].items():
            torch.testing.assert_close(got["params"][n], p, rtol=1e-5, atol=1e-6, msg=f"{name} final {n}")
    last = torch.load(tmp_path / f"rank{STAGES - 1}.pt")
    assert last["losses"] == pytest.approx(ref[-1]["losses"], rel=1e-5)


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "--worker":
    _worker(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
