"""``python -m titan_morph.train --job.config_file X.toml [--section.key value ...]``: TorchTitan's
trainer with titan_morph (:mod:`titan_morph.integration.titan022.trainer`), as torchrun starts it on each rank."""

from titan_morph.integration.titan022.trainer import main, run_id

__all__ = ["main", "run_id"]

if __name__ == "__main__":
    main()
