"""What the installed torch release does that a test must allow for: the suite runs on torch 2.11
(the lent GPU machines') and 2.13 to 2.15 (README's set-up paragraph lists the differences)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def warmup_messages() -> int:
    """Messages torch's pipeline schedules send each way to each neighbour stage through
    ``_batch_p2p`` before their first step, and so through an active transport: 1 on torch 2.11 (a
    one-element dummy; in a V also to the stage on the rank itself, which gloo cannot carry), 0 from
    2.13 on, where the stages warm up over direct sends that no transport sees
    (:func:`titan_morph.comm.transport.warms_up_through_batch_p2p`)."""
    from titan_morph.comm.transport import warms_up_through_batch_p2p

    return 1 if warms_up_through_batch_p2p() else 0


def loaded_runtime(path: Path, ranks: int, stages: int, microbatches: int) -> Any:
    """torch's ``_PipelineScheduleRuntime`` after ``_load_csv(path, "compute_only")``, without
    process groups or stages: ``_load_csv`` reads only ``pipeline_order``, ``pp_group_size``,
    ``_num_stages``, ``_n_microbatches``, ``_stages`` and the lowering options ``__init__`` takes
    from its keyword arguments (``_defer_pp_recv``; from 2.15 also the FSDP look-ahead ones, at
    their defaults here) from ``self``, so a bare instance runs torch's real parser, validator and
    lowering (SEND/RECV, stage to rank) in one process."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    rt = object.__new__(_PipelineScheduleRuntime)
    rt.pipeline_order, rt.pp_group_size, rt._num_stages = {}, ranks, stages
    rt._n_microbatches, rt._stages, rt._defer_pp_recv = microbatches, [], False
    rt._max_active_stages, rt._unshard_lookahead = 3, "full"
    rt._defer_reduce_grad_wait, rt._max_outstanding_sends = False, None
    rt._load_csv(str(path), "compute_only")
    return rt
