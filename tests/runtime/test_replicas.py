"""A replica's share of the global batch (:class:`ReplicaSplit`) on 2 gloo ranks: uneven counts give
each replica its rows of the batch the even split's replicas read together (inputs, keyword
inputs and labels alike; whole batches, or torch's pre-split microbatch lists as TorchTitan 0.3.0
passes them); even counts exchange nothing; what cannot move is one clear error."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.launch import run_ranks
from titan_morph.runtime.replicas import ReplicaSplit

ROWS, SEQ = 4, 3  # N = 2 microbatches of 2 rows per replica


def _batch(rank: int) -> torch.Tensor:
    return torch.arange(ROWS * SEQ).reshape(ROWS, SEQ) + 100 * rank


def _worker(rank: int, world: int, counts: tuple[int, ...]) -> object:
    group = dist.new_group(list(range(world)), backend="gloo")
    split = ReplicaSplit(counts, rank, group)
    inputs, target = _batch(rank), -_batch(rank)
    args, kwargs, labels = split.reshare((inputs,), {"positions": inputs + 1}, target)
    # torch's pre-split form (TorchTitan 0.3.0): lists of the N = 2 even microbatches
    pre = split.reshare_split(
        {
            "arg_mbs": [(mb,) for mb in inputs.tensor_split(2)],
            "kwarg_mbs": [{"positions": p, "mask": None} for p in (inputs + 1).tensor_split(2)],
            "target_mbs": list(target.tensor_split(2)),
            "losses": [],
        }
    )
    assert len(pre["arg_mbs"]) == len(pre["kwarg_mbs"]) == len(pre["target_mbs"]) == split.mine
    assert torch.equal(torch.cat([a for (a,) in pre["arg_mbs"]]), args[0])
    assert torch.equal(torch.cat([d["positions"] for d in pre["kwarg_mbs"]]), kwargs["positions"])
    assert all(d["mask"] is None for d in pre["kwarg_mbs"]) and pre["losses"] == []
    assert torch.equal(torch.cat(pre["target_mbs"]), labels)
    errors = []
    for bad in ({"mask": "not a tensor"}, {"mask": torch.zeros(2, 2)}):
        try:
            split.reshare((inputs,), bad, None)
        except ValueError as e:
            errors.append(str(e))
    return args[0].tolist(), kwargs["positions"].tolist(), labels.tolist() if labels is not None else None, errors


def test_uneven_counts_give_each_replica_its_rows_of_the_global_batch():
    results = run_ranks(_worker, 2, (1, 3), timeout=120, pg_timeout_s=60)
    joined = torch.cat([_batch(0), _batch(1)])  # the global batch: replica 0's rows, then replica 1's
    (a0, p0, l0, e0), (a1, p1, l1, _) = results
    assert a0 == joined[:2].tolist() and a1 == joined[2:].tolist()  # 1 microbatch of 2 rows, then 3
    assert p0 == (joined[:2] + 1).tolist() and p1 == (joined[2:] + 1).tolist()
    assert l0 == (-joined[:2]).tolist() and l1 == (-joined[2:]).tolist()
    assert "the batch's input 'mask' is a str, not a tensor" in e0[0] and "rebalance_microbatches = false" in e0[0]
    assert "have different rows" in e0[1]


def test_even_counts_leave_the_batch_as_read():
    results = run_ranks(_worker, 2, (2, 2), timeout=120, pg_timeout_s=60)
    for rank, (args, positions, labels, errors) in enumerate(results):
        assert args == _batch(rank).tolist() and labels == (-_batch(rank)).tolist()
        assert positions == (_batch(rank) + 1).tolist() and errors == []


def test_counts_must_name_this_replica():
    with pytest.raises(ValueError, match="replica 2 of counts"):
        ReplicaSplit((1, 3), 2, None)
    with pytest.raises(ValueError, match="replica 0 of counts"):
        ReplicaSplit((0, 4), 0, None)
