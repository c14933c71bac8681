"""The planner: slackness-aware pipeline scheduling in pure Python (imports neither torch nor any
other titan_morph package).

One room (subpackage) per concern; a room imports only the rooms below it (``tests/test_layers.py``
checks the order):

* ``core``: the cost model and plans (``model``), the link model the simulator and the transports'
  emulator share (``links``, time-varying delays in ``stragglers``), compute speeds, and the stage
  tables and arrival rule the generator, the simulator and the search index by (``layout``);
* ``schedules`` (Eq. 1, Alg. 1/2 in ``slackness``; the one Alg. 3/4 generator, ``event_loop`` behind
  the checked ``generate``; the fixed ``baselines``) and ``timing`` (``timeline``, the one timing
  routine for fixed orders under delays, and ``simulate`` with records and the critical path; the
  closed-form lower bounds on any schedule in ``bounds``), which import neither each other;
* ``search``: the best plan for one delay vector (``driver`` with its workers ``knobs`` and ``tabu``,
  scored by ``score``) or for sampled delays (``robust``), and every named schedule (``builders``);
* ``partition`` (which layers each stage holds), ``reference`` (the exact CP-SAT optimum for small
  instances, random instances) and ``output`` (CSV, Chrome trace, PNG);
* ``cli``: ``python -m titan_morph.pipelining.plan`` and ``python -m titan_morph.pipelining.partition``
  (the two entry points, ``plan.py`` and ``partition/__main__.py``, forward to it).

The runtime (``titan_morph.runtime``) turns plans into torch actions. Each module handles one stage
per rank and two per rank in a V (``CostModel.stages_per_rank``: ZB-V, DualPipeV and PipeMorph-V).
"""
