"""DP x PP with uneven microbatches: one replica's share of the global batch, and the decisions
that change it (:mod:`titan_morph.monitor.rebalance`).

**The global batch stays the even split's.** Every data-parallel rank still reads its own even
share from its dataloader (N microbatches per pipeline step, TorchTitan's ``dp_rank`` shard), so the
data order, the dataloader's checkpointed position and the tokens counted are those of the even
run. When the split is uneven, the ranks of one stage's DP group all-gather the tensors their
stage is given (the first stage's inputs, the last stage's labels: one small collective each, on a
CPU group, in replica order: the global batch as the even run's replicas read it together) and
each keeps its replica's rows: replica ``k`` runs microbatches ``o_k .. o_k + n_k - 1`` of the
``dp x N``, ``o_k`` the counts of the replicas before it. Middle stages are given no batch and
exchange nothing.

**The gradient stays the even split's.** TorchTitan weights every token alike, whichever replica
computes it: its loss is a sum over tokens (0.2.2; 0.3.0 divides that sum by the global token count
before the backward), the pipeline schedules run with ``scale_grads = False`` (no per-replica mean
over its microbatches), and FSDP reduces the replicas' gradients with a sum (its gradient divide
factor is 1; on CPU the adaptation makes the reduce-scatter a plain sum over gloo). A replica's
contribution is thus its tokens' share of the global sum: the same gradient as the even split, up
to the order of float additions. The token count behind the loss is TorchTitan's own all-reduce of
each replica's valid tokens, which sums to the global count for any split.

What moves must be tensors split along their first dimension, of one shape on every replica
(TorchTitan's text datasets: token ids ``[rows, seq_len]``, as torch's schedule splits them); a
non-tensor input (e.g. a flex-attention block mask built per batch) or a tensor of other rows is
refused with one error naming the entry (:meth:`ReplicaSplit.share`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from titan_morph.monitor.rebalance import Rebalance, Rebalancer

__all__ = ["ReplicaSplit"]


def _refuse(name: str, why: str) -> ValueError:
    return ValueError(
        f"[morph] rebalance_microbatches: the batch's {name} {why}: only tensors split along their first dimension"
        " move between data-parallel replicas (set rebalance_microbatches = false)"
    )


class ReplicaSplit:
    """Microbatches per DP replica (``counts``), this rank's ``replica``, the CPU ``group`` of its
    stage's DP ranks (replica order) that exchanges the global batch, and the ``rebalancer`` that
    changes the counts (None: they stay)."""

    def __init__(
        self,
        counts: Sequence[int],
        replica: int,
        group: dist.ProcessGroup | None,
        rebalancer: Rebalancer | None = None,
    ) -> None:
        if not 0 <= replica < len(counts) or min(counts) < 1:
            raise ValueError(f"ReplicaSplit: replica {replica} of counts {list(counts)}")
        self._fixed = tuple(counts)
        self.replica = replica
        self.group = group
        self.rebalancer = rebalancer
        self.last: Rebalance | None = None  # the decision made after the last observed step, if any

    @property
    def counts(self) -> tuple[int, ...]:
        return self.rebalancer.counts if self.rebalancer is not None else self._fixed

    @property
    def mine(self) -> int:
        """This replica's microbatches per pipeline step."""
        return self.counts[self.replica]

    @property
    def even(self) -> bool:
        return len(set(self.counts)) == 1

    def observe(self, step: int, op_ms: Sequence[float | None]) -> Rebalance | None:
        """Feed the rebalancer one step's op times of every world rank (the exchange's rows)."""
        self.last = self.rebalancer.observe(step, op_ms) if self.rebalancer is not None else None
        return self.last

    def metrics(self) -> dict[str, float]:
        """``morph/microbatches/replica{k}`` (and the rebalancer's figures)."""
        if self.rebalancer is not None:
            return self.rebalancer.metrics()
        return {f"morph/microbatches/replica{k}": float(n) for k, n in enumerate(self.counts)}

    def reshare(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], target: torch.Tensor | None
    ) -> tuple[tuple[Any, ...], dict[str, Any], torch.Tensor | None]:
        """A pipeline step's whole-batch inputs and target as this replica's share of the global
        batch (module docstring); unchanged while the split is even. Every DP rank of the stage
        calls it with its own even share (a collective over :attr:`group` when uneven)."""
        if self.even or (not args and not kwargs and target is None):
            return args, kwargs, target
        named = {f"input {i}": a for i, a in enumerate(args)} | {f"input {k!r}": v for k, v in sorted(kwargs.items())}
        if target is not None:
            named["labels"] = target
        shared = self.share(named)
        out = [shared[f"input {i}"] for i in range(len(args))]
        return tuple(out), {k: shared[f"input {k!r}"] for k in kwargs}, shared.get("labels")

    def reshare_split(self, given: dict[str, Any]) -> dict[str, Any]:
        """:meth:`reshare` for torch's pre-split form (``arg_mbs``, ``kwarg_mbs``, ``target_mbs``:
        lists of the N even microbatches, as TorchTitan 0.3.0 passes them): joined, re-shared, and
        split again into this replica's count (an entry that is None in every microbatch stays so)."""
        if self.even:
            return given
        arg_mbs, kwarg_mbs, target_mbs = given.get("arg_mbs"), given.get("kwarg_mbs"), given.get("target_mbs")
        args = tuple(torch.cat([mb[i] for mb in arg_mbs]) for i in range(len(arg_mbs[0]))) if arg_mbs else ()
        dicts: list[dict[str, Any]] = list(kwarg_mbs or [])
        none = {k for k in (dicts[0] if dicts else {}) if all(d.get(k) is None for d in dicts)}
        for key in sorted({k for d in dicts for k in d} - none):
            if not all(isinstance(d.get(key), torch.Tensor) for d in dicts):
                raise _refuse(f"input {key!r}", "is not a tensor in every microbatch")
        kwargs = {k: torch.cat([d[k] for d in dicts]) for k in (dicts[0] if dicts else {}) if k not in none}
        target = torch.cat(list(target_mbs)) if target_mbs else None
        args, kwargs, target = self.reshare(args, kwargs, target)
        n = self.mine
        out = dict(given)
        if arg_mbs:
            out["arg_mbs"] = list(zip(*(a.tensor_split(n) for a in args), strict=True))
        if kwarg_mbs is not None:
            parts = {k: v.tensor_split(n) for k, v in kwargs.items()}
            out["kwarg_mbs"] = [{**dict.fromkeys(none), **{k: p[i] for k, p in parts.items()}} for i in range(n)]
        if target is not None:
            out["target_mbs"] = list(target.tensor_split(n))
        return out

    def share(self, named: dict[str, Any]) -> dict[str, torch.Tensor]:
        """This replica's rows of every entry: each rank gives its even share (N microbatches of rows
        along dimension 0, the same rows for every entry); the ranks all-gather them in replica order
        and each keeps rows ``o_k`` .. ``o_k + n_k`` microbatches of the joined global batch."""
        if self.group is None:
            raise RuntimeError("ReplicaSplit: no group to exchange the global batch over")
        rows = {name: self._rows(name, value) for name, value in named.items()}
        if len(set(rows.values())) != 1:
            raise _refuse("entries", f"have different rows ({rows})")
        self._check_shapes(named)
        n = sum(self.counts) // len(self.counts)
        per_mb, size = next(iter(rows.values())) // n, dist.get_world_size(self.group)
        start, stop = sum(self.counts[: self.replica]) * per_mb, sum(self.counts[: self.replica + 1]) * per_mb
        out = {}
        for name, value in named.items():
            host = value.detach().cpu().contiguous()  # the group is gloo's: token ids are small
            parts = [torch.empty_like(host) for _ in range(size)]
            dist.all_gather(parts, host, group=self.group)
            out[name] = torch.cat(parts)[start:stop].to(value.device)
        return out

    def _rows(self, name: str, value: Any) -> int:
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            raise _refuse(name, f"is a {type(value).__name__}, not a tensor with a batch dimension")
        n = sum(self.counts) // len(self.counts)
        if value.shape[0] % n:
            raise _refuse(name, f"has {value.shape[0]} rows, not N = {n} microbatches of equal rows")
        return int(value.shape[0])

    def _check_shapes(self, named: dict[str, torch.Tensor]) -> None:
        """Every replica's share has the same entries, shapes and types (else one error)."""
        described = ";".join(f"{n}:{tuple(v.shape)}:{v.dtype}" for n, v in named.items())
        mine = torch.tensor([zlib.crc32(described.encode())], dtype=torch.int64)
        seen = [torch.zeros_like(mine) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(seen, mine, group=self.group)
        if len({int(t.item()) for t in seen}) != 1:
            raise ValueError(
                f"[morph] rebalance_microbatches: the data-parallel replicas' batches differ in shape (this one:"
                f" {described}): microbatches move between replicas only when every replica reads the same shapes"
                " (set rebalance_microbatches = false)"
            )
