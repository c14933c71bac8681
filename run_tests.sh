#!/usr/bin/env bash
# Set up (as run_train.sh does), type-check (mypy, settings in pyproject.toml), then run the CI test
# subset: pytest -m "not slow" [extra pytest args]. Pass your own -m to choose other tests, e.g.
# ./run_tests.sh -m slow, or ./run_tests.sh -m "". TORCHTITAN=0.3.0 ./run_tests.sh: the same in TorchTitan
# 0.3.0's environment, on tests/titan03.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
# shellcheck source=scripts/ensure_venv.sh
source "$ROOT/scripts/ensure_venv.sh"

marker=(-m "not slow")
for arg in "$@"; do
    case "$arg" in -m | -m=* | -m*) marker=() ;; esac
done
if [ -n "${TORCHTITAN:-}" ] && [ "${TORCHTITAN}" != "0.2.2" ]; then
    # TorchTitan 0.3.0: its adapter and config functions type-checked, its tests (tests/titan03) unless
    # paths are given; the 0.2.2 adapter does not load there.
    echo "[types] mypy titan_morph/integration/titan03 titan_morph/configs.py" >&2
    "$VENV_PY" -m mypy titan_morph/integration/titan03/*.py titan_morph/configs.py \
        || { echo "[types] the type check failed (above)" >&2; exit 1; }
    paths=(tests/titan03)
    for arg in "$@"; do
        if [ -e "${arg%%::*}" ]; then paths=(); fi
    done
    exec "$VENV_PY" -m pytest "${marker[@]}" ${paths[@]+"${paths[@]}"} "$@"
fi

echo "[types] mypy titan_morph" >&2
"$VENV_PY" -m mypy || { echo "[types] the type check failed (above)" >&2; exit 1; }

exec "$VENV_PY" -m pytest "${marker[@]}" "$@"
