"""The best plan: the search (``driver``, with its two workers ``knobs`` and ``tabu``, scored by
``score``), robust planning for sampled delays (``robust``) and every named schedule with the search
on top (``builders``). Imports ``core``, ``timing`` and ``schedules``."""
