#!/usr/bin/env bash
# Installs everything leantrain needs on a Debian 12 machine, as root. Idempotent: a second
# run installs nothing and takes a few seconds.
#   - Debian packages: compilers, Open MPI, HDF5, GoogleTest, ccache, CLI11, toml++,
#     nlohmann-json, spdlog, gnuplot (`leantrain report`) and libpng (its test), universal-ctags
#     (the code-shape test), the
#     Fashion-MNIST data set and the fortunes text corpus, and
#     what the local cluster harnesses need (cluster/packages.txt: Slurm, PMIx, iproute2).
#   - A virtualenv holding torch==2.11.0 (its LibTorch is what the build links), kept outside
#     the clone under $LEANTRAIN_CACHE keyed by the hash of requirements.txt, and linked
#     as ./.venv so every clone of the same requirements shares one.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${LEANTRAIN_CACHE:-$HOME/.cache/leantrain}

debs=(build-essential cmake ninja-build ccache pkg-config git
      openmpi-bin libopenmpi-dev libhdf5-dev hdf5-tools
      libgtest-dev libgmock-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
      libspdlog-dev libfmt-dev zlib1g-dev
      dataset-fashion-mnist fortunes fortunes-min
      python3 python3-venv python3-dev
      iproute2 procps
      gnuplot-nox libpng-dev libjpeg62-turbo-dev
      universal-ctags)  # tests/scripts/code_shape.sh measures functions with it
# The local multi-host harnesses (cluster/netns_hosts.sh, cluster/slurm_local.sh).
mapfile -t cluster_debs < <(grep -v '^[[:space:]]*#' "$top/cluster/packages.txt" | grep -v '^[[:space:]]*$')
debs+=("${cluster_debs[@]}")
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The virtualenv, keyed by the pinned requirements.
key=$(sha256sum "$top/requirements.txt" | cut -c1-16)
venv="$cache/venv-$key"
if [ ! -f "$venv/.complete" ]; then
  echo "setup: creating virtualenv $venv (torch==2.11.0 from PyPI, a few GB on first run)"
  rm -rf "$venv"
  mkdir -p "$cache"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -r "$top/requirements.txt"
  touch "$venv/.complete"
fi
ln -sfn "$venv" "$top/.venv"
"$top/.venv/bin/python" - <<'PY'
import torch
print(f"setup: torch {torch.__version__} at {torch.utils.cmake_prefix_path}")
PY
