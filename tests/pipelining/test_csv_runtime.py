"""Real 2-rank gloo run of torch's ``_PipelineScheduleRuntime`` loading our compute-only CSV.

Each rank holds one ``PipelineStage`` of a tiny 2- or 3-stage MLP; the schedule CSV comes from
``export.write_csv`` of our builders' plans (zb-h1, 1f1b-iw, 1f1b, zb-h2, and a PipeMorph plan made
for a 30 ms straggler, also loaded through TorchTitan's ``pipeline_parallel_schedule_csv`` path).
Two training iterations (SGD) must give the same losses, gradients and
parameters as the unpipelined model in one process. Run: ``.venv/bin/pytest tests/pipelining/test_csv_runtime.py``.
The file is also the worker script:
``python test_csv_runtime.py --worker RANK STAGES MICROBATCHES INIT OUT_DIR CSV...``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from titan_morph.pipelining.core.model import CostModel, Op, validate_orders
from titan_morph.pipelining.output.export import read_csv, write_csv
from titan_morph.pipelining.search.builders import build

ITERS, LR = 2, 0.1
TIMEOUT_S = 120
# name -> (stages, microbatches, planning delays per link, builder options)
CASES = {
    "zb-h1": (2, 4, (0.0,), {}),
    "1f1b-iw": (2, 4, (0.0,), {}),
    "1f1b": (2, 4, (0.0,), {}),
    "zb-h2": (3, 6, (0.0, 0.0), {}),
    "pipemorph": (3, 6, (0.0, 30.0), {"search": True}),  # x = Alg. 2 / search warm-up under a straggler
    # "@titan": the schedule object comes from TorchTitan's build_pipeline_schedule with
    # parallelism.pipeline_parallel_schedule_csv pointing at our CSV (scale_grads=False there).
    "pipemorph@titan": (3, 6, (30.0, 0.0), {"search": True}),
}


def _orders(text: str) -> tuple[tuple[Op, ...], ...]:
    return tuple(tuple(Op.parse(t) for t in line.split()) for line in text.strip().splitlines())


def _schedule_orders(name: str) -> tuple[tuple[Op, ...], ...]:
    """Orders made by our builders for ``CASES[name]``."""
    stages, microbatches, delays, kw = CASES[name]
    model = CostModel.uniform(stages, microbatches, 10.0, 10.0, 10.0, delays=delays)
    return build(name.split("@")[0], model, **kw).orders


def _titan_schedule(csv_path: str, stage, stages: int, microbatches: int):
    """TorchTitan's own path: ``build_pipeline_schedule`` with ``pipeline_parallel_schedule_csv``."""
    import torch
    from torchtitan.config import JobConfig
    from torchtitan.distributed.pipeline_parallel import build_pipeline_schedule

    job = JobConfig()
    job.parallelism.pipeline_parallel_degree = stages
    job.parallelism.pipeline_parallel_schedule_csv = csv_path
    job.parallelism.pipeline_parallel_microbatch_size = 2
    job.training.local_batch_size = 2 * microbatches

    def loss_fn(out, target):  # TorchTitan uses scale_grads=False: scale each microbatch's loss instead
        return torch.nn.functional.mse_loss(out, target) / microbatches

    return build_pipeline_schedule(job, [stage], loss_fn)


