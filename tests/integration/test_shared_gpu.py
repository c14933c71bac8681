"""Several pipeline ranks on one GPU: the decision (fake device counts and a fake torchrun
environment), the calls that move host copies over Gloo (fakes) and, on CPU
for real, training over the data plane those ranks get (``shared_gpu_plugin``): the losses equal
those of the usual path."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from tests.launch import REPO, torchrun
from titan_morph.integration import cpu


@pytest.fixture
def clean(monkeypatch):
    """Whatever the adaptation changes, restored after the test."""
    monkeypatch.setattr(cpu, "_shared", None)
    monkeypatch.setitem(dist.Backend.default_device_backend_map, "cuda", "nccl")
    for name in ("send", "recv", "send_object_list", "recv_object_list"):
        monkeypatch.setattr(dist, name, getattr(dist, name))
    monkeypatch.delitem(sys.modules, "torchtitan.tools.utils", raising=False)
    monkeypatch.setattr(cpu, "print", lambda *a, **k: None, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("ranks", "devices", "shared"), [(4, 1, True), (8, 2, True), (4, 4, False), (2, 8, False), (4, 0, False)]
)
def test_ranks_share_gpus_only_when_cuda_has_fewer_devices_than_ranks(ranks, devices, shared) -> None:
    assert cpu.ranks_share_gpus(ranks, devices) is shared


def test_a_rank_of_four_on_one_gpu_uses_it_over_gloo(clean) -> None:
    env = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}
    shared = cpu.share_gpu(env, cuda_devices=1)
    assert shared == cpu.SharedGPU(ranks=4, devices=1, index=0) and cpu.shared_gpu() is shared
    assert env["LOCAL_RANK"] == "0"  # TorchTitan's device: cuda:$LOCAL_RANK
    assert dist.Backend.default_device_backend_map["cuda"] == "gloo"
    assert all(hasattr(getattr(dist, n), "__titan_morph_host_staged__") for n in ("send", "recv", "send_object_list"))
    assert "Gloo" in shared.describe() and "CUDA events" in shared.describe()
    assert cpu.share_gpu({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, cuda_devices=1) is shared  # once


@pytest.mark.parametrize(
    "env, devices",
    [({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, 2), ({}, 1), ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, 0)],
    ids=["one-gpu-per-rank", "not-a-torchrun-rank", "cpu"],
)
def test_nothing_changes_otherwise(clean, env, devices) -> None:
    before = dict(env)
    assert cpu.share_gpu(env, cuda_devices=devices) is None
    assert env == before and dist.Backend.default_device_backend_map["cuda"] == "nccl"
    assert not hasattr(dist.send, "__titan_morph_host_staged__")


def test_two_ranks_per_gpu_spread_over_the_gpus(clean) -> None:
    assert cpu.share_gpu({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}, cuda_devices=2).index == 1


def test_too_late_is_one_error(clean) -> None:
    clean.setitem(sys.modules, "torchtitan.tools.utils", SimpleNamespace())
    with pytest.raises(RuntimeError, match="before torchtitan is imported"):
        cpu.share_gpu({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, cuda_devices=1)


class _CudaTensor:
    """What the host copies need of a CUDA tensor."""

    is_cuda = True

    def __init__(self, values: torch.Tensor) -> None:
        self.values, self.shape, self.dtype = values, values.shape, values.dtype

    def cpu(self) -> torch.Tensor:
        return self.values.clone()

    def copy_(self, other: torch.Tensor) -> None:
        self.values.copy_(other)


def test_p2p_over_gloo_moves_host_copies_of_cuda_tensors(clean) -> None:
    seen: list[tuple] = []

    def fake_send(tensor, dst=None, group=None, **kw):
        seen.append(("send", type(tensor).__name__, tensor.clone()))

    def fake_recv(tensor, src=None, group=None, **kw):
        tensor.fill_(7.0)
        seen.append(("recv", type(tensor).__name__))

    def fake_objects(objs, *args, group=None, device=None, **kw):
        seen.append(("objects", device))

    for name, fn in (("send", fake_send), ("recv", fake_recv)):
        clean.setattr(dist, name, fn)
    clean.setattr(dist, "send_object_list", fake_objects)
    clean.setattr(dist, "recv_object_list", fake_objects)
    clean.setattr(cpu, "_on_gloo", lambda group: group == "gloo")
    cpu._host_staged_p2p(dist)
    out = _CudaTensor(torch.arange(3.0))
    dist.send(out, 1, group="gloo")
    into = _CudaTensor(torch.zeros(3))
    dist.recv(into, 0, group="gloo")
    dist.send_object_list([1], 1, group="gloo", device=torch.device("cuda", 0))
    dist.recv_object_list([None], 0, group="nccl", device=torch.device("cuda", 0))
    assert seen[0][:2] == ("send", "Tensor") and torch.equal(seen[0][2], torch.arange(3.0))
    assert seen[1] == ("recv", "Tensor") and torch.equal(into.values, torch.full((3,), 7.0))
    assert seen[2] == ("objects", torch.device("cpu"))  # Gloo: from host memory
    assert seen[3] == ("objects", torch.device("cuda", 0))  # another backend: as asked


STEPS = 3
COMMON = ("--training.steps", str(STEPS), "--training.seq_len", "32", "--metrics.log_freq", "1")
PLUGIN = ("--experimental.custom_import", "shared_gpu_plugin")
PLUGIN_ENV = {"PYTHONPATH": str(REPO / "tests" / "integration")}
DELAYS = ("--morph.inject.mode", "static", "--morph.inject.delays_ms", "0,20,0")


def _losses(folder: Path, *args: str, shared: bool) -> tuple[dict[int, float], str]:
    result = torchrun(
        4, folder, *COMMON, *args, *(PLUGIN if shared else ()), timeout_s=300, env=PLUGIN_ENV if shared else None
    )
    assert result.returncode == 0, f"training failed (exit {result.returncode}):\n{result.tail()}"
    losses = result.losses()
    assert sorted(losses) == list(range(1, STEPS + 1)), losses
    return losses, result.output


@pytest.mark.slow
@pytest.mark.parametrize(
    "schedule, extra, logged",
    [
        ("1F1B", (), "transport 'default' runs every link over the delegated path"),
        ("ZBH2", DELAYS, "over the delegated path, under the link emulator (link_queue_depth"),
        ("PipeMorph", ("--morph.transport", "auto"), "transport 'auto' runs every link on its delegate side"),
    ],
    ids=["torch-1f1b", "zbh2-delayed", "pipemorph-auto"],
)
def test_the_shared_gpu_data_plane_trains_like_the_usual_one(schedule, extra, logged, tmp_path, no_leftovers) -> None:
    args = ("--parallelism.pipeline_parallel_schedule", schedule, "--morph.transport", "default", *extra)
    usual, _ = _losses(tmp_path / "usual", *args, shared=False)
    shared, log = _losses(tmp_path / "shared", *args, shared=True)
    assert logged in log
    assert shared == pytest.approx(usual, rel=1e-6), (shared, usual)
    no_leftovers(tmp_path)
