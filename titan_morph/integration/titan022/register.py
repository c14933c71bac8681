"""Register titan_morph with TorchTitan: dataset ``morph_text``, TrainSpec ``llama3_morph``.

Importing this module registers everything (usable as ``[experimental] custom_import``);
``titan_morph.train`` calls :func:`register_all` itself.
"""

from titan_morph.integration.data import register_dataset
from titan_morph.integration.titan022.train_spec import register as register_train_spec


def register_all() -> None:
    """Idempotent: safe to call from the entry point and again via ``custom_import``."""
    register_dataset()
    register_train_spec()


register_all()
