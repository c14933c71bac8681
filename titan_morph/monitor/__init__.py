"""Straggler monitoring and live adaptation (paper §6: profiler → detector → scheduler).

Data flows one way, one module per job:

* :mod:`.profile` — what one stage measured in one step (compute times, message stamps), packed
  into a fixed-size row so all stages can exchange it in one small collective;
* :mod:`.delays` — per-link delivery delays from the gathered rows (exact samples and upper
  bounds, see its docstring for how arrival is observed without synchronized clocks);
* :mod:`.detect` — the Eq. 1 rule with hysteresis, evaluated identically on every rank;
* :mod:`.replan` — the new plan for a decision (Alg. 2 + the search) from measured times;
* :mod:`.clock` and :mod:`.live` — the torch-facing side: clock offsets at start-up, the
  per-step exchange over a CPU (gloo) group, applying decisions at the iteration boundary.

Everything but ``clock`` and ``live`` is pure Python (no torch), like the scheduler core.
"""
