"""The planner: slackness-aware pipeline scheduling in pure Python (imports neither torch nor any
other titan_morph package).

Data flows one way: ``model`` (costs) → ``slackness`` (Eq. 1, Alg. 1/2) → ``generate`` (the one
Alg. 3/4 generator) → ``simulate`` (the one timing routine for fixed orders under delays) →
``search`` / ``robust`` (best plan for one delay vector / for sampled delays; ``search`` drives
``search_knobs`` and ``search_tabu``, its two workers, scored by ``search_score``) → ``builders``
(named schedules) → ``export`` and ``cli`` (``python -m titan_morph.pipelining.plan``). ``exact``
is the CP-SAT reference for small instances and holds the closed-form lower bounds on any schedule
(static delays, and one step under time-varying links); ``links`` is the link model the simulator
and the transports' emulator share; ``layout`` caches the stage tables the generator, the simulator
and the search index by. The runtime (``titan_morph.runtime``) turns plans into torch actions.
Each module handles one stage per rank and two per rank in a V (``CostModel.stages_per_rank``:
ZB-V, DualPipeV and PipeMorph-V).
"""
