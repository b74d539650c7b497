#!/usr/bin/env bash
# The peer bench at real shapes on one GPU (issue 26; docs/BENCH_PEERS.md, scale real-gpu):
# leantrain against the strongest PyTorch recipe (SDPA, AdamW(fused=True), non-reentrant
# checkpoint, bf16 autocast) for GPT d 768 (6 and 12 layers, seq 1024, micro-batch 8), BERT-base
# (seq 128, micro-batch 64) and ResNet-50 (224, micro-batch 64), fp32/bf16 x none/full, 1 rank,
# taking turns step by step. Memory is the CUDA allocator's peak on both sides.
#
#   bash tests/gpu/peers.sh [compare.py args, e.g. --rows 'gpt12']
#
# Builds with tests/gpu/run.sh --build-only (same dependencies, same build folder), then runs
# bench/peers/compare.py with the Python that has torch. The table goes to $OUT/peers/BENCH.md
# (or .cache/gpu-out/peers/); paste it into docs/BENCH_PEERS.md with the commit it names.
# Budget: ~8 minutes on an H100/H200 after the build (16 rows, 3 steps per side).
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$top/.cache/gpu-out}/peers
build=${LEANTRAIN_GPU_BUILD:-$top/build-gpu}
mkdir -p "$out"
OUT=$out bash "$top/tests/gpu/run.sh" --build-only >"$out/build.txt" 2>&1 || { tail -20 "$out/build.txt"; exit 1; }
[ -x "$build/bin/leantrain" ] || { echo "peers.sh: no $build/bin/leantrain after the build" >&2; exit 1; }
py=""
for cand in "$top/.venv/bin/python" python3 python; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch, numpy" 2>/dev/null; then py=$(command -v "$cand"); break; fi
done
[ -n "$py" ] || { echo "peers.sh: no python with torch and numpy" >&2; exit 1; }
# The libraries the build found (Open MPI / HDF5 unpacked by run.sh) at run time too.
pfx=${LEANTRAIN_GPU_PREFIX:-/tmp/leantrain-gpu-prefix}/usr/lib/x86_64-linux-gnu
[ -d "$pfx" ] && export LD_LIBRARY_PATH="$pfx:$pfx/hdf5/serial:$pfx/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$py" "$top/bench/peers/compare.py" --scale real-gpu --bin "$build/bin" --out "$out" --doc "$out/BENCH.md" \
  --no-extra "$@"
