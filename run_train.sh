#!/usr/bin/env bash
# Train with TorchTitan + titan_morph (TorchTitan's run_train.sh conventions).
#   ./run_train.sh                                   # default: train_configs/debug_cpu.toml, 4 ranks
#   CONFIG_FILE=train_configs/x.toml NGPU=8 ./run_train.sh --training.steps 50 --morph.transport auto
# Env: NGPU (ranks; default = the product of the config's parallel degrees), CONFIG_FILE, LOG_RANK
# (ranks whose output is shown; default = the last one, which logs the loss), VENV, PYTHON.
# Extra arguments are TorchTitan/titan_morph overrides (--section.key value; booleans take a value:
# --morph.monitor false; lists are comma-separated: --morph.inject.delays_ms 0,0,60).
#
# Several machines: with NNODES > 1 this is one node of the job, from torchrun's variables:
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 [MASTER_PORT=29500] NGPU=4 ./run_train.sh   (static rendezvous)
#   NNODES=2 RDZV_ENDPOINT=node0:29400 [RDZV_ID=exp1] [RDZV_BACKEND=c10d] NGPU=4 ./run_train.sh
# NGPU is then this node's ranks (NNODES x NGPU = the config's); README "More than one machine".
#
# The configuration (TOML + overrides) is checked before any rank starts: a bad value is one line
# "error: <key>: ..." on stderr and exit code 2. Ctrl-C stops every rank; nothing is left behind.
#
# TORCHTITAN=0.3.0 ./run_train.sh [overrides]: the same jobs on TorchTitan 0.3.0, in its own environment
# (.venv-titan03). 0.3.0 has no TOML: CONFIG names a config function of titan_morph.configs (default
# debug_cpu; CONFIG_FILE=train_configs/X.toml picks function X); the overrides and checks are the same.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -n "${TORCHTITAN:-}" ] && [ "${TORCHTITAN}" != "0.2.2" ]; then
    cd "$ROOT"
    # shellcheck source=scripts/ensure_venv.sh
    source "$ROOT/scripts/ensure_venv.sh"
    config="${CONFIG:-}"
    [ -z "$config" ] && [ -n "${CONFIG_FILE:-}" ] && config="$(basename "$CONFIG_FILE" .toml)"
    launch_opts=()
    [ -n "${NGPU:-}" ] && launch_opts+=(--nproc "$NGPU")
    [ -n "${LOG_RANK:-}" ] && launch_opts+=(--log-rank "$LOG_RANK")
    exec "$VENV_PY" -m titan_morph.integration.titan03.launcher run ${launch_opts[@]+"${launch_opts[@]}"} \
        "${config:-debug_cpu}" "$@"
fi
CONFIG_FILE="${CONFIG_FILE:-train_configs/debug_cpu.toml}"
if [ -f "$CONFIG_FILE" ]; then
    CONFIG_FILE="$(cd "$(dirname "$CONFIG_FILE")" && pwd)/$(basename "$CONFIG_FILE")"
elif [ -f "$ROOT/$CONFIG_FILE" ]; then
    CONFIG_FILE="$ROOT/$CONFIG_FILE"
else
    echo "error: CONFIG_FILE: $CONFIG_FILE: file not found" >&2
    exit 2
fi
cd "$ROOT"
# shellcheck source=scripts/ensure_venv.sh
source "$ROOT/scripts/ensure_venv.sh"

launch_opts=()
[ -n "${NGPU:-}" ] && launch_opts+=(--nproc "$NGPU")
[ -n "${LOG_RANK:-}" ] && launch_opts+=(--log-rank "$LOG_RANK")
exec "$VENV_PY" -m titan_morph.launch run ${launch_opts[@]+"${launch_opts[@]}"} "$CONFIG_FILE" "$@"
