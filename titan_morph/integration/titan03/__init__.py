"""TorchTitan 0.3.0 adapter: the same titan_morph below a different TorchTitan surface.

0.3.0 has no TOML and no TrainSpec registry: a job is ``--module M --config FN`` where ``FN()``
returns a ``Trainer.Config``, and a model is a ``ModelSpec`` inside that config. This subpackage
maps that surface onto the release-independent parts (``titan_morph.config``, the schedule
builders of :mod:`titan_morph.integration.schedules`, comm, monitor, runtime), which do not know
which release runs them:

* :mod:`.jobconfig`: a ``Trainer.Config`` -> :class:`~titan_morph.config.JobView` -> settings, and
  the checks run before any rank starts;
* :mod:`.model_spec`: the ``ModelSpec`` whose ``pipelining_fn`` builds titan_morph's schedules;
* :mod:`.trainer`: the ``Trainer`` subclass with the ``morph`` field, and the rank entry point;
* :mod:`.launcher`: what ``TORCHTITAN=0.3.0 ./run_train.sh`` runs.

Kept import-free: the CPU adaptation must run before torchtitan loads.
"""
