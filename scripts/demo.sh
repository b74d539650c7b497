#!/usr/bin/env bash
# Builds leantrain (installing what is missing) and trains the default demo config:
# a small ResNet on Fashion-MNIST, one epoch, a few minutes on a 2-core CPU.
# Extra arguments go to `leantrain train` (e.g. --set train.epochs=2).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$top/scripts/build.sh" leantrain
build=${LEANTRAIN_BUILD_DIR:-$top/build}
cd "$top"
exec "$build/bin/leantrain" train --config configs/demo.toml --out runs/demo "$@"
