#!/usr/bin/env bash
# Downloads the Debian packages that tests/gpu/run.sh may need on a GPU machine that has a
# compiler, CMake, ninja, CUDA and PyTorch but no Open MPI, HDF5, GoogleTest, toml++, CLI11,
# spdlog/fmt, nlohmann-json or pkg-config (and can reach no package registry). Run it here,
# on the Debian 12 build machine; it fills .cache/gpu-debs/ (ignored by git), which travels
# with the run as a carried path. Only the .deb files are fetched, never installed.
#
# The set is the dependency closure of the packages below on an empty system, less the
# toolchain and the base system every such machine has (libc, libstdc++, gcc, perl, ...):
# run.sh unpacks a package only when its shared libraries are missing there.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=${LEANTRAIN_GPU_DEBS:-$top/.cache/gpu-debs}

wanted=(libopenmpi-dev openmpi-bin openmpi-common libhdf5-dev hdf5-helpers libgtest-dev libcli11-dev
        libtomlplusplus-dev nlohmann-json3-dev libspdlog-dev libfmt-dev zlib1g-dev pkgconf)

# Never carried: the compiler and C/C++ runtimes (the GPU machine's own must be used), the
# base system, and what only Fortran, X11, OpenCL or the hwloc plugins need.
skip_re='^(gcc-.*|cpp-.*|g\+\+-.*|gfortran.*|libgfortran.*|libgcc.*|libstdc\+\+.*|libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libcrypt.*|binutils.*|libbinutils|libctf.*|libgprofng.*|libjansson.*|libasan.*|liblsan.*|libtsan.*|libubsan.*|libitm.*|libatomic.*|libquadmath.*|libgomp.*|libcc1-.*|libisl.*|libmpfr.*|libmpc.*|libgmp.*|perl|perl-.*|libperl.*|m4|autoconf|automake|autotools-dev|openssh-client|dpkg|tar|debianutils|debconf|passwd|adduser|libpam.*|libaudit.*|libsemanage.*|libsepol.*|libselinux.*|libdb5.*|libgdbm.*|libcap-ng.*|libacl1|libbz2-.*|liblzma.*|libmd0|libpcre2-.*|libzstd.*|zlib1g|libtinfo.*|libedit.*|libbsd.*|libjs-.*|libx11-.*|libxcb.*|libxau.*|libxdmcp.*|libxext.*|libxnvctrl.*|ocl-icd-.*|libhwloc-plugins|libicu.*|libxml2|libpciaccess.*|catch2|googletest|libtirpc.*|libnsl.*|rpcsvc-proto|libssl-dev|libcurl4-openssl-dev|libjpeg.*|libfido2-.*|libcbor.*|libudev1)$'

# apt needs its package lists once (a fresh machine has none).
if [ "$(id -u)" = 0 ] && ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
  apt-get update -qq
fi

# The closure as apt resolves it on a machine with nothing installed (an empty dpkg status).
empty=$(mktemp)
trap 'rm -f "$empty"' EXIT
mapfile -t closure < <(apt-get -s -o Dir::State::status="$empty" --no-install-recommends install "${wanted[@]}" 2>/dev/null |
                        awk '/^Inst /{print $2}')
if [ ${#closure[@]} -eq 0 ]; then
  echo "fetch_debs: apt-get resolved no packages (run 'apt-get update' first?)" >&2
  exit 1
fi
pkgs=()
for p in "${closure[@]}"; do
  [[ $p =~ $skip_re ]] || pkgs+=("$p")
done

mkdir -p "$dest"
rm -f "$dest"/*.deb
cd "$dest"
if ! apt-get download -q "${pkgs[@]}" >"$dest/download.log" 2>&1; then
  cat "$dest/download.log" >&2
  exit 1
fi
rm -f "$dest/download.log"
cd - >/dev/null
# Plain names (<package>.deb): the versions carry '%', '+' and '~'.
for f in "$dest"/*_*.deb; do
  mv -f "$f" "$dest/$(dpkg-deb -f "$f" Package).deb"
done
got=$(find "$dest" -maxdepth 1 -name '*.deb' | wc -l)
if [ "$got" -ne "${#pkgs[@]}" ]; then
  echo "fetch_debs: expected ${#pkgs[@]} packages, got $got in $dest" >&2
  exit 1
fi
printf '%s\n' "${pkgs[@]}" >"$dest/PACKAGES"
echo "fetch_debs: $got packages, $(du -sh "$dest" | cut -f1) in $dest (carry it: .cache/gpu-debs)"
