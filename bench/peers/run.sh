#!/usr/bin/env bash
# leantrain vs the PyTorch DDP recipe, one command: builds the three binaries the bench runs
# (scripts/build.sh, into $LEANTRAIN_BUILD_DIR or build/), then runs bench/peers/compare.py
# with the project's virtualenv. Arguments go to compare.py, e.g.
#   bash bench/peers/run.sh                      # --scale cpu: docs/BENCH_PEERS.md (~20 min, 2 cores)
#   bash bench/peers/run.sh --scale full         # the issue's sizes (a GPU machine)
#   bash bench/peers/run.sh --scale smoke        # tiny models, ~30 s: the machinery only
#   bash bench/peers/run.sh --rows 'gpt12 1r'    # a subset (the doc is left alone)
#   bash bench/peers/run.sh --scale real --models llama --ranks 1   # the Llama rows vs HF / torchtitan-style
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${LEANTRAIN_BUILD_DIR:-$top/build}
LEANTRAIN_BUILD_DIR=$build bash "$top/scripts/build.sh" leantrain leantrain_bench_comm leantrain_bench_checkpoint >&2
cd "$top"
exec "$top/.venv/bin/python" "$top/bench/peers/compare.py" --bin "$build/bin" "$@"
