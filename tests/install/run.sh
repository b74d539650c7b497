#!/usr/bin/env bash
# The installed package from another project (ctest: install_consumer):
#   1. cmake --install BUILD --prefix TMP/prefix
#   2. configure tests/install/consumer with CMAKE_PREFIX_PATH="TMP/prefix;<LibTorch prefix>",
#      build it (same compiler, generator and ccache settings as the project), run it
#   3. check what it prints: config parsed, local communicator, finite loss that one SGD step
#      lowers, checkpoint read back equal, every installed header compiled
# TMP is a fresh folder in BUILD (same depth on every run, so ccache hits), removed on exit.
#
#   run.sh BUILD SOURCE [CMAKE [GENERATOR [CXX [CC [TORCH_DIR]]]]]
# TORCH_DIR (the project's Torch_DIR) is used only when SOURCE/.venv has no torch.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
cmake=${3:-cmake}
generator=${4:-Ninja}
cxx=${5:-}
cc=${6:-}
torch_dir=${7:-}

tmp=$(mktemp -d "$build/install_consumer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s)

fail() { echo "install_consumer: FAIL: $*" >&2; exit 1; }

# 1. Install.
"$cmake" --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
cfg=$(find "$tmp/prefix" -name leantrainConfig.cmake | head -1)
[[ -n $cfg ]] || fail "no leantrainConfig.cmake under the prefix"
for h in runtime/config.h models/model.h comm/communicator.h checkpoint_io/checkpoint.h trainers/trainer.h; do
  [[ -f $tmp/prefix/include/leantrain/$h ]] || fail "header include/leantrain/$h not installed"
done
echo "installed: $(find "$tmp/prefix" -type f | wc -l) files, config ${cfg#"$tmp/prefix/"}"
if [[ -e $tmp/prefix/bin/leantrain ]]; then  # built with LEANTRAIN_BUILD_CLI: it runs from the prefix
  version=$("$tmp/prefix/bin/leantrain" --version) || fail "installed bin/leantrain --version"
  [[ $version == "leantrain "* ]] || fail "installed bin/leantrain --version printed: $version"
  echo "installed bin/leantrain: ${version%%$'\n'*}"
fi

# 2. LibTorch's CMake prefix, as a user of the PyPI wheel finds it.
torch_prefix=
if [[ -x $src/.venv/bin/python ]]; then
  torch_prefix=$("$src/.venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
fi
if [[ -z $torch_prefix && -n $torch_dir ]]; then
  torch_prefix=$(cd "$torch_dir/.." && pwd)
fi
[[ -n $torch_prefix ]] || fail "no LibTorch: neither $src/.venv nor a Torch_DIR"

# The project's ccache settings (CMakeLists.txt), through the environment.
launcher=()
if command -v ccache > /dev/null; then
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  export CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
compilers=()
[[ -n $cxx ]] && compilers+=("-DCMAKE_CXX_COMPILER=$cxx")
[[ -n $cc ]] && compilers+=("-DCMAKE_C_COMPILER=$cc")

"$cmake" -S "$src/tests/install/consumer" -B "$tmp/build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$tmp/prefix;$torch_prefix" "${compilers[@]}" "${launcher[@]}" \
  > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; fail "configure the consumer"; }
grep -q "leantrain" "$tmp/build/CMakeCache.txt" || fail "consumer cache does not mention leantrain"
found=$(sed -n 's/^leantrain_DIR:PATH=//p' "$tmp/build/CMakeCache.txt")
[[ $found == "$tmp/prefix/"* ]] || fail "leantrain_DIR is $found, not under the install prefix"
t1=$(date +%s)
"$cmake" --build "$tmp/build" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "build the consumer"; }
t2=$(date +%s)

# 3. Run and check.
mkdir "$tmp/out"
rc=0
out=$("$tmp/build/consumer" "$tmp/out") || rc=$?
[[ $rc == 0 ]] || { echo "$out"; fail "consumer exited with $rc"; }
echo "$out"
field() { sed -n "s/^$1 .*\\b$2=\\([^ ]*\\).*/\\1/p" <<< "$out"; }
[[ $(field config model) == mlp && $(field config seed) == 7 ]] || fail "config not parsed"
[[ $(field comm backend) == local && $(field comm size) == 1 && $(field comm sum) == 3 ]] || fail "local communicator"
[[ $(field train lr) == 0.05 ]] || fail "lr_at"
loss=$(field train loss); after=$(field train loss_after)
[[ $loss =~ ^[0-9]+\.[0-9]+$ && $after =~ ^[0-9]+\.[0-9]+$ ]] || fail "loss $loss / $after not finite"
awk -v a="$loss" -v b="$after" 'BEGIN { exit !(a > 0 && b < a) }' || fail "one step did not lower the loss ($loss -> $after)"
[[ $(field checkpoint equal) == 1 && $(field checkpoint tensors) -gt 0 && $(field checkpoint step) == 1 ]] \
  || fail "checkpoint not read back equal"
[[ -s $tmp/out/consumer.h5 ]] || fail "no checkpoint file"
headers=$(find "$tmp/prefix/include/leantrain" -name '*.h' | wc -l)
[[ $(field headers included) == "$headers" ]] || fail "the consumer compiled $(field headers included) of $headers installed headers"
echo "install_consumer: OK (install+configure $((t1 - t0)) s, build $((t2 - t1)) s, total $(($(date +%s) - t0)) s)"
