"""``python -m titan_morph.pipelining.partition``: the partition planner's command line (implemented
in :mod:`titan_morph.pipelining.cli.partition`, above the partition planner's own modules)."""

from __future__ import annotations

import sys

from titan_morph.pipelining.cli.partition import main

if __name__ == "__main__":
    sys.exit(main())
