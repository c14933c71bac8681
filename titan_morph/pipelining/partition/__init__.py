"""The partition planner: which contiguous layers each pipeline stage holds, so that the planned
schedule is shortest on ranks that compute at different speeds, within each rank's memory.

With a fixed split no schedule helps a slow rank (S = 4, N = 24, 16 layers of F = B = W = 2.5 ms,
rank 3 at half speed: 4,4,4,4 plans 1470 ms whatever the schedule); moving layers off it does
(5,5,4,2: 912.5 ms). Pure Python, like the rest of the planner; ``python -m
titan_morph.pipelining.partition`` is the command line (:mod:`titan_morph.pipelining.cli.partition`,
which this package does not import); the implementation lives in :mod:`planner` and :mod:`bounds`.

Inputs (:class:`PartitionProblem`): per layer (:class:`LayerCost`, embedding and output/loss as
entries of their own) the F, B (input backward, op ``I``) and W times at speed 1 in ms, the bytes
its parameters hold on a rank (weights, gradients, optimiser state) and the activation bytes one
microbatch keeps from its F to its B; per rank a speed (a layer's op time on rank r = its cost /
``rank_speed[r]``) and a memory in bytes; N; the schedule (any name :mod:`search.builders` knows; the V
schedules place two stages per rank, rank r running stages r and 2R−1−r); the link model of
:class:`model.CostModel` (per-link latency and per-message transmit time, independent of the split).
A split gives each stage its layers' summed times on its rank, and each rank an in-flight budget
M_r = ⌊(memory_r − its parameter bytes) / its largest stage's activation bytes⌋ (capped at what N
needs); a split fits when M_r covers what the schedule needs (1 for PipeMorph, the warm-up for
1F1B / ZB, 2 in the V).

What is minimised, "the planner's schedule" of a split: PipeMorph's plan (``pipemorph``, and
``pipemorph-v`` in the V) is the plan CLI's default search (:func:`search.driver.search`); the other
schedules are their fixed builders. Every candidate split is first timed by the *candidate planner*
(Alg. 1/2 + Alg. 3/4; when that misses the split's closed-form bound, :func:`search.driver.search` with 0
iterations, i.e. the best of its seeds: every baseline that fits, Alg. 1 and 2), then the best
``refine`` candidates by the *final planner* (the default search); a plan that meets
:func:`timing.bounds.lower_bound_ms` is kept as it is, since nothing can beat it. The reported makespan is
always the simulated makespan (:func:`timing.simulate.makespan`) of a real plan, the one the plan CLI makes
for the same stage times.

The search over splits (:mod:`bounds`) is exact for the candidate planner: the splits are
taken in passes of a growing threshold on a lower bound that holds for any schedule (a DP over the
suffixes minimises it); each pass enumerates every split under the threshold, sorts them by
:func:`timing.bounds.lower_bound_ms` and runs the candidate planner on those that could still beat the best,
until the threshold reaches the best makespan. Its work is capped (``max_splits``,
``max_evaluations``: by default a fixed amount per size, :func:`default_caps`, so the result depends
only on the inputs); ``exact`` is False when a cap cut it (or a ``tolerance`` stopped it early), and
``bound_ms`` is in any case a lower bound on every contiguous split under any schedule, so the gap
is known. Ties keep the even split. The V's splits are many and its bound loose (where a rank's
layers divide between its two stages barely moves it), so there the caps often cut the search.

API, for the runtime's ``partition = "auto"`` (measure, re-plan, re-partition):

* ``problem = PartitionProblem(layers, rank_speed, microbatches, schedule=..., delays=...,
  transmit=..., memory=...)``; :func:`problem_from_dict` reads the CLI's JSON form
  (``{"layers": [{"name", "fwd", "bwd", "wgt", "param_bytes", "act_bytes"}], "rank_speed": [...]}``).
  Measured speeds: rank_speed[r] = the predicted time of rank r's layers at speed 1 / their measured
  time (so a rank with compute_factor 2 has speed 0.5).
* ``result = partition(problem)``: ``result.best`` (a :class:`SplitPlan`: ``layers_per_stage``,
  ``ranges`` for the module split, ``plan`` for the runtime, ``makespan_ms``), ``result.even``,
  ``result.exact``, ``result.bound_ms``.
* ``evaluate_split(problem, layers_per_stage)``: the same final planner on the split a job runs
  now, so that the gain per step is ``current.makespan_ms − result.best.makespan_ms``;
  ``problem.cost_model(split)`` is the planner's :class:`core.model.CostModel` of a split.
* :func:`even_split`, :func:`stage_ranges`. Bad input raises ``ValueError`` naming the key;
  :class:`SplitDoesNotFit` (a ``ValueError``) when a split, or every split, exceeds the memory.
"""

from __future__ import annotations

from titan_morph.pipelining.partition.planner import (
    LayerCost,
    PartitionProblem,
    PartitionResult,
    SplitDoesNotFit,
    SplitPlan,
    default_caps,
    evaluate_split,
    even_split,
    partition,
    problem_from_dict,
    stage_ranges,
)

__all__ = [
    "LayerCost",
    "PartitionProblem",
    "PartitionResult",
    "SplitDoesNotFit",
    "SplitPlan",
    "default_caps",
    "evaluate_split",
    "even_split",
    "partition",
    "problem_from_dict",
    "stage_ranges",
]
