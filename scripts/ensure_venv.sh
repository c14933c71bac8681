# Sourced by run_train.sh and run_tests.sh: create/reuse the virtual environment and install
# titan_morph into it. torch==2.13.0 is installed FIRST on its own, so pip resolves it from the
# configured find-links/index (the CPU wheel on CPU-only machines) and never pulls a multi-GB
# build as a side effect of another package. A stamp keyed on pyproject.toml (and the Python
# version) skips the whole install when nothing changed.
#
# Inputs (env): VENV (default: <repo>/.venv), PYTHON (interpreter used to create it; default python3).
# Outputs: VENV (absolute), VENV_PY (its python).

TM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$TM_ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating virtual environment $VENV" >&2
    "$PYTHON" -m venv "$VENV" || { echo "[setup] could not create $VENV with $PYTHON" >&2; exit 1; }
fi
VENV_PY="$VENV/bin/python"

tm_stamp="$VENV/.titan_morph-setup"
tm_key="$( { cat "$TM_ROOT/pyproject.toml"; "$VENV_PY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-32)"
if [ "$(cat "$tm_stamp" 2>/dev/null)" != "$tm_key" ]; then
    echo "[setup] installing torch==2.13.0, then titan_morph[dev] into $VENV" >&2
    "$VENV_PY" -m pip install --quiet "torch==2.13.0" \
        && "$VENV_PY" -m pip install --quiet -e "$TM_ROOT[dev]" \
        || { echo "[setup] installation failed" >&2; exit 1; }
    echo "$tm_key" > "$tm_stamp"
fi
unset tm_stamp tm_key