def _build_model(stages: int):
    """A tiny MLP of ``stages`` parts (same seed everywhere): part s is pipeline stage s."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    parts = [nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(stages - 1)] + [nn.Linear(8, 4)]
    return nn.Sequential(*parts)


def _data(it: int, microbatches: int):
    import torch

    g = torch.Generator().manual_seed(100 + it)
    batch = 2 * microbatches
    return torch.randn(batch, 8, generator=g), torch.randn(batch, 4, generator=g)


def _worker(rank: int, stages: int, microbatches: int, init: str, out_dir: str, csv_paths: list[str]) -> None:
    """One pipeline rank: for each CSV, stage ``rank`` of a fresh MLP under ``_PipelineScheduleRuntime``."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=stages, timeout=timedelta(seconds=60))
    try:
        for csv_path in csv_paths:
            part = _build_model(stages)[rank]
            stage = PipelineStage(part, rank, stages, torch.device("cpu"))
            titan = Path(csv_path).stem.endswith("@titan")
            if titan:
                schedule = _titan_schedule(csv_path, stage, stages, microbatches)
                assert type(schedule) is _PipelineScheduleRuntime
            else:
                schedule = _PipelineScheduleRuntime([stage], n_microbatches=microbatches, loss_fn=torch.nn.MSELoss())
                schedule._load_csv(csv_path, "compute_only")
            opt = torch.optim.SGD(part.parameters(), lr=LR)
            record: dict = {"losses": [], "grads": []}
            for it in range(ITERS):
                x, y = _data(it, microbatches)
                opt.zero_grad()
                losses: list = []
                if rank == 0:
                    schedule.step(x)
                elif rank < stages - 1:
                    schedule.step()
                else:
                    schedule.step(target=y, losses=losses)
                    total = torch.stack(losses).sum() if titan else torch.stack(losses).mean()
                    record["losses"].append(total.item())
                record["grads"].append({n: p.grad.clone() for n, p in part.named_parameters()})
                opt.step()
            record["params"] = {n: p.detach().clone() for n, p in part.named_parameters()}
            torch.save(record, Path(out_dir) / f"{Path(csv_path).stem}.rank{rank}.pt")
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _reference(stages: int, microbatches: int) -> list[dict]:
    """The same two iterations without pipelining, per stage: losses, grads, final params."""
    import torch

    model = _build_model(stages)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    recs: list[dict] = [{"losses": [], "grads": []} for _ in range(stages)]
    for it in range(ITERS):
        x, y = _data(it, microbatches)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        recs[-1]["losses"].append(loss.item())
        for s in range(stages):
            recs[s]["grads"].append({n: p.grad.clone() for n, p in model[s].named_parameters()})
        opt.step()
    for s in range(stages):
        recs[s]["params"] = {n: p.detach().clone() for n, p in model[s].named_parameters()}
    return recs


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _groups() -> dict[str, list[str]]:
    """Cases sharing (stages, microbatches) run in one launch of the ranks (torch imports are slow)."""
    groups: dict[str, list[str]] = {}
    for name, (stages, microbatches, _, _) in CASES.items():
        groups.setdefault(f"S{stages}-N{microbatches}", []).append(name)
    return groups


@pytest.mark.timeout(400)
@pytest.mark.parametrize("group", list(_groups()))
def test_torch_runtime_runs_our_csv_like_unpipelined_training(group: str, tmp_path: Path) -> None:
    import torch

    names = _groups()[group]
    stages, microbatches = CASES[names[0]][:2]
    csv_paths = []
    for name in names:
        orders = _schedule_orders(name)
        validate_orders(CostModel.uniform(stages, microbatches, 1.0, 1.0, 1.0), orders)
        csv_paths.append(write_csv(orders, tmp_path / f"{name}.csv"))
        assert read_csv(csv_paths[-1]) == tuple(tuple(o) for o in orders)
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", str(r), str(stages), str(microbatches), init, str(tmp_path)]
            + [str(p) for p in csv_paths],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for r in range(stages)
    ]
    logs = []
    try:
        for p in procs:
            try:
                logs.append(p.communicate(timeout=TIMEOUT_S)[0])
            except subprocess.TimeoutExpired:
                pytest.fail(f"{names}: pipeline rank did not finish within {TIMEOUT_S} s (hang in a CSV schedule?)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"{names}: rank {r} failed (rc {p.returncode}):\n{logs[r][-4000:]}"
    ref = _reference(stages, microbatches)
    for name in names:
        for r in range(stages):
            got = torch.load(tmp_path / f"{name}.rank{r}.pt")
            for it in range(ITERS):
                for n, g in ref[r]["grads"][it].items():
                    torch.testing.assert_close(got["grads"][it][n], g, rtol=1e-5, atol=1e-6, msg=f"{name} it{it} {n}")
            for n, p in ref[r]["params"].items():
                torch.testing.assert_close(got["params"][n], p, rtol=1e-5, atol=1e-6, msg=f"{name} final {n}")
        last = torch.load(tmp_path / f"{name}.rank{stages - 1}.pt")
        assert last["losses"] == pytest.approx(ref[-1]["losses"], rel=1e-5), name


if __name__ == "__main__" and len(sys.argv) >= 8 and sys.argv[1] == "--worker":
    _worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7:])
