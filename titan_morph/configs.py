"""``--module titan_morph.configs --config FN``: TorchTitan 0.3.0's config functions under their short
name (:mod:`titan_morph.integration.titan03.configs`)."""

from titan_morph.integration.titan03.configs import (
    adapt_cpu,
    debug_cpu,
    hybrid_cpu,
    partition_cpu,
    straggler_demo_cpu,
    synthetic_cpu,
    tp_pp_cpu,
)

__all__ = ["adapt_cpu", "debug_cpu", "hybrid_cpu", "partition_cpu", "straggler_demo_cpu", "synthetic_cpu", "tp_pp_cpu"]
