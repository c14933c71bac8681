#!/usr/bin/env bash
# Train with TorchTitan + titan_morph (TorchTitan's run_train.sh conventions).
#   ./run_train.sh                                   # default: train_configs/debug_cpu.toml, 4 ranks
#   CONFIG_FILE=train_configs/x.toml NGPU=8 ./run_train.sh --training.steps 50 --morph.transport auto
# Env: NGPU (ranks; default = the config's pipeline_parallel_degree), CONFIG_FILE, LOG_RANK
# (ranks whose output is shown; default = the last one, which logs the loss), VENV, PYTHON.
# Extra arguments are TorchTitan/titan_morph overrides (--section.key value).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONFIG_FILE="${CONFIG_FILE:-train_configs/debug_cpu.toml}"
if [ -f "$CONFIG_FILE" ]; then
    CONFIG_FILE="$(cd "$(dirname "$CONFIG_FILE")" && pwd)/$(basename "$CONFIG_FILE")"
elif [ -f "$ROOT/$CONFIG_FILE" ]; then
    CONFIG_FILE="$ROOT/$CONFIG_FILE"
else
    echo "run_train.sh: CONFIG_FILE $CONFIG_FILE not found" >&2
    exit 1
fi
cd "$ROOT"
# shellcheck source=scripts/ensure_venv.sh
source "$ROOT/scripts/ensure_venv.sh"

if [ -z "${NGPU:-}" ]; then
    NGPU="$("$VENV_PY" -m titan_morph.launch ngpu "$CONFIG_FILE" "$@")"
fi
export LOG_RANK="${LOG_RANK:-$((NGPU - 1))}"
export TITAN_MORPH_RUN_ID="${TITAN_MORPH_RUN_ID:-$(date +%Y%m%d-%H%M%S)-$$}"

echo "run_train.sh: $NGPU ranks, config $CONFIG_FILE, run id $TITAN_MORPH_RUN_ID, showing rank(s) $LOG_RANK" >&2
exec "$VENV/bin/torchrun" --standalone --nproc-per-node="$NGPU" \
    --local-ranks-filter "$LOG_RANK" --role rank --tee 3 \
    -m titan_morph.train --job.config_file "$CONFIG_FILE" "$@"
