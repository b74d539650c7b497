#!/usr/bin/env bash
# The checks that need a GPU, in one call (tests/gpu/README.md): builds leantrain against the
# PyTorch found on the machine, then runs the NCCL world-of-one tests (tests/unit/test_nccl.cpp),
# short CUDA training runs in fp32, bf16 and fp16 (GPT; and a bf16 ResNet under full and a GPT
# under selective recompute) (loss decreases, loss_scale and CUDA
# peak_mem_bytes in metrics.jsonl) and prints a summary table last.
#
#   bash tests/gpu/run.sh                    # on the GPU machine: everything
#   bash tests/gpu/run.sh --configure-only   # anywhere: resolve and unpack deps, run CMake
#   bash tests/gpu/run.sh --build-only       # anywhere: also build, run nothing
#
# Missing CMake/ninja/Open MPI/HDF5/libjpeg/libpng/GoogleTest/toml++/CLI11/spdlog/json/pkg-config
# come from the .deb files tests/gpu/fetch_debs.sh put in .cache/gpu-debs (carried along),
# unpacked with dpkg -x into a prefix — never into / — and only those whose shared libraries
# the machine lacks; the bundle's bundle.env then points the environment into that prefix.
# Logs go to $OUT (the device tool's folder) or .cache/gpu-out.
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mode=full
case "${1:-}" in
  --configure-only) mode=configure ;;
  --build-only) mode=build ;;
  "") ;;
  *) echo "usage: $0 [--configure-only|--build-only]" >&2; exit 2 ;;
esac
out=${OUT:-$top/.cache/gpu-out}
build=${LEANTRAIN_GPU_BUILD:-$top/build-gpu}
pfx=${LEANTRAIN_GPU_PREFIX:-/tmp/leantrain-gpu-prefix}
debs=${LEANTRAIN_GPU_DEBS:-$top/.cache/gpu-debs}
mkdir -p "$out"
t_start=$(date +%s)

results=()
failed=0
record() {  # name status detail
  results+=("$(printf '%-34s %-5s %s' "$1" "$2" "$3")")
  [ "$2" = FAIL ] && failed=$((failed + 1))
  echo "== $1: $2 $3"
}
summary() {
  echo
  echo "==================== leantrain GPU checks ($(( $(date +%s) - t_start )) s) ===================="
  printf '%s\n' "${results[@]}"
  echo "logs: $out"
  if [ "$failed" -gt 0 ]; then echo "RESULT: $failed FAILED"; else echo "RESULT: all passed"; fi
}
finish() { summary | tee "$out/summary.txt"; [ "$failed" -eq 0 ]; exit $?; }

# ------------------------------------------------------------------ the machine
{
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  cores: $(nproc)"
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  command -v nvcc >/dev/null && nvcc --version | tail -2
  for t in g++ cmake ninja; do printf '%s: %s\n' "$t" "$(command -v $t || echo MISSING)"; done
  g++ --version 2>/dev/null | head -1
  [ -r /etc/os-release ] && grep PRETTY_NAME /etc/os-release
} 2>&1 | tee "$out/setup.txt"

