#!/usr/bin/env bash
# The GPU checks: the CUDA tests (tests/gpu) and the figures of benchmarks/bench_gpu.py with their
# goals (isolation <= 1.05x, unpack host time < 0.5 ms behind a busy queue, delegated >= 0.8x raw
# gloo throughput, CUDA-event op times within 10 % of torch.profiler's kernel times, and on two GPUs
# equal PP=2 losses on every transport), appended to docs/results.md with the device's name.
# Under 8 minutes on one GPU; exits non-zero when a test fails or a goal is missed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no CUDA device here; nothing to check" >&2
    exit 2
fi
echo "gpu_check: $("$PY" -c 'import torch; print(torch.cuda.device_count(), "x", torch.cuda.get_device_name(0))')" >&2
status=0
timeout 240 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/gpu -rs || status=$?
timeout 300 "$PY" benchmarks/bench_gpu.py --repeat 5 --steps 3 --check --out docs/results.md || status=$?
exit "$status"
