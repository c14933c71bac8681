# Sourced by run_train.sh and run_tests.sh: create/reuse the virtual environment and install
# titan_morph into it.
#
# torch: pyproject.toml asks for a range (the releases the tests were run with). A torch already in
# the venv that falls in the range is kept. Otherwise torch is installed FIRST, on its own, so that
# no other package pulls a multi-GB CUDA build as a side effect:
#   * TORCH_SPEC (default torch==2.13.0) is what gets installed;
#   * on a machine without CUDA (no working nvidia-smi) pip first tries the configured local wheels
#     only (--no-index --no-deps: find-links such as a pre-downloaded CPU wheel; torch's own
#     dependencies come with titan_morph's below), then PyTorch's CPU wheel index,
#     TORCH_CPU_INDEX_URL; with CUDA it uses the configured index (CUDA builds).
# A stamp keyed on pyproject.toml, the Python version and the installed torch skips the whole step
# when nothing changed.
#
# TORCHTITAN=0.3.0 selects TorchTitan 0.3.0's own environment (default VENV <repo>/.venv-titan03):
# torch in 0.3.0's range (TORCH_SPEC default torch==2.14.1: its schedules take pre-split
# microbatches, which 0.3.0's trainer passes), then torchtitan==0.3.0 with its requirements, then
# titan_morph editable without its 0.2.2 pin (--no-deps) plus its other requirements and the dev
# tools, read from pyproject.toml; torch is held at the installed version throughout.
#
# DEVICE_KIT=<folder of wheels> (scripts/device_kit.sh's .device-kit): a machine that reaches no
# package registry and whose PYTHON already has torch (the lent GPU machine). The venv is made with
# PYTHON's packages visible (--system-site-packages, plus PYTHON's own site-packages when PYTHON is
# itself a venv's: its torch and its pip), torch is never installed (PYTHON's must be in the range),
# and the kit and titan_morph (editable) are installed from the folder alone (--no-index --no-deps).
#
# Inputs (env): VENV (default: <repo>/.venv), PYTHON (interpreter used to create it; default
# python3), TORCH_SPEC, TORCH_CPU_INDEX_URL, TORCHTITAN (unset, or 0.3.0), DEVICE_KIT.
# Outputs: VENV (absolute), VENV_PY (its python).

TM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${TORCHTITAN:-}" in
    "" | 0.2.2) tm_titan="" ;;
    0.3.0) tm_titan="0.3.0" ;;
    *) echo "error: TORCHTITAN: '${TORCHTITAN}' is not one of 0.2.2, 0.3.0" >&2; exit 2 ;;
esac
if [ -n "$tm_titan" ]; then
    VENV="${VENV:-$TM_ROOT/.venv-titan03}"
else
    VENV="${VENV:-$TM_ROOT/.venv}"
fi
PYTHON="${PYTHON:-python3}"

tm_kit="${DEVICE_KIT:-}"
if [ -n "$tm_kit" ]; then
    [ -n "$tm_titan" ] && { echo "error: DEVICE_KIT: the device kit is TorchTitan 0.2.2's; unset TORCHTITAN" >&2; exit 2; }
    compgen -G "$tm_kit/*.whl" >/dev/null \
        || { echo "error: DEVICE_KIT: no wheels in '$tm_kit': run scripts/device_kit.sh where a registry is reachable" >&2; exit 2; }
    tm_kit="$(cd "$tm_kit" && pwd)"
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating virtual environment $VENV" >&2
    if [ -n "$tm_kit" ]; then
        # no ensurepip needed: PYTHON's pip is seen through its site-packages, as its torch is
        "$PYTHON" -m venv --without-pip --system-site-packages "$VENV" \
            || { echo "[setup] could not create $VENV with $PYTHON" >&2; exit 1; }
        # PYTHON's own packages (torch, pip): its site-packages, also when PYTHON is itself a venv's
        "$PYTHON" -c 'import sysconfig; p = sysconfig.get_paths(); print(*dict.fromkeys([p["purelib"], p["platlib"]]), sep="\n")' \
            > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_titan_morph_base.pth"
    else
        "$PYTHON" -m venv "$VENV" || { echo "[setup] could not create $VENV with $PYTHON" >&2; exit 1; }
    fi
fi
VENV="$(cd "$VENV" && pwd)"
VENV_PY="$VENV/bin/python"

