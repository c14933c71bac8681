"""Schedule comparisons on your own workload: ``python -m titan_morph.compare``.

Runs each schedule/transport variant (torch's 1F1B, ZeroBubble, PipeMorph-CPU, PipeMorph, ...) as
its own torchrun job under the same injected link delays (a named scenario mirroring the paper's
§7 figures), writes every run's TensorBoard events into one log directory so TensorBoard overlays
them, and summarises them as markdown tables and PNGs; ``python -m titan_morph.compare.report``
regenerates a document from finished log directories.

Modules: ``variants`` (named variants), ``scenarios`` (named injected-delay settings), ``harness``
(plan and run), ``runner`` (one bounded torchrun job), ``results`` (TensorBoard read-back),
``predict`` (the simulator's column), ``tables``/``plots``/``report`` (output), ``paper_figures``
(the simulator-only Fig. 5/8 scenario).
"""

from titan_morph.compare.harness import ComparisonPlan, plan_comparison, run_comparison
from titan_morph.compare.scenarios import SCENARIOS, Case, Scenario, ScenarioError, expand
from titan_morph.compare.variants import DEFAULT_VARIANTS, VARIANTS, Variant, parse_variants

__all__ = [
    "ComparisonPlan",
    "plan_comparison",
    "run_comparison",
    "SCENARIOS",
    "Case",
    "Scenario",
    "ScenarioError",
    "expand",
    "DEFAULT_VARIANTS",
    "VARIANTS",
    "Variant",
    "parse_variants",
]
