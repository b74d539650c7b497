#!/usr/bin/env bash
# Builds everything (installing what is missing) and runs the whole test suite with CTest.
# This is the README's test command and what CI runs (.ci/run).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$top/scripts/build.sh"
build=${LEANTRAIN_BUILD_DIR:-$top/build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" --timeout 900 "$@"
