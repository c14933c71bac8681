"""TorchTitan integration: [morph] config, CPU adaptation, TrainSpec ``llama3_morph``, data.

Kept import-free on purpose: ``titan_morph.integration.config`` is imported by TorchTitan's
ConfigManager, and ``cpu`` must run before torchtitan is imported. Registrations live in
``titan_morph.integration.register`` (``[experimental] custom_import``).
"""
