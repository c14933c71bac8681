"""``python -m titan_morph.pipelining.plan``: the planning command line (implemented in
:mod:`titan_morph.pipelining.cli.plan`).

Scripts run the planner under this module name; it forwards to :func:`cli.plan.main`.
"""

from __future__ import annotations

import sys

from titan_morph.pipelining.cli.plan import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
