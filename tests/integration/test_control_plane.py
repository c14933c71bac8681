"""One control plane on every backend: DP x PP's world-wide exchange and microbatch rebalance on
TorchTitan's plain ParallelDims (what an NCCL job has: no DP backend, no DP stamps), on 4 real gloo
ranks (DP 2 x PP 2), with the control plane on the job's own gloo groups and on groups of its own
(``[morph] control_groups = "separate"``, the groups an NCCL job's control plane talks on).

Every rank feeds the exchange the op times of a step (rank 3, stage 1 of replica 1, twice as slow
from step 3 to step 6): both placements of the control plane reach the same decisions at the same
steps, on every rank -- microbatches move away from replica 1 and back -- and the separate one
really talks on other groups.
"""

from __future__ import annotations

from tests.launch import REPO, run_ranks

HYBRID = REPO / "train_configs" / "hybrid_cpu.toml"  # DP 2 x PP 2, the synthetic testbed
STEPS = 12
SLOW = range(3, 7)


def _row(rank: int, step: int, width: int) -> list[float]:
    from titan_morph.monitor.profile import StepProfile, encode

    factor = 2.0 if rank == 3 and step in SLOW else 1.0
    n = 8
    compute = {kind: (10.0 * factor * n, n) for kind in ("F", "I", "W")}
    prof = StepProfile(rank // 2, step, 0.0, 100.0, compute, plan=7)
    return encode(prof, width)


def _worker(rank: int, world: int, mode: str) -> dict:
    import torch.distributed as dist
    from torchtitan.distributed import ParallelDims

    from titan_morph.comm.groups import separate_control_groups
    from titan_morph.integration.hybrid import make_exchange, parallel_dims_for, replica_split
    from titan_morph.integration.titan022.jobconfig import load

    overrides = ["--training.local_batch_size", "8", "--morph.orchestrator", "off", "--morph.control_groups", mode]
    overrides += ["--morph.detect_consecutive", "2", "--morph.recover_consecutive", "2"]
    _, settings = load(HYBRID, overrides)
    separate_control_groups(settings.morph.control_groups == "separate")
    plain = ParallelDims(dp_replicate=1, dp_shard=2, cp=1, tp=1, pp=2, ep=1, etp=1, world_size=world)
    plain.build_mesh()
    dims = plain if mode == "separate" else parallel_dims_for(settings, plain)  # NCCL's plain dims / CPU's
    pipeline = plain.get_mesh("pp").get_group()
    replicas = replica_split(settings, dims)
    assert replicas is not None
    exchange = make_exchange(settings, pipeline, settings.replica_capacity, 0.0, dims, None, 1, replicas)
    assert exchange is not None
    seen = []
    for step in range(STEPS):
        exchange.all_gather(_row(rank, step, settings.replica_capacity), step)
        last = replicas.last
        seen.append((step, last.counts if last is not None else None, replicas.rebalancer.counts))
    own = exchange.world is dist.group.WORLD and exchange.group is pipeline
    return {"seen": seen, "own_groups": own, "dp_stamps": exchange.dp_group is not None}


def test_the_control_plane_decides_alike_on_the_jobs_groups_and_on_its_own():
    shared = run_ranks(_worker, 4, "auto", timeout=240, pg_timeout_s=60)
    apart = run_ranks(_worker, 4, "separate", timeout=240, pg_timeout_s=60)
    for rank in range(4):
        assert shared[rank]["seen"] == apart[rank]["seen"] == shared[0]["seen"], f"rank {rank} decided otherwise"
        assert shared[rank]["own_groups"] and not apart[rank]["own_groups"]
        assert shared[rank]["dp_stamps"] and not apart[rank]["dp_stamps"]  # plain dims: no DP backend to read
    splits = [counts for _, _, counts in shared[0]["seen"]]
    moved = [s for s in splits if s != (8, 8)]
    assert moved and all(a > b for a, b in moved), splits  # away from replica 1 while it is slow
    assert splits[-1] == (8, 8), splits  # and back once it recovers
