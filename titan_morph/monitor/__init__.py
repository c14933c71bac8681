"""Straggler monitoring and live adaptation (paper §6: profiler → detector → scheduler).

Data flows one way, one module per job, all pure Python (no torch: the runtime exchanges the rows
and applies the decisions):

* :mod:`.profile` — what one stage measured in one step (plan, compute times, message stamps),
  packed into a fixed-size row so all stages exchange it in one small collective;
* :mod:`.delays` — per-link delivery delays from the gathered rows (exact samples and upper
  bounds, see its docstring for how arrival is observed without synchronized clocks);
* :mod:`.bandwidth` — per link direction, latency and transmit time (rate) from the messages'
  timings and sizes, queueing behind earlier messages told apart from transfer;
* :mod:`.detect` — the Eq. 1 rule and the wire's pace, with hysteresis, identically on every rank;
* :mod:`.replan` — measured stage times and the new plan for a decision (Alg. 2 + the search,
  with the measured latencies and transmit times);
* :mod:`.adapt` — the :class:`~.adapt.Monitor` that ties them together: profiles in, a plan change out.
"""