# ------------------------------------------------------------------ PyTorch, CUDA, NCCL
py=""
for cand in "$top/.venv/bin/python" python3 python; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch" 2>/dev/null; then py=$(command -v "$cand"); break; fi
done
[ -n "$py" ] || { record "torch" FAIL "no python with torch (tried .venv, python3, python)"; finish; }
read -r torch_version torch_prefix site < <("$py" -c "
import os, torch
print(torch.__version__, torch.utils.cmake_prefix_path, os.path.dirname(os.path.dirname(torch.__file__)))")
record "torch" ok "$torch_version from $py"

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
record "cuda toolkit / nccl" ok "${cuda_root:-none} / ${nccl_root:-none}"

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
  record "debian packages" ok "${#unpacked[@]} unpacked into $pfx, ${#kept[@]} already on the machine"
  # LD_LIBRARY_PATH, PATH (after the machine's own tools), PKG_CONFIG_*, and Open MPI's and
  # PMIx's prefixes (OPAL_PREFIX, PMIX_INSTALL_PREFIX: their plugins, at run time too).
  [ -f "$debs/bundle.env" ] || { record "debian packages" FAIL "$debs has no bundle.env: run tests/gpu/fetch_debs.sh again"; finish; }
  # shellcheck disable=SC1091
  . "$debs/bundle.env"
  # LEANTRAIN_GPU_ISOLATE=1 (fetch_debs.sh --configure-only): the prefix's tools first.
  [ -n "${LEANTRAIN_GPU_ISOLATE:-}" ] && export PATH="$pfx/usr/bin:$PATH"
else
  record "debian packages" skip "none carried ($debs): using the machine's"
fi
# CMake and ninja: the machine's, or the bundle's (on the PATH now).
for t in g++ cmake ninja; do
  command -v "$t" >/dev/null || { record "tools" FAIL "$t not on PATH (nor in the bundle)"; finish; }
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
  record "cmake configure" ok "$nccl_line"
  grep -q 'NCCL: ON' "$out/configure.log" || record "nccl found" FAIL "LEANTRAIN_HAVE_NCCL is OFF (see configure.log)"
else
  record "cmake configure" FAIL "see $out/configure.log: $(grep -m1 -A2 'CMake Error' "$out/configure.log" | tr '\n' ' ' | cut -c1-200)"
  finish
fi
{
  echo "resolved in $build/CMakeCache.txt:"
  grep -E '^(CMAKE_COMMAND|CMAKE_MAKE_PROGRAM|MPI_C_HEADER_DIR|MPI_mpi_LIBRARY|GTest_DIR|spdlog_DIR|fmt_DIR|CLI11_DIR|nlohmann_json_DIR|LT_NCCL_LIBRARY|LT_NCCL_INCLUDE_DIR|CUDAToolkit_NVCC_EXECUTABLE|Torch_DIR|ZLIB_LIBRARY_RELEASE|JPEG_LIBRARY_RELEASE|PNG_LIBRARY_RELEASE|PKG_CONFIG_EXECUTABLE)[:=]' "$build/CMakeCache.txt"
  grep -E "^(pkgcfg_lib_TOMLPP_tomlplusplus|HDF5_C_LIBRARY_hdf5|HDF5_C_COMPILER_EXECUTABLE)[:=]" "$build/CMakeCache.txt"
} | tee -a "$out/setup.txt"
[ "$mode" = configure ] && finish

# ------------------------------------------------------------------ build
t0=$(date +%s)
if timeout 420 ninja -C "$build" -j"$(nproc)" leantrain test_nccl >"$out/build.log" 2>&1; then
  record "build leantrain test_nccl" ok "$(( $(date +%s) - t0 )) s"
else
  record "build leantrain test_nccl" FAIL "see $out/build.log: $(grep -m1 -E 'error|FAILED' "$out/build.log" | cut -c1-200)"
  finish
fi
[ "$mode" = build ] && finish
bin=$build/bin/leantrain
# Open MPI (the NCCL backend's bootstrap, singleton MPI_Init in a world of one) as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ------------------------------------------------------------------ on the GPU
ver=$("$bin" --version 2>&1)
echo "$ver"
if grep -q 'NCCL 2\.' <<<"$ver" && grep -qE 'CUDA devices visible: [1-9]' <<<"$ver"; then
  record "leantrain --version" ok "$(grep NCCL <<<"$ver" | xargs), $(grep 'CUDA devices' <<<"$ver" | xargs)"
else
  record "leantrain --version" FAIL "$(tr '\n' ' ' <<<"$ver" | cut -c1-200)"
fi

t0=$(date +%s)
timeout 180 "$build/tests/test_nccl" >"$out/test_nccl.log" 2>&1
rc=$?
passed=$(grep -oE '\[  PASSED  \] [0-9]+' "$out/test_nccl.log" | grep -oE '[0-9]+$')
skipped_gpu=$(grep -cE '^\[  SKIPPED \] NcclWorldOfOne' "$out/test_nccl.log")
if [ "$rc" = 0 ] && [ "$skipped_gpu" = 0 ]; then
  record "test_nccl (NCCL world of one)" ok "${passed:-?} passed, $(( $(date +%s) - t0 )) s"
else
  record "test_nccl (NCCL world of one)" FAIL "rc $rc, ${skipped_gpu} GPU tests skipped: $(grep -E '^\[  FAILED  \]|Failure' "$out/test_nccl.log" | head -3 | tr '\n' ' ' | cut -c1-240)"
fi

# Short CUDA runs of the byte-level GPT on synthetic tokens (no data files needed).
train() {  # name precision [extra --set ...]
  local name=$1 prec=$2
  shift 2
  local dir=$out/runs/$name sets=()
  for kv in data.kind=synthetic data.synthetic_samples=8192 train.steps=40 train.warmup_steps=4 \
            train.eval_max_batches=2 train.device=cuda log.progress=plain log.every_steps=10 \
            "precision.mode=$prec" "$@"; do
    sets+=(--set "$kv")
  done
  rm -rf "$dir"
  mkdir -p "$dir"
  local t0
  t0=$(date +%s)
  timeout 150 "$bin" train --config "$top/configs/${TRAIN_CONFIG:-gpt_text.toml}" "${sets[@]}" --out "$dir" >"$dir/log.txt" 2>&1
  local rc=$?
  cat "$dir/log.txt" >>"$out/train.log"
  if [ "$rc" != 0 ]; then
    record "train $name" FAIL "exit $rc: $(grep -iE 'error|fail' "$dir/log.txt" | head -2 | tr '\n' ' ' | cut -c1-200)"
    return
  fi
  local verdict
  if verdict=$("$py" "$top/tests/gpu/check_run.py" "$dir" "$dir/log.txt" "$prec" --device cuda); then
    record "train $name" ok "${verdict#ok: }, $(( $(date +%s) - t0 )) s"
  else
    record "train $name" FAIL "${verdict#FAIL: }"
  fi
}
: >"$out/train.log"
train cuda-fp32 fp32
train cuda-bf16 bf16
train cuda-fp16 fp16
# The same through the NCCL backend in a world of one: parameter broadcasts and the
# loss scaler's found-inf all-reduce go over NCCL.
train cuda-fp16-nccl fp16 comm.backend=nccl
# A channels-last bottleneck ResNet under `full` recompute: the CUDA paths of packed block
# inputs and mask_relu (Note [Packed block inputs]); and GPT under `selective`, whose
# dropout draws again on CUDA (Note [Dropout masks kept as bits] is CPU-only).
TRAIN_CONFIG=fashion_mnist_resnet.toml train cuda-resnet-bf16-full bf16 memory.recompute=full \
  model.stem=imagenet model.block=bottleneck "model.layers=[1,2]" model.width=16 data.synthetic_samples=256
train cuda-bf16-selective bf16 memory.recompute=selective
# 8-bit AdamW moments on CUDA: the ATen path of the block-wise quantisation (docs/SHARDING.md;
# the CPU runs a kernel of its own). One GPU cannot host two NCCL ranks, so the sharded
# collectives' CUDA path (ncclReduceScatter / ncclAllGather) is not run here.
train cuda-bf16-int8-state bf16 memory.optimizer_state=int8
# Keep the metrics of one run (the files that come back are few).
cp "$out/runs/cuda-fp16/metrics.jsonl" "$out/metrics-fp16.jsonl" 2>/dev/null
rm -rf "$out/runs"
finish
