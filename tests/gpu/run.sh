#!/usr/bin/env bash
# The GPU claims of leantrain checked in one prepared command (issue 39; tests/gpu/README.md,
# docs/GPU.md "The device script"): a probe of the machine first, then (on a GPU) the build
# against the machine's PyTorch, then each check with a time limit of its own, never stopping
# at the first failure. Every number goes to $OUT/gpu_results.json (rewritten after each
# check, so a run cut short keeps what it finished); the summary table is printed last and
# written to $OUT/summary.txt. Exit 0 only if every required check passed (on a GPU: all).
#
#   bash tests/gpu/run.sh                         # on the GPU machine: build, then every check
#   bash tests/gpu/run.sh --device cpu --build-dir build
#                                                 # the CPU rehearsal (ctest gpu_script_cpu_rehearsal):
#                                                 # the same checks and criteria at tiny shapes, an
#                                                 # existing build, MPI for NCCL, GPU-only gtests skipped
#   bash tests/gpu/run.sh --configure-only        # anywhere: resolve and unpack deps, run CMake
#   bash tests/gpu/run.sh --build-only            # anywhere: also build, run nothing
#   bash tests/gpu/run.sh --only 'memory|mfu'     # only the checks whose names match (a rerun)
#
# Missing CMake/ninja/Open MPI/HDF5/libjpeg/libpng/GoogleTest/toml++/CLI11/spdlog/json/pkg-config
# come from the .deb files tests/gpu/fetch_debs.sh put in .cache/gpu-debs (carried along),
# unpacked with dpkg -x into a prefix — never into / — and only those whose shared libraries
# the machine lacks; the bundle's bundle.env then points the environment into that prefix.
# The criteria live in tests/gpu/checks.py (standard-library Python), shared by both devices.
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mode=full device=cuda build_arg="" only=""
usage() {
  echo "usage: $0 [--device cuda|cpu] [--build-dir DIR] [--only REGEX] [--configure-only|--build-only]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --configure-only) mode=configure ;;
    --build-only) mode=build ;;
    --device) device=${2:-}; shift ;;
    --build-dir) build_arg=${2:-}; shift ;;
    --only) only=${2:-}; shift ;;
    -h|--help) usage ;;
    *) usage ;;
  esac
  shift
done
case "$device" in cuda|cpu) ;; *) usage ;; esac
# The rehearsal uses a build that exists; configuring and building are the GPU machine's part.
[ "$device" = cpu ] && [ "$mode" != full ] && usage
out=${OUT:-$top/.cache/gpu-out}
if [ "$device" = cpu ]; then build=${build_arg:-${LEANTRAIN_GPU_BUILD:-$top/build}}
else build=${build_arg:-${LEANTRAIN_GPU_BUILD:-$top/build-gpu}}; fi
pfx=${LEANTRAIN_GPU_PREFIX:-/tmp/leantrain-gpu-prefix}
debs=${LEANTRAIN_GPU_DEBS:-$top/.cache/gpu-debs}
# Past this many seconds from the start no check begins and every run's limit is cut to what
# is left: the device tool gives a command 600 s, and what the script leaves in $OUT comes back
# even when it is killed, but the summary and the final JSON only when it ends by itself.
deadline=${LEANTRAIN_GPU_DEADLINE_S:-$([ "$device" = cuda ] && echo 540 || echo 250)}
mkdir -p "$out"
runs=$out/runs
rm -rf "$runs"
rm -f "$out/checks.jsonl" "$out/gpu_results.json" "$out/summary.txt" "$out/probe.json"
mkdir -p "$runs"
t_start=$(date +%s)
echo "$t_start" >"$out/started_at"

