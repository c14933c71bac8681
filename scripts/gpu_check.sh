#!/usr/bin/env bash
# Every GPU check, on a machine whose python3 has torch with CUDA but which reaches no package
# registry (the lent H100: carry .device-kit, made here by scripts/device_kit.sh):
#
#   scripts/gpu_check.sh [--out DIR]      # DIR default: $OUT, else outputs/gpu_check
#
# 1. the venv: PYTHON's packages (torch) + the kit + titan_morph, installed offline
#    (scripts/ensure_venv.sh with DEVICE_KIT; VENV default /tmp/titan_morph-gpu-venv);
# 2. the CUDA tests (pytest -m gpu tests/gpu)                          -> DIR/tests_gpu.log
# 3. benchmarks/bench_gpu.py's data-plane goals (throughput, isolation, unpack host time, CUDA-event
#    op times vs the profiler)                                         -> DIR/bench_gpu.md
# 4. PP = 4 llama3 debug on the GPUs there are (four ranks share one GPU): PipeMorph and ZBH2 losses
#    over 10 steps, and the last-link-60ms comparison                   -> DIR/bench_gpu.md
# Each table and log lands under DIR as it is produced (logs of 3-4: DIR/bench_gpu.log), each part
# under its own time limit (6.5 minutes in all on one H200, the limits sum to 9), and DIR/summary.md gets one line
# per part as it ends. Exit 0 when every check passed, 1 when one failed or missed its goal, 2 with
# one line when CUDA or the kit is missing.
# Env: PYTHON (default python3), DEVICE_KIT (default <repo>/.device-kit), VENV, GPU_CHECK_PARTS
# (default tests,data,train,compare).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT_DIR="${OUT:-$ROOT/outputs/gpu_check}"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT_DIR="${2:?--out needs a folder}"; shift 2 ;;
        --out=*) OUT_DIR="${1#--out=}"; shift ;;
        *) echo "error: gpu_check: unknown argument '$1' (usage: scripts/gpu_check.sh [--out DIR])" >&2; exit 2 ;;
    esac
done
export PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA device here ($PYTHON: $("$PYTHON" -c 'import torch; print("torch", torch.__version__, "sees none")' 2>/dev/null || echo "no torch")); nothing to check" >&2
    exit 2
fi
export DEVICE_KIT="${DEVICE_KIT:-$ROOT/.device-kit}"
if ! compgen -G "$DEVICE_KIT/*.whl" >/dev/null; then
    echo "gpu_check: no device kit in $DEVICE_KIT: run scripts/device_kit.sh where a package registry is reachable and carry .device-kit here" >&2
    exit 2
fi
export VENV="${VENV:-/tmp/titan_morph-gpu-venv}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
SUMMARY="$OUT_DIR/summary.md"
start=$SECONDS
note() { echo "$*" | tee -a "$SUMMARY" >&2; }

# shellcheck source=scripts/ensure_venv.sh
( source "$ROOT/scripts/ensure_venv.sh" ) 2>&1 | tee "$OUT_DIR/setup.log" >&2
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: the offline set-up failed (above; $OUT_DIR/setup.log)" >&2; exit 2; }
source "$ROOT/scripts/ensure_venv.sh" 2>/dev/null  # set up already: sets VENV_PY
if ! missing="$("$VENV_PY" -c 'import torchtitan, tyro, datasets, torchdata, titan_morph.train' 2>&1)"; then
    echo "gpu_check: the venv cannot import the project: $(echo "$missing" | tail -n 1)" >&2
    exit 2
fi
export PYTHONUNBUFFERED=1
note "# gpu_check on $("$VENV_PY" -c 'import torch; print(torch.cuda.device_count(), "x", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| CUDA", torch.version.cuda)'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$SUMMARY" 2>/dev/null

status=0
part() {  # part NAME LIMIT_S LOG COMMAND...: run it under its limit, appending its output to LOG
    local name="$1" limit="$2" log="$3" t0=$SECONDS rc
    shift 3
    echo "## $name: $*" >> "$log"
    timeout --kill-after=10 "$limit" "$@" >> "$log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || status=1
    case "$rc" in
        0) note "- $name: passed ($((SECONDS - t0)) s)" ;;
        124 | 137) note "- $name: ran out of its $limit s ($log)" ;;
        *) note "- $name: FAILED, exit $rc ($((SECONDS - t0)) s; $log)" ;;
    esac
}
bench=("$VENV_PY" benchmarks/bench_gpu.py --check --out "$OUT_DIR/bench_gpu.md")
IFS=, read -r -a parts <<< "${GPU_CHECK_PARTS:-tests,data,train,compare}"
for p in "${parts[@]}"; do
    case "$p" in
        tests) part "tests/gpu" 150 "$OUT_DIR/tests_gpu.log" "$VENV_PY" -m pytest -q -m gpu -p no:cacheprovider tests/gpu -rs ;;
        data) part "data plane" 90 "$OUT_DIR/bench_gpu.log" "${bench[@]}" --parts throughput,isolation,profiler ;;
        train) part "PP=4 losses" 80 "$OUT_DIR/bench_gpu.log" "${bench[@]}" --parts train --steps 10 ;;
        compare) part "last-link-60ms" 200 "$OUT_DIR/bench_gpu.log" "${bench[@]}" --parts compare ;;
        *) echo "error: GPU_CHECK_PARTS: '$p' is not one of tests, data, train, compare" >&2; exit 2 ;;
    esac
done
note "- gpu_check: $((SECONDS - start)) s in all, exit $status"
exit "$status"
