#!/usr/bin/env bash
# Sourced by tests/install/run.sh and examples/custom_model/ci.sh: installs leantrain into a
# fresh temporary prefix and builds another CMake project against it, as a user would.
#
#   build_against_install BUILD SOURCE PROJECT_DIR TARGET [CMAKE [GENERATOR [CXX [CC [TORCH_DIR]]]]]
#
# Sets: tmp (a fresh folder in BUILD, removed on exit: same depth on every run, so ccache
# hits), prefix ($tmp/prefix: installed into another folder, then moved there), pbuild ($tmp/build, the project's build), t_install, t_build
# (seconds). TORCH_DIR (the project's Torch_DIR) is used only when SOURCE/.venv has no torch.
fail() { echo "${fail_prefix:-build_against_install}: FAIL: $*" >&2; exit 1; }

build_against_install() {
  local build src project target cmake generator cxx cc torch_dir
  build=$(cd "$1" && pwd); src=$(cd "$2" && pwd); project=$3; target=$4
  cmake=${5:-cmake}; generator=${6:-Ninja}; cxx=${7:-}; cc=${8:-}; torch_dir=${9:-}
  tmp=$(mktemp -d "$build/$target.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  prefix=$tmp/prefix
  pbuild=$tmp/build
  local t0 t1 t2
  t0=$(date +%s)

  # 1. Install, then move the prefix: the package must be relocatable (a user copies an
  #    installed tree, or a packager installs into a staging folder). No installed file may
  #    name the folder it was installed into.
  local staged=$tmp/staged
  "$cmake" --install "$build" --prefix "$staged" > "$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
  [[ -n $(find "$staged" -name leantrainConfig.cmake | head -1) ]] || fail "no leantrainConfig.cmake under the prefix"
  local pinned
  pinned=$(grep -rlF "$staged" "$staged" 2>/dev/null || true)
  [[ -z $pinned ]] || fail "installed files name the install prefix $staged (not relocatable): $pinned"
  mv "$staged" "$prefix"

  # 2. LibTorch's CMake prefix, as a user of the PyPI wheel finds it.
  local torch_prefix=
  if [[ -x $src/.venv/bin/python ]]; then
    torch_prefix=$("$src/.venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
  fi
  if [[ -z $torch_prefix && -n $torch_dir ]]; then
    torch_prefix=$(cd "$torch_dir/.." && pwd)
  fi
  [[ -n $torch_prefix ]] || fail "no LibTorch: neither $src/.venv nor a Torch_DIR"

  # 3. Configure and build with the project's compilers and ccache settings (CMakeLists.txt).
  local launcher=() compilers=()
  if command -v ccache > /dev/null; then
    export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
    export CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  [[ -n $cxx ]] && compilers+=("-DCMAKE_CXX_COMPILER=$cxx")
  [[ -n $cc ]] && compilers+=("-DCMAKE_C_COMPILER=$cc")
  "$cmake" -S "$project" -B "$pbuild" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
    "-DCMAKE_PREFIX_PATH=$prefix;$torch_prefix" "${compilers[@]}" "${launcher[@]}" \
    > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; fail "configure $project"; }
  local found
  found=$(sed -n 's/^leantrain_DIR:PATH=//p' "$pbuild/CMakeCache.txt")
  [[ $found == "$prefix/"* ]] || fail "leantrain_DIR is $found, not under the install prefix"
  t1=$(date +%s)
  "$cmake" --build "$pbuild" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "build $project"; }
  t2=$(date +%s)
  t_install=$((t1 - t0))
  t_build=$((t2 - t1))
}