# ------------------------------------------------------------------ Python, the probe
# A Python with torch: the probe reports its versions, CMake needs its LibTorch. The criteria
# need only the standard library, so the rehearsal can go on without torch.
py=""
for cand in "$top/.venv/bin/python" python3 python; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch" 2>/dev/null; then py=$(command -v "$cand"); break; fi
done
py_torch=$py
[ -n "$py" ] || py=$(command -v python3 || command -v python || true)
[ -n "$py" ] || { echo "run.sh: no Python at all (tried .venv, python3, python)" >&2; exit 1; }
checks=$top/tests/gpu/checks.py
elapsed() { echo $(( $(date +%s) - t_start )); }
record() {  # NAME pass|fail|skip DETAIL [NUMBERS-JSON]
  "$py" "$checks" record "$out" "$1" "$2" "$3" --device "$device" ${4:+--numbers "$4"}
}
finish() {
  find "$runs" -name checkpoints -type d -prune -exec rm -rf {} + 2>/dev/null  # GBs on a GPU; not needed
  "$py" "$checks" finish "$out" --device "$device" --elapsed "$(elapsed)"
  exit $?
}

echo "==================== probe ===================="
"$py" "$checks" probe "$out"
# A GPU the checks can use (--configure-only and --build-only run anywhere).
[ "$mode" = full ] && "$py" "$checks" judge "$out" probe probe --device "$device"
if [ -n "$py_torch" ]; then
  read -r torch_version torch_prefix site < <("$py_torch" -c "
import os, torch
print(torch.__version__, torch.utils.cmake_prefix_path, os.path.dirname(os.path.dirname(torch.__file__)))")
  record torch pass "$torch_version from $py_torch"
elif [ "$device" = cuda ]; then
  record torch fail "no python with torch (tried .venv, python3, python)"
  finish
else
  record torch skip "no python with torch (the rehearsal needs none)"
fi
{
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  cores: $(nproc)"
  for t in g++ cmake ninja; do printf '%s: %s\n' "$t" "$(command -v $t || echo MISSING)"; done
  g++ --version 2>/dev/null | head -1
} >"$out/setup.txt" 2>&1

if [ "$device" = cuda ]; then
# ------------------------------------------------------------------ CUDA toolkit, NCCL
nvcc_bin=$(command -v nvcc || true)
[ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc_bin=/usr/local/cuda/bin/nvcc
[ -z "$nvcc_bin" ] && [ -x "$site/nvidia/cu13/bin/nvcc" ] && nvcc_bin=$site/nvidia/cu13/bin/nvcc
cuda_root=""
[ -n "$nvcc_bin" ] && cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc_bin")")")
# NCCL: the one PyTorch loads (its wheel), so only one libnccl.so.2 is ever in the process.
nccl_root=""
for d in "$site/nvidia/nccl" "$cuda_root" /usr/local/cuda /usr; do
  if [ -n "$d" ] && [ -f "$d/include/nccl.h" ]; then nccl_root=$d; break; fi
done
record cuda_toolkit_nccl pass "${cuda_root:-none} / ${nccl_root:-none}"

# ------------------------------------------------------------------ Debian packages
dep_prefix=""
if [ -d "$debs" ] && ls "$debs"/*.deb >/dev/null 2>&1; then
  rm -rf "$pfx"
  mkdir -p "$pfx"
  ldcache=$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null | awk '{print $1}' | sort -u)
  list_deb() { if command -v dpkg-deb >/dev/null; then dpkg-deb -c "$1" | awk '{print $6}'; else (ar p "$1" data.tar.xz | tar -tJ) 2>/dev/null; fi; }
  unpack_deb() {
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "$pfx"
    else (ar p "$1" data.tar.xz | tar -xJ -C "$pfx"); fi
  }
  unpacked=() kept=()
  for deb in "$debs"/*.deb; do
    name=$(basename "$deb" .deb)
    # Shared libraries it holds (lib*.so.N); none (headers, tools, CMake files): always unpack.
    libs=$(list_deb "$deb" | grep -E '/lib[^/]*\.so\.[0-9]' | sed 's#.*/##' | sort -u)
    need=1
    if [ -n "$libs" ] && [ -n "$ldcache" ] && [ -z "${LEANTRAIN_GPU_UNPACK_ALL:-}" ]; then
      need=0
      for l in $libs; do grep -qx -- "$l" <<<"$ldcache" || { need=1; break; }; done
    fi
    if [ "$need" = 1 ]; then unpack_deb "$deb" && unpacked+=("$name"); else kept+=("$name"); fi
  done
  # -dev symlinks (libfoo.so -> libfoo.so.N) whose runtime package the machine already has.
  while IFS= read -r link; do
    target=$(basename "$(readlink "$link")")
    sys=$( (ldconfig -p || /sbin/ldconfig -p) 2>/dev/null | awk -v t="$target" '$1 == t {print $NF; exit}')
    [ -n "$sys" ] && ln -sfn "$sys" "$link"
  done < <(find "$pfx" -xtype l -name 'lib*.so*' 2>/dev/null)
  # The wrappers hold their install prefix: point them at the unpacked tree.
  [ -f "$pfx/usr/bin/h5cc" ] && sed -i "s#^prefix=\"/usr\"#prefix=\"$pfx/usr\"#" "$pfx/usr/bin/h5cc"
  dep_prefix=$pfx/usr
  printf '%s\n' "unpacked: ${unpacked[*]}" "machine has: ${kept[*]}" >>"$out/setup.txt"
  record debian_packages pass "${#unpacked[@]} unpacked into $pfx, ${#kept[@]} already on the machine"
  # LD_LIBRARY_PATH, PATH (after the machine's own tools), PKG_CONFIG_*, and Open MPI's and
  # PMIx's prefixes (OPAL_PREFIX, PMIX_INSTALL_PREFIX: their plugins, at run time too).
  [ -f "$debs/bundle.env" ] || { record debian_packages fail "$debs has no bundle.env: run tests/gpu/fetch_debs.sh again"; finish; }
  # shellcheck disable=SC1091
  . "$debs/bundle.env"
  # LEANTRAIN_GPU_ISOLATE=1 (fetch_debs.sh --configure-only): the prefix's tools first.
  [ -n "${LEANTRAIN_GPU_ISOLATE:-}" ] && export PATH="$pfx/usr/bin:$PATH"
else
  record debian_packages skip "none carried ($debs): using the machine's"
fi
# CMake and ninja: the machine's, or the bundle's (on the PATH now).
for t in g++ cmake ninja; do
  command -v "$t" >/dev/null || { record tools fail "$t not on PATH (nor in the bundle)"; finish; }
done
echo "tools: cmake $(command -v cmake) ($(cmake --version | head -1)), ninja $(command -v ninja)" | tee -a "$out/setup.txt"

# ------------------------------------------------------------------ configure
cmake_args=(-S "$top" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
            "-DCMAKE_PREFIX_PATH=$torch_prefix${dep_prefix:+;$dep_prefix}")
[ -n "$cuda_root" ] && cmake_args+=("-DCUDAToolkit_ROOT=$cuda_root" "-DCUDA_TOOLKIT_ROOT_DIR=$cuda_root")
[ -n "$nccl_root" ] && cmake_args+=("-DLEANTRAIN_NCCL_ROOT=$nccl_root")
wrapper_prefix=${OPAL_PREFIX:-}
if [ -n "$dep_prefix" ]; then
  mpicc=$dep_prefix/bin/mpicc.openmpi
  if [ -x "$mpicc" ]; then
    cmake_args+=("-DMPI_C_COMPILER=$mpicc" "-DMPIEXEC_EXECUTABLE=$dep_prefix/bin/mpirun.openmpi")
    wrapper_prefix=$dep_prefix  # the wrapper finds its flags through OPAL_PREFIX
  fi
  [ -x "$dep_prefix/bin/h5cc" ] && cmake_args+=("-DHDF5_C_COMPILER_EXECUTABLE=$dep_prefix/bin/h5cc")
  [ -x "$dep_prefix/bin/pkgconf" ] && cmake_args+=("-DPKG_CONFIG_EXECUTABLE=$dep_prefix/bin/pkgconf")
  # The check of the bundle alone: the machine's /usr (and /, merged with it) hidden from
  # find_package/find_library/find_path, and the bundle's ninja.
  [ -n "${LEANTRAIN_GPU_ISOLATE:-}" ] &&
    cmake_args+=("-DCMAKE_IGNORE_PREFIX_PATH=/usr;/" "-DCMAKE_MAKE_PROGRAM=$(command -v ninja)")
fi
rm -f "$build/CMakeCache.txt"
if env ${wrapper_prefix:+OPAL_PREFIX=$wrapper_prefix} cmake "${cmake_args[@]}" >"$out/configure.log" 2>&1; then
  nccl_line=$(grep -o 'NCCL: [A-Z]*.*' "$out/configure.log" | head -1)
  record cmake_configure pass "$nccl_line"
  grep -q 'NCCL: ON' "$out/configure.log" || record nccl_found fail "LEANTRAIN_HAVE_NCCL is OFF (see configure.log)"
else
  record cmake_configure fail "see $out/configure.log: $(grep -m1 -A2 'CMake Error' "$out/configure.log" | tr '\n' ' ' | cut -c1-200)"
  finish
fi
{
  echo "resolved in $build/CMakeCache.txt:"
  grep -E '^(CMAKE_COMMAND|CMAKE_MAKE_PROGRAM|MPI_C_HEADER_DIR|MPI_mpi_LIBRARY|GTest_DIR|spdlog_DIR|fmt_DIR|CLI11_DIR|nlohmann_json_DIR|LT_NCCL_LIBRARY|LT_NCCL_INCLUDE_DIR|CUDAToolkit_NVCC_EXECUTABLE|Torch_DIR|ZLIB_LIBRARY_RELEASE|JPEG_LIBRARY_RELEASE|PNG_LIBRARY_RELEASE|PKG_CONFIG_EXECUTABLE)[:=]' "$build/CMakeCache.txt"
  grep -E "^(pkgcfg_lib_TOMLPP_tomlplusplus|HDF5_C_LIBRARY_hdf5|HDF5_C_COMPILER_EXECUTABLE)[:=]" "$build/CMakeCache.txt"
} | tee -a "$out/setup.txt"
[ "$mode" = configure ] && finish

# ------------------------------------------------------------------ build
# Only what the checks run: the executable and three gtest binaries (about a third of the
# tree's objects; the rest would cost device time for nothing).
t0=$(date +%s)
targets=(leantrain test_nccl test_feed_forward test_quantized_state)
if timeout 420 ninja -C "$build" -j"$(nproc)" "${targets[@]}" >"$out/build.log" 2>&1; then
  record build pass "${targets[*]}: $(( $(date +%s) - t0 )) s on $(nproc) cores" \
    "{\"seconds\": $(( $(date +%s) - t0 )), \"jobs\": $(nproc)}"
else
  record build fail "see $out/build.log: $(grep -m1 -E 'error|FAILED' "$out/build.log" | cut -c1-200)"
  finish
fi
[ "$mode" = build ] && finish
else
  for f in bin/leantrain tests/test_nccl tests/test_feed_forward tests/test_quantized_state; do
    [ -x "$build/$f" ] || { record build fail "no $build/$f: build the project first (scripts/build.sh)"; finish; }
  done
  record build pass "the existing build $build (not rebuilt in the rehearsal)"
fi

# ------------------------------------------------------------------ how each check runs
bin=$build/bin/leantrain
# Open MPI as root (the NCCL backend's bootstrap, the MPI ranks); the CMake cache names the
# mpiexec the build found (the bundle's mpirun.openmpi has no plain `mpirun` alias).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpiexec=$(grep -m1 '^MPIEXEC_EXECUTABLE:' "$build/CMakeCache.txt" | cut -d= -f2-)
[ -x "$mpiexec" ] || mpiexec=$(command -v mpirun || echo mpirun)
# Two ranks may share fewer cores: oversubscribe, yield when idle, no binding to one core
# (cluster/mpirun.sh explains each).
mpirun=("$mpiexec" --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)

check_t0=0
begin() {  # NAME: 1 when it is not to run (--only, or no time left: recorded as a skip)
  [ -n "$only" ] && ! grep -qE -- "$only" <<<"$1" && return 1
  check_t0=$(date +%s)
  if [ "$(elapsed)" -ge "$deadline" ]; then
    record "$1" skip "not started: the script's deadline (${deadline} s, LEANTRAIN_GPU_DEADLINE_S) has passed"
    return 1
  fi
  echo "-- $1 ($(elapsed) s)"
}
run_cmd() {  # NAME LIMIT COMMAND...: runs/NAME/{cmd.txt,log.txt,rc,elapsed_s}; LIMIT cut to the deadline
  local name=$1 limit=$2 dir=$runs/$1
  shift 2
  rm -rf "$dir"
  mkdir -p "$dir"
  local left=$(( deadline + 30 - $(elapsed) ))
  [ "$left" -lt "$limit" ] && limit=$left
  printf '%q ' "$@" >"$dir/cmd.txt"
  if [ "$limit" -lt 5 ]; then
    echo "not run: the script's deadline has passed" >"$dir/log.txt"
    echo 124 >"$dir/rc"
    return
  fi
  local t0=$EPOCHREALTIME
  timeout -k 10 "$limit" "$@" >"$dir/log.txt" 2>&1 </dev/null
  echo $? >"$dir/rc"
  awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f\n", b - a }' >"$dir/elapsed_s"
}
train() {  # NAME LIMIT RANKS(0: no mpirun) [ENV=VALUE...] -- leantrain train arguments...
  local name=$1 limit=$2 np=$3 envs=()
  shift 3
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local launch=(env ${envs[@]+"${envs[@]}"})
  [ "$np" -gt 0 ] && launch+=("${mpirun[@]}" -n "$np")
  run_cmd "$name" "$limit" "${launch[@]}" "$bin" train --out "$runs/$name" "$@"
}
judge() {  # NAME KIND [--arg KEY=VALUE]... -- RUN...
  local name=$1 kind=$2 args=() dirs=()
  shift 2
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  for r in "$@"; do dirs+=("$runs/$r"); done
  "$py" "$checks" judge "$out" "$name" "$kind" --device "$device" --elapsed "$(( $(date +%s) - check_t0 ))" \
    ${args[@]+"${args[@]}"} "${dirs[@]}"
}
gtest() {  # RUN LIMIT BINARY FILTER
  run_cmd "$1" "$2" "$build/tests/$3" "--gtest_filter=$4" "--gtest_output=json:$runs/$1/gtest.json"
}

# The shapes. `small`: a GPT on synthetic tokens that learns in a few dozen steps (on a GPU
# configs/gpt_text.toml's d 128, 4 layers, seq 128; in the rehearsal d 64, 2 layers, seq 64,
# one thread so that ctest's parallel tests do not starve it). `big`: GPT-2 small (d 768,
# 12 layers, 12 heads, vocab 50257) at seq 1024, micro-batch 4, bf16, the plain attention core
# and momentum-free SGD — the shape docs/PRECISION_AND_MEMORY.md measured (its claims in
# checks.py); in the rehearsal d 64, 4 layers, 4 heads, vocab 512, seq 256.
# LEANTRAIN_GPU_SHAPES=gpu runs the GPU's shapes on the CPU too (minutes on a few cores: to see
# the memory claims hold where they were measured).
common=(--set data.kind=synthetic --set log.progress=plain --set log.every_steps=10 --set checkpoint.at_end=false)
shapes=${LEANTRAIN_GPU_SHAPES:-$([ "$device" = cuda ] && echo gpu || echo tiny)}
if [ "$shapes" = gpu ]; then
  small=(--config "$top/configs/gpt_text.toml" "${common[@]}" --set data.synthetic_samples=4096
         --set train.steps=40 --set train.warmup_steps=4 --set train.eval_max_batches=1)
  small_steps=40 small_mb2=8  # micro-batch per rank of the 2-rank run (global 32 = 2 x 8 x 2)
  big_model=(--config "$top/configs/gpt2_small.toml" "${common[@]}" --set train.eval_batch=4
             --set train.eval_max_batches=1)
  mfu_sets=(--set train.global_batch=32 --set train.micro_batch=8 --set train.steps=12 --set train.warmup_steps=2
            --set data.synthetic_samples=1024)
else
  small=(--config "$top/configs/gpt_text.toml" "${common[@]}" --set data.synthetic_samples=1024
         --set model.d_model=64 --set model.n_layer=2 --set model.n_head=2 --set model.seq_len=64
         --set train.micro_batch=8 --set train.global_batch=16 --set train.steps=20 --set train.warmup_steps=2
         --set train.lr=3e-3 --set train.eval_batch=16 --set train.eval_max_batches=1 --set train.threads=1)
  small_steps=20 small_mb2=4  # global 16 = 2 x 4 x 2
  big_model=(--config "$top/configs/gpt2_small.toml" "${common[@]}"
             --set model.d_model=64 --set model.n_layer=4 --set model.n_head=4 --set model.vocab_size=512
             --set model.seq_len=256 --set train.eval_batch=4 --set train.eval_max_batches=1 --set train.threads=1)
  mfu_sets=(--set train.global_batch=8 --set train.micro_batch=4 --set train.steps=8 --set train.warmup_steps=2
            --set data.synthetic_samples=128)
fi
small+=(--set "train.device=$device")
big=("${big_model[@]}" --set data.synthetic_samples=64 --set "train.device=$device" --set model.dropout=0
     --set model.attention=plain --set train.optimizer=sgd --set train.momentum=0 --set train.micro_batch=4 --set train.global_batch=4
     --set train.steps=3 --set train.warmup_steps=0 --set precision.mode=bf16)
world_backend=$([ "$device" = cuda ] && echo nccl || echo mpi)
half=$(( small_steps / 2 ))
# Per-run limits (seconds): a small run takes ~5 s on a GPU (most of it start-up), a big one
# ~10-20 s; the limits are generous multiples so that only a hang reaches them.
lim_small=90 lim_big=150 lim_gtest=150
[ "$device" = cpu ] && lim_small=60 lim_big=60 lim_gtest=60
[ "$device" = cpu ] && [ "$shapes" = gpu ] && lim_small=600 lim_big=900

echo "==================== checks on $device ($(elapsed) s) ===================="
if begin leantrain_version; then
  run_cmd version 30 "$bin" --version
  judge leantrain_version version -- version
fi

# test_feed_forward's CUDA variant, the NCCL world-of-one tests and the 8-bit tables' one
# upload: gtests that skip themselves without a GPU (a skip in the rehearsal, a failure here).
if begin gtest_feed_forward_cuda; then
  gtest gtest_ff "$lim_gtest" test_feed_forward 'FeedForward.MatchesThePlainExpressionBitwiseOnCuda'
  judge gtest_feed_forward_cuda gtest --arg 'pattern=FeedForward.MatchesThePlainExpressionBitwiseOnCuda' -- gtest_ff
fi
if begin gtest_nccl_world_of_one; then
  gtest gtest_nccl "$lim_gtest" test_nccl 'NcclWorldOfOne*'
  judge gtest_nccl_world_of_one gtest --arg 'pattern=NcclWorldOfOne*' --arg min_count=7 -- gtest_nccl
fi
if begin gtest_adamw8bit_gpu_tables; then
  gtest gtest_q8 "$lim_gtest" test_quantized_state 'AdamW8bit.TablesReachTheGpuOncePerProcess'
  judge gtest_adamw8bit_gpu_tables gtest --arg 'pattern=AdamW8bit.TablesReachTheGpuOncePerProcess' -- gtest_q8
fi

# The single-GPU fallback: one process, no mpirun, train.device = cuda.
if begin fallback_single_process; then
  train fallback "$lim_small" 0 -- "${small[@]}" --set precision.mode=fp32
  judge fallback_single_process train --arg mode=fp32 -- fallback
fi
# A world of one under mpirun through NCCL (MPI in the rehearsal). leantrain does not log the
# backend it resolved; NCCL_DEBUG=VERSION prints NCCL's version when a communicator is made.
if begin "world_of_one_$world_backend"; then
  train world1 "$lim_small" 1 NCCL_DEBUG=VERSION -- "${small[@]}" --set precision.mode=fp32 \
    --set "comm.backend=$world_backend"
  judge "world_of_one_$world_backend" world_of_one --arg "backend=$world_backend" -- world1
fi
if begin bf16; then
  train bf16 "$lim_small" 0 -- "${small[@]}" --set precision.mode=bf16
  judge bf16 train --arg mode=bf16 -- bf16
fi
if begin fp16_loss_scaling; then
  train fp16 "$lim_small" 0 -- "${small[@]}" --set precision.mode=fp16
  judge fp16_loss_scaling train --arg mode=fp16 -- fp16
fi
# Dropout 0.1 (gpt_text.toml's) under `full` recompute: the rerun must see the same masks.
# The fallback run is `none`; a second `none` measures the device's run-to-run noise.
if begin dropout_full_recompute_replay; then
  [ -f "$runs/fallback/rc" ] || train fallback "$lim_small" 0 -- "${small[@]}" --set precision.mode=fp32
  train replay_none "$lim_small" 0 -- "${small[@]}" --set precision.mode=fp32
  train replay_full "$lim_small" 0 -- "${small[@]}" --set precision.mode=fp32 --set memory.recompute=full
  judge dropout_full_recompute_replay replay -- fallback replay_none replay_full
fi
if begin int8_optimizer_state; then
  [ -f "$runs/bf16/rc" ] || train bf16 "$lim_small" 0 -- "${small[@]}" --set precision.mode=bf16
  train int8 "$lim_small" 0 -- "${small[@]}" --set precision.mode=bf16 --set memory.optimizer_state=int8
  judge int8_optimizer_state int8 --arg mode=bf16 -- int8 bf16
fi
# Peak memory of none / selective / full at GPT-2 small's shape, seq 1024.
if begin recompute_peak_memory; then
  for pol in none selective full; do
    train "mem_$pol" "$lim_big" 0 -- "${big[@]}" --set "memory.recompute=$pol"
  done
  judge recompute_peak_memory memory -- mem_none mem_selective mem_full
fi
# A budget under micro-batch 4's peak (placed from the `none` run above): step 1 runs out of
# memory, backs off to a smaller micro-batch and the run finishes on the same samples.
if begin oom_backoff; then
  [ -f "$runs/mem_none/rc" ] || train mem_none "$lim_big" 0 -- "${big[@]}" --set memory.recompute=none
  budget=$("$py" "$checks" budget "$runs/mem_none")
  train oom "$lim_big" 0 -- "${big[@]}" --set memory.recompute=none --memory-budget "$budget"
  judge oom_backoff oom -- mem_none oom
fi
# MFU of GPT-2 small in bf16 (configs/gpt2_small.toml: SDPA, dropout 0.1, AdamW).
if begin mfu_gpt2_small_bf16; then
  train mfu "$lim_big" 0 -- "${big_model[@]}" --set "train.device=$device" --set precision.mode=bf16 "${mfu_sets[@]}"
  judge mfu_gpt2_small_bf16 mfu -- mfu
fi
# A checkpoint written on one device resumed on the other (FP32 HDF5): the uninterrupted run
# on the first device writes it half-way; the resumed run's losses must follow that run's.
resume_check() {  # NAME FROM-DEVICE TO-DEVICE
  local ref=ck_$2 res=ck_$2_to_$3
  train "$ref" "$lim_small" 0 -- "${small[@]}" --set precision.mode=fp32 --set model.dropout=0 \
    --set "train.device=$2" --set "checkpoint.every_steps=$half"
  local ck
  ck=$(printf '%s/%s/checkpoints/step-%08d.h5' "$runs" "$ref" "$half")
  timeout 60 "$bin" inspect "$ck" --json >"$runs/$ref/inspect.json" 2>>"$runs/$ref/log.txt"
  train "$res" "$lim_small" 0 -- "${small[@]}" --set precision.mode=fp32 --set model.dropout=0 \
    --set "train.device=$3" --resume "$ck"
  judge "$1" resume --arg "from_step=$half" --arg "from_device=$2" --arg "to_device=$3" -- "$ref" "$res"
}
if [ "$device" = cuda ]; then
  begin checkpoint_gpu_to_cpu && resume_check checkpoint_gpu_to_cpu cuda cpu
  begin checkpoint_cpu_to_gpu && resume_check checkpoint_cpu_to_gpu cpu cuda
else  # the rehearsal has one device: the same plumbing and criterion, CPU to CPU
  begin checkpoint_gpu_to_cpu && resume_check checkpoint_gpu_to_cpu cpu cpu
fi
# Two ranks sharing the one GPU through MPI (CUDA tensors through host memory), ZeRO stage 2:
# the ShardedOptimizer's CUDA path, the reduce-scatters and all-gathers over MPI.
if begin two_ranks_mpi_sharded; then
  train sharded "$lim_small" 2 -- "${small[@]}" --set precision.mode=fp32 --set comm.backend=mpi \
    --set memory.shard=gradients --set "train.micro_batch=$small_mb2"
  judge two_ranks_mpi_sharded sharded --arg ranks=2 -- sharded
fi
finish
