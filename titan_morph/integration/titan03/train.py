"""The rank entry point on TorchTitan 0.3.0, as torchrun starts it::

    python -m titan_morph.integration.titan03.train --module titan_morph.configs --config debug_cpu [--k v ...]

TorchTitan's own ``torchtitan.train`` would do on a CUDA host (the config's ``MorphTrainer.Config``
selects the trainer); this entry adds what it cannot: the CPU adaptation before torchtitan loads,
``--module`` defaulting to titan_morph's config functions, ``--morph.no-<flag>`` spelled with a value,
a bad configuration as one line and exit code 2, and no rank outliving torchrun.
"""

from __future__ import annotations

import sys

from titan_morph.config import ConfigError
from titan_morph.config.cli import expand_negated_flags, option_fields
from titan_morph.config.schema import JobConfig as MorphSection
from titan_morph.integration.common import rank_main
from titan_morph.integration.titan03.cpu import adapt
from titan_morph.integration.titan03.jobconfig import CONFIG_MODULE, module_and_function

__all__ = ["main"]


def _start(args: list[str]) -> None:
    module, function, rest = module_and_function(args)
    if function is None:
        raise ConfigError(f"config: --config names the config function (e.g. debug_cpu in {CONFIG_MODULE})")
    rest = expand_negated_flags(rest, option_fields(MorphSection))
    # TorchTitan's ConfigManager reads sys.argv[1:]
    sys.argv = [sys.argv[0], "--module", module or CONFIG_MODULE, "--config", function, *rest]
    from torchtitan.train import main as torchtitan_main

    torchtitan_main()


def main(argv: list[str] | None = None) -> None:
    rank_main(argv, adapt, _start)


if __name__ == "__main__":
    main()
