"""TorchTitan 0.2.2 adapter: TOML jobs, its ``JobConfig`` and TrainSpec registry.

* :mod:`.config`: the module ``[job] custom_config_module`` names, merging ``[morph]`` into TorchTitan's
  ``JobConfig``;
* :mod:`.jobconfig`: TOML + overrides -> ``JobConfig`` -> :class:`~titan_morph.config.JobView` -> settings;
* :mod:`.train_spec`: TrainSpec ``llama3_morph`` whose ``pipelining_fn`` builds titan_morph's schedules
  (:mod:`.synthetic`: its testbed flavor, :mod:`.metrics`: its metrics processor); :mod:`.register`
  registers it and the dataset;
* :mod:`.trainer`: the ``Trainer`` subclass and the rank entry point (``python -m titan_morph.train``);
* :mod:`.launcher`: what ``./run_train.sh`` runs (``python -m titan_morph.launch``).

Kept import-free: the CPU adaptation must run before torchtitan loads.
"""
