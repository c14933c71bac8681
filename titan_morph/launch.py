"""``python -m titan_morph.launch run|check|ngpu|supervise ...``: the launcher behind
``./run_train.sh`` (:mod:`titan_morph.integration.titan022.launcher`; the process supervisor is
:mod:`titan_morph.integration.supervisor`)."""

import sys

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """The launcher's command line; ``supervise`` imports neither torch nor TorchTitan (the
    supervisor outlives the job, and its start and exit stay cheap)."""
    if argv[:1] == ["supervise"]:
        from titan_morph.integration.supervisor import supervise_main

        return supervise_main(argv[1:])
    from titan_morph.integration.titan022.launcher import main as launcher_main

    return launcher_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
