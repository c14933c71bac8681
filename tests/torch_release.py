"""What the installed torch release does that a test must allow for: the suite runs on torch 2.11
(the lent GPU machines') and 2.13+ (README's set-up paragraph lists the differences)."""

from __future__ import annotations


def warmup_messages() -> int:
    """Messages torch's pipeline schedules send each way to each neighbour stage through
    ``_batch_p2p`` before their first step, and so through an active transport: 1 on torch 2.11 (a
    one-element dummy, ``_get_init_p2p_neighbors_ops``; in a V also to the stage on the rank itself,
    which gloo cannot carry), 0 where a ``PipelineStage`` warms up by its own vote over direct sends
    (``_warmup_forward_vote``, torch 2.13+), which no transport sees."""
    from torch.distributed.pipelining.stage import PipelineStage

    return 0 if hasattr(PipelineStage, "_warmup_forward_vote") else 1
