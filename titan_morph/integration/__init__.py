"""TorchTitan integration: one adapter per release plus what they share.

* ``titan022/``: TorchTitan 0.2.2 (TOML jobs, its ``JobConfig``, TrainSpec ``llama3_morph``);
* ``titan03/``: TorchTitan 0.3.0 (config functions returning ``Trainer.Config``, ``ModelSpec``);
* shared: settings -> runtime objects (:mod:`.assembly`, from :mod:`.plans`, :mod:`.transports` and
  :mod:`.request`), the schedule registry (:mod:`.schedules`), what both adapters do alike
  (:mod:`.common`), DP x PP (:mod:`.hybrid`), the launchers' host checks (:mod:`.launching`,
  :mod:`.nodes`, :mod:`.shm_space`), the torchrun supervisor and its relaunch protocol
  (:mod:`.supervisor`, :mod:`.relaunch`), the CPU adaptation (:mod:`.cpu`), the bundled data
  (:mod:`.data`), the metrics processor (:mod:`.metrics`), which release runs (:mod:`.release`).

Kept import-free on purpose: TorchTitan's ConfigManager imports the 0.2.2 adapter's ``config``
module, and ``cpu`` must run before torchtitan is imported.
"""
