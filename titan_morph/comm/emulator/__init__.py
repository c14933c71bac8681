"""Emulated links and collectives on real process groups, for CPU development and the benchmarks.

* :mod:`.transport`: :class:`EmulatedTransport`, each pipeline message delivered after the link
  model's delay (NCCL's queue depth modelled on the default path);
* :mod:`.recv`: its receive side (the watcher that stamps arrivals);
* :mod:`.notices`: link-down and delivery notices through the store;
* :mod:`.collectives`: a c10d backend that delays DP collectives by the slow host pairs they cross.
"""
