"""The runtime: what executes titan_morph's plans in torch.

* :mod:`.schedule` — :class:`~.schedule.MorphSchedule`, a torch ``_PipelineScheduleRuntime`` that
  runs a plan's per-rank orders, routes every send/recv through a transport and swaps plans at
  step boundaries;
* :mod:`.records` — what one step did on one rank;
* :mod:`.exchange` — the ONE per-step exchange between the pipeline's ranks (plan check, the
  monitor's profiles, the records' figures);
* :mod:`.metrics` — the TensorBoard figures assembled from it;
* :mod:`.actions` — plans as torch's ``_Action`` IR;
* :mod:`.testbed` — the synthetic-compute testbed (ops padded to configured times on a device clock).
"""
