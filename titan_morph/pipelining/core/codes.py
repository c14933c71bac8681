"""The compact op form the generator, the timing routine and the search share: ``(code,
microbatch)`` with ``code = kind + CHUNK * chunk``, where chunk k is the rank's k-th stage
(:meth:`~titan_morph.pipelining.core.model.CostModel.rank_stages`): integers, so the hot loops index
tables instead of parsing ops."""

from __future__ import annotations

__all__ = ["CHUNK", "CODES", "Code", "KIND_OF", "OP_B", "OP_F", "OP_I", "OP_W"]

OP_F, OP_I, OP_W, OP_B = 0, 1, 2, 3
"""Op kinds (``OP_B`` = fused I + W)."""
CODES = {"F": OP_F, "I": OP_I, "W": OP_W, "B": OP_B}
KIND_OF = ("F", "I", "W", "B")
CHUNK = 4
"""A code is ``kind + CHUNK * chunk``."""
Code = tuple[int, int]
"""One op as ``(code, microbatch)``. With one stage per rank the code is the kind (0..3); in the V,
chunk 1 (the rank's stage on the way back) adds 4."""
