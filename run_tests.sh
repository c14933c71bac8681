#!/usr/bin/env bash
# Set up (as run_train.sh does), type-check (mypy, settings in pyproject.toml), then run the CI test
# subset: pytest -m "not slow" [extra pytest args]. Pass your own -m to choose other tests, e.g.
# ./run_tests.sh -m slow, or ./run_tests.sh -m "".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
# shellcheck source=scripts/ensure_venv.sh
source "$ROOT/scripts/ensure_venv.sh"

echo "[types] mypy titan_morph" >&2
"$VENV_PY" -m mypy || { echo "[types] the type check failed (above)" >&2; exit 1; }

marker=(-m "not slow")
for arg in "$@"; do
    case "$arg" in -m | -m=* | -m*) marker=() ;; esac
done
exec "$VENV_PY" -m pytest "${marker[@]}" "$@"