# The torch requirement of pyproject.toml, e.g. torch>=2.13,<2.15.
tm_torch_range="$(sed -n 's/^[[:space:]]*"\(torch[<>=!~][^"]*\)",*$/\1/p' "$TM_ROOT/pyproject.toml" | head -n 1)"
[ -n "$tm_titan" ] && tm_torch_range="torch>=2.14,<2.15"  # TorchTitan 0.3.0's: pre-split microbatches

tm_torch_in_range() {  # exit 0 when the venv's torch satisfies $tm_torch_range
    "$VENV_PY" - "$tm_torch_range" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import PackageNotFoundError, version

try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
try:
    installed = version("torch").split("+")[0]
except PackageNotFoundError:
    sys.exit(1)
sys.exit(0 if Requirement(sys.argv[1]).specifier.contains(installed, prereleases=True) else 1)
EOF
}

tm_setup_key() {  # pyproject.toml + Python version + installed torch version (+ the kit); sets tm_torch_version
    tm_torch_version="$("$VENV_PY" -c 'from importlib.metadata import version; print(version("torch"))' 2>/dev/null || true)"
    { cat "$TM_ROOT/pyproject.toml"; "$VENV_PY" -c 'import sys; print(sys.version)'; echo "$tm_torch_version$tm_titan"
      if [ -n "$tm_kit" ]; then ls "$tm_kit"; fi; } | sha256sum | cut -c1-32
}

tm_stamp="$VENV/.titan_morph-setup"
tm_key="$(tm_setup_key)"
tm_torch_version="$("$VENV_PY" -c 'from importlib.metadata import version; print(version("torch"))' 2>/dev/null || true)"
if [ -n "$tm_kit" ] && [ "$(cat "$tm_stamp" 2>/dev/null)" != "$tm_key" ]; then
    tm_torch_in_range || {
        echo "error: DEVICE_KIT: torch ${tm_torch_version:-(none)} of $PYTHON is not in $tm_torch_range, and nothing is installed from a registry here" >&2
        exit 2
    }
    echo "[setup] keeping torch $tm_torch_version; installing the device kit and titan_morph from $tm_kit into $VENV" >&2
    "$VENV_PY" -m pip install --quiet --no-index --no-deps --no-compile --find-links "$tm_kit" "$tm_kit"/*.whl \
        || { echo "[setup] installing the device kit failed" >&2; exit 1; }
    "$VENV_PY" -m pip install --quiet --no-index --no-deps --no-build-isolation -e "$TM_ROOT" 2>/dev/null \
        || "$VENV_PY" -c 'import sys, sysconfig; open(sysconfig.get_paths()["purelib"] + "/_titan_morph_src.pth", "w").write(sys.argv[1] + "\n")' "$TM_ROOT" \
        || { echo "[setup] installing titan_morph failed" >&2; exit 1; }
    echo "$tm_key" > "$tm_stamp"
fi
if [ "$(cat "$tm_stamp" 2>/dev/null)" != "$tm_key" ]; then
    if tm_torch_in_range; then
        echo "[setup] keeping torch $tm_torch_version (in $tm_torch_range)" >&2
    else
        tm_spec="${TORCH_SPEC:-torch==2.13.0}"
        [ -n "$tm_titan" ] && tm_spec="${TORCH_SPEC:-torch==2.14.1}"
        [ -n "$tm_torch_version" ] && echo "[setup] torch $tm_torch_version is not in $tm_torch_range" >&2
        if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
            echo "[setup] installing $tm_spec (CUDA machine) into $VENV" >&2
            "$VENV_PY" -m pip install --quiet "$tm_spec" || { echo "[setup] torch installation failed" >&2; exit 1; }
            # pip prefers a local CPU wheel of the same version (2.13.0+cpu > 2.13.0) where find-links offers one
            "$VENV_PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda or torch.version.hip else 1)' || {
                echo "error: TORCH_SPEC: pip installed a CPU build of $tm_spec on a machine with CUDA (a local wheel?):" \
                    "name a CUDA build (e.g. TORCH_SPEC=torch==2.13.0+cu130 with its index in PIP_EXTRA_INDEX_URL)" >&2
                exit 1
            }
        elif [ -n "$tm_titan" ]; then
            # a CPU build where one is reachable (local wheels, then the CPU index, tried once); else the
            # configured index's build, which runs on CPU too
            echo "[setup] installing $tm_spec, CPU build if available (no CUDA found) into $VENV" >&2
            "$VENV_PY" -m pip install --quiet --no-index --no-deps "$tm_spec" 2>/dev/null \
                || "$VENV_PY" -m pip install --quiet --retries 0 --timeout 20 \
                    --index-url "${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}" "$tm_spec" 2>/dev/null \
                || { echo "[setup] no CPU build of $tm_spec reachable: installing the configured index's" >&2 \
                    && "$VENV_PY" -m pip install --quiet "$tm_spec"; } \
                || { echo "[setup] torch installation failed" >&2; exit 1; }
        else
            echo "[setup] installing $tm_spec, CPU build (no CUDA found) into $VENV" >&2
            "$VENV_PY" -m pip install --quiet --no-index --no-deps "$tm_spec" 2>/dev/null \
                || "$VENV_PY" -m pip install --quiet --index-url "${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}" "$tm_spec" \
                || { echo "[setup] torch installation failed" >&2; exit 1; }
        fi
        tm_key="$(tm_setup_key)"
    fi
    if [ -n "$tm_titan" ]; then
        tm_hold="$(mktemp)"
        "$VENV_PY" -c 'from importlib.metadata import version; print("torch==" + version("torch"))' > "$tm_hold"
        # titan_morph's requirements but TorchTitan and torch, and its dev tools
        mapfile -t tm_reqs < <("$VENV_PY" -c '
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
for req in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
    if re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower() not in ("torch", "torchtitan"):
        print(req)
' "$TM_ROOT/pyproject.toml")
        echo "[setup] installing torchtitan==$tm_titan and titan_morph[dev] (editable, no 0.2.2 pin) into $VENV" >&2
        "$VENV_PY" -m pip install --quiet -c "$tm_hold" "torchtitan==$tm_titan" "${tm_reqs[@]}" \
            && "$VENV_PY" -m pip install --quiet --no-deps -e "$TM_ROOT" \
            || { rm -f "$tm_hold"; echo "[setup] installation failed" >&2; exit 1; }
        rm -f "$tm_hold"
        unset tm_hold tm_reqs
    else
        echo "[setup] installing titan_morph[dev] into $VENV" >&2
        "$VENV_PY" -m pip install --quiet -e "$TM_ROOT[dev]" || { echo "[setup] installation failed" >&2; exit 1; }
    fi
    echo "$tm_key" > "$tm_stamp"
fi
unset tm_stamp tm_key tm_spec tm_torch_range tm_torch_version tm_titan tm_kit
unset -f tm_torch_in_range tm_setup_key
