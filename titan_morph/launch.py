"""``python -m titan_morph.launch run|check|ngpu|supervise ...``: the launcher behind
``./run_train.sh`` (:mod:`titan_morph.integration.titan022.launcher`; the process supervisor is
:mod:`titan_morph.integration.supervisor`)."""

import sys

from titan_morph.integration.titan022.launcher import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
