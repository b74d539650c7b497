#!/usr/bin/env bash
# The sharding benchmark of issue 27, one command: the largest GPT (d_model 768, layers grown)
# that trains under a per-rank CPU budget of 2 GiB on 2 ranks with no sharding, ZeRO stage 1,
# stage 2 and stage 2 + 8-bit AdamW state, then samples/s and bytes sent per step of each on
# the largest model all four fit; results into docs/BENCH_SHARDING.md (between its markers).
#   bash bench/sharding/run.sh                         # ~20-30 min on 2 cores
#   bash bench/sharding/run.sh --doc ''                # the same, the doc left alone
#   bash bench/sharding/run.sh --budget 1200MiB --seq-len 32 --max-layers 3 --speed-steps 2 \
#       --speed-rounds 1 --doc ''                      # the machinery only, ~2 min
# It runs the leantrain binary as built (build/bin/leantrain, or --bin / $LEANTRAIN_BIN) and
# builds nothing. Every probe's output stays in a /tmp directory it names (--workdir).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
py=python3
[ -x "$top/.venv/bin/python" ] && py="$top/.venv/bin/python"
cd "$top"
exec "$py" "$top/bench/sharding/largest_model.py" "$@"
