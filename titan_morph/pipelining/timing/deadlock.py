"""Why fixed orders cannot complete: the error :func:`simulate.simulate` raises, naming per stuck
rank the op it waits at and whom it waits for (so a user can see which two orders disagree)."""

from __future__ import annotations

from collections.abc import Sequence

from titan_morph.pipelining.core.model import CostModel, Op

__all__ = ["DeadlockError", "deadlock_error"]


class DeadlockError(RuntimeError):
    """The orders cannot complete; ``stuck`` maps each unfinished stage to the op it waits at."""

    def __init__(self, message: str, stuck: dict[int, Op]) -> None:
        super().__init__(message)
        self.stuck = stuck


def deadlock_error(model: CostModel, orders: Sequence[Sequence[Op]], pos: Sequence[int]) -> DeadlockError:
    """Build the error naming, per stuck rank, the op it waits at and whom it waits for."""
    last = model.stages - 1
    word = "stage" if model.stages_per_rank == 1 else "rank"
    stuck = {r: orders[r][pos[r]] for r in range(len(orders)) if pos[r] < len(orders[r])}
    backward = {  # (stage, mb) -> the kind its backward runs as (B or I)
        (op.stage if op.stage is not None else r, op.mb): op.kind
        for r, order in enumerate(orders)
        for op in order
        if op.kind in ("I", "B")
    }

    def needs(r: int, op: Op) -> tuple[int, str] | None:
        s = op.stage if op.stage is not None else r
        prefix = "" if op.stage is None else "{}"
        if op.kind == "F" and s > 0:
            return model.rank_of(s - 1), prefix.format(s - 1) + f"F{op.mb}"
        if op.kind in ("I", "B") and s < last:
            return model.rank_of(s + 1), prefix.format(s + 1) + f"{backward.get((s + 1, op.mb), 'I')}{op.mb}"
        return None

    parts = []
    for r, op in stuck.items():
        need = needs(r, op)
        if need is None:
            parts.append(f"{word} {r} is stuck at {op} (position {pos[r] + 1} of {len(orders[r])})")
            continue
        src, what = need
        if src in stuck:
            blocker = stuck[src]
            bneed = needs(src, blocker)
            tail = f", waiting for {bneed[1]} from {word} {bneed[0]}" if bneed else ""
            status = f"which is stuck behind {blocker} (position {pos[src] + 1} of {len(orders[src])}{tail})"
        else:
            status = f"whose order never produces {what}"
        parts.append(f"{word} {r} waits for {op} (needs {what} from {word} {src}, {status})")
    return DeadlockError("pipeline orders deadlock: " + "; ".join(parts), stuck)
