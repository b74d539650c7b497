#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), then configures and builds leantrain into
# ./build with ccache and a precompiled LibTorch header. Extra arguments go to ninja.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$top/scripts/setup.sh"

# ccache lives outside the clone (CMakeLists.txt sets its PCH sloppiness and BASEDIR).
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
ccache --max-size=8G >/dev/null 2>&1 || true

build=${LEANTRAIN_BUILD_DIR:-$top/build}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$top" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
# Two cores and ~1.6 GB per LibTorch translation unit: -j$(nproc) fits in memory.
ninja -C "$build" -j"$(nproc)" "$@"
ccache -s 2>/dev/null | grep -E "Hits|Misses|hit rate" | head -3 || true
