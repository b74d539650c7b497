#!/usr/bin/env bash
# Downloads the Debian packages that tests/gpu/run.sh may need on a GPU machine that has a
# compiler, CUDA and PyTorch but maybe no CMake, ninja, Open MPI, HDF5, libjpeg, libpng,
# GoogleTest, toml++, CLI11, spdlog/fmt, nlohmann-json or pkg-config (and can reach no
# package registry). Run it here, on the Debian 12 build machine; it fills .cache/gpu-debs/
# (ignored by git), which travels with the run as a carried path. Only the .deb files are
# fetched, never installed.
#
#   bash tests/gpu/fetch_debs.sh                   # -> .cache/gpu-debs/ (LEANTRAIN_GPU_DEBS)
#   bash tests/gpu/fetch_debs.sh --configure-only  # the check (ctest gpu_bundle_configure):
#       unpack the bundle into a fresh prefix, configure the project with run.sh against that
#       prefix alone (/usr hidden from CMake's searches), list where each dependency was
#       found — failing when one was not the bundle's — and start a singleton MPI_Init from
#       the prefix with the machine's Open MPI and PMIx plugin folders hidden. Builds nothing.
#
# The set is the dependency closure of the packages below on an empty system, less the
# toolchain and the base system every such machine has (libc, libstdc++, gcc, perl, ...):
# run.sh unpacks a package only when its shared libraries are missing there. Downloads are
# cached outside the clone, in $LEANTRAIN_DEB_CACHE (default ~/.cache/leantrain/debs), one
# folder per package list; apt's lists are updated only when that cache misses.
# The bundle also holds bundle.env, which run.sh sources after unpacking (see write_env).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mode=fetch
case "${1:-}" in
  --configure-only) mode=configure ;;
  "") ;;
  *) echo "usage: $0 [--configure-only]" >&2; exit 2 ;;
esac
dest=${LEANTRAIN_GPU_DEBS:-$top/.cache/gpu-debs}
cache_root=${LEANTRAIN_DEB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leantrain/debs}

# data/ and tests/ need libjpeg-turbo and libpng (find_package(JPEG/PNG) REQUIRED); CMake
# and ninja are bundled too: a machine may have neither (its own are used when it has them).
wanted=(libopenmpi-dev openmpi-bin openmpi-common libhdf5-dev hdf5-helpers libgtest-dev libcli11-dev
        libtomlplusplus-dev nlohmann-json3-dev libspdlog-dev libfmt-dev zlib1g-dev pkgconf
        libjpeg62-turbo-dev libpng-dev cmake ninja-build)

# Never carried: the compiler and C/C++ runtimes (the GPU machine's own must be used), the
# base system, what only Fortran, X11, OpenCL or the hwloc plugins need, and what cmake's
# package pulls in but CMake does not run (procps and its systemd/perl chain).
# libjpeg was skipped here once, when only libhdf5-dev pulled it in (leantrain did not use
# it); data/ now links it, so libjpeg62-turbo(-dev) is carried like any other package.
skip_re='^(gcc-.*|cpp-.*|g\+\+-.*|gfortran.*|libgfortran.*|libgcc.*|libstdc\+\+.*|libc6|libc6-dev|libc-dev-bin|linux-libc-dev|libcrypt.*|binutils.*|libbinutils|libctf.*|libgprofng.*|libjansson.*|libasan.*|liblsan.*|libtsan.*|libubsan.*|libitm.*|libatomic.*|libquadmath.*|libgomp.*|libcc1-.*|libisl.*|libmpfr.*|libmpc.*|libgmp.*|perl|perl-.*|libperl.*|lib.*-perl|usrmerge|init-system-helpers|procps|libproc2-.*|libsystemd.*|libgcrypt.*|libgpg-error.*|liblz4-.*|libcap2|m4|autoconf|automake|autotools-dev|openssh-client|dpkg|tar|debianutils|debconf|passwd|adduser|libpam.*|libaudit.*|libsemanage.*|libsepol.*|libselinux.*|libdb5.*|libgdbm.*|libcap-ng.*|libacl1|libbz2-.*|liblzma.*|libmd0|libpcre2-.*|libzstd.*|zlib1g|libtinfo.*|libedit.*|libbsd.*|libjs-.*|libx11-.*|libxcb.*|libxau.*|libxdmcp.*|libxext.*|libxnvctrl.*|ocl-icd-.*|libhwloc-plugins|libpciaccess.*|catch2|googletest|libtirpc.*|libnsl.*|rpcsvc-proto|libssl-dev|libcurl4-openssl-dev|libfido2-.*|libcbor.*|libudev1)$'

arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
# The cache key: what decides the set (the list, the skips, the release, this script's
# bundle layout); the versions are those of the day the set was fetched, consistently.
key=$({ printf '%s\n' "${wanted[@]}" "$skip_re" "$arch" "$(cat /etc/debian_version)" "bundle-layout 2"; } |
      sha256sum | cut -c1-16)
cache=$cache_root/$key

# bundle.env: sourced by tests/gpu/run.sh with $pfx set, after it unpacked this bundle there
# with dpkg -x. Debian's Open MPI and PMIx look for their plugins, help files and orted
# under the prefixes they were built with (/usr, /usr/lib/<multiarch>/pmix2): on a machine
# without them, even a singleton MPI_Init (leantrain in a world of one) fails unless they
# are told the unpacked prefix (OPAL_PREFIX; PMIX_INSTALL_PREFIX and PMIx's component path).
write_env() {  # folder
  {
    echo "# Written by tests/gpu/fetch_debs.sh; sourced by tests/gpu/run.sh with \$pfx the prefix"
    echo "# this bundle was unpacked into (dpkg -x)."
    echo "ma=$multiarch"
    cat <<'EOF'
lib=$pfx/usr/lib/$ma
export LD_LIBRARY_PATH="$lib:$lib/hdf5/serial:$lib/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PATH:$pfx/usr/bin"  # after the machine's own tools (cmake, ninja, pkg-config, ...)
export PKG_CONFIG_SYSROOT_DIR=$pfx PKG_CONFIG_LIBDIR="$lib/pkgconfig:$pfx/usr/share/pkgconfig"
# Open MPI from the prefix, at run time too (its plugins, help files, orted) when it came from it.
if [ -f "$lib/libmpi.so.40" ]; then
  export OPAL_PREFIX=$pfx/usr PATH="$pfx/usr/bin:$PATH"
fi
# PMIx (Open MPI's run-time client, used by MPI_Init even in a singleton): its MCA plugins
# (pmix_mca_*.so) and help files, relocated with it.
if [ -d "$lib/pmix2/lib/pmix" ]; then
  export PMIX_INSTALL_PREFIX=$lib/pmix2 PMIX_MCA_mca_base_component_path=$lib/pmix2/lib/pmix
fi
EOF
  } >"$1/bundle.env"
}

fetch_into_cache() {
  mkdir -p "$cache_root"
  local tmp empty closure=() pkgs=() p got
  tmp=$(mktemp -d "$cache_root/.partial.XXXXXX")
  empty=$(mktemp)
  # shellcheck disable=SC2064  # expand now: the trap outlives the locals
  trap "rm -rf '$tmp' '$empty'" EXIT
  # apt needs its package lists (a fresh machine has none); only on a cache miss.
  if [ "$(id -u)" = 0 ] && ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
    apt-get update -qq
  fi
  # The closure as apt resolves it on a machine with nothing installed (an empty dpkg status).
  mapfile -t closure < <(apt-get -s -o Dir::State::status="$empty" --no-install-recommends install "${wanted[@]}" 2>/dev/null |
                          awk '/^Inst /{print $2}')
  if [ ${#closure[@]} -eq 0 ]; then
    echo "fetch_debs: apt-get resolved no packages (run 'apt-get update' first?)" >&2
    exit 1
  fi
  for p in "${closure[@]}"; do
    [[ $p =~ $skip_re ]] || pkgs+=("$p")
  done
  if ! (cd "$tmp" && apt-get download -q "${pkgs[@]}" >download.log 2>&1); then
    # Lists older than the mirror (a version gone from it): update them once and retry.
    if [ "$(id -u)" = 0 ] && apt-get update -qq && (cd "$tmp" && apt-get download -q "${pkgs[@]}" >download.log 2>&1); then
      :
    else
      cat "$tmp/download.log" >&2
      exit 1
    fi
  fi
  rm -f "$tmp/download.log"
  # Plain names (<package>.deb): the versions carry '%', '+' and '~'.
  for f in "$tmp"/*_*.deb; do
    mv -f "$f" "$tmp/$(dpkg-deb -f "$f" Package).deb"
  done
  got=$(find "$tmp" -maxdepth 1 -name '*.deb' | wc -l)
  if [ "$got" -ne "${#pkgs[@]}" ]; then
    echo "fetch_debs: expected ${#pkgs[@]} packages, got $got" >&2
    exit 1
  fi
  printf '%s\n' "${pkgs[@]}" >"$tmp/PACKAGES"
  write_env "$tmp"
  # Complete, then in place at once (a concurrent run that finished first wins).
  mv -T "$tmp" "$cache" 2>/dev/null || rm -rf "$tmp"
  rm -f "$empty"
  trap - EXIT
}

if [ -f "$cache/PACKAGES" ] && [ -f "$cache/bundle.env" ]; then
  echo "fetch_debs: cached: $cache"
else
  fetch_into_cache
  echo "fetch_debs: fetched into $cache"
fi

if [ "$mode" = fetch ]; then
  mkdir -p "$dest"
  rm -f "$dest"/*.deb "$dest/PACKAGES" "$dest/bundle.env"
  cp -l "$cache"/*.deb "$dest"/ 2>/dev/null || cp "$cache"/*.deb "$dest"/
  cp "$cache/PACKAGES" "$cache/bundle.env" "$dest"/
  got=$(find "$dest" -maxdepth 1 -name '*.deb' | wc -l)
  echo "fetch_debs: $got packages, $(du -shL "$dest" | cut -f1) in $dest (carry it: .cache/gpu-debs)"
  exit 0
fi

# ------------------------------------------------------------------ --configure-only
t0=$(date +%s)
work=$(mktemp -d /tmp/leantrain-bundle-check.XXXXXX)
pfx=$work/prefix
ok=0
# shellcheck disable=SC2064
trap "[ \$ok = 1 ] && rm -rf '$work'" EXIT
echo "fetch_debs: checking the bundle in $work (kept if the check fails)"

# 1. Configure through run.sh, as on the GPU machine, with every package unpacked (a bare
#    machine) and LEANTRAIN_GPU_ISOLATE=1: the prefix's cmake and ninja, and /usr and /
#    hidden from CMake's searches. LEANTRAIN_BUILD_LOCK=<file>: CMake runs under flock on it
#    (a machine whose builds share one).
runner=(bash "$top/tests/gpu/run.sh" --configure-only)
[ -n "${LEANTRAIN_BUILD_LOCK:-}" ] && runner=(flock "$LEANTRAIN_BUILD_LOCK" "${runner[@]}")
if ! env LEANTRAIN_GPU_UNPACK_ALL=1 LEANTRAIN_GPU_ISOLATE=1 LEANTRAIN_GPU_DEBS="$cache" LEANTRAIN_GPU_PREFIX="$pfx" \
     LEANTRAIN_GPU_BUILD="$work/build" OUT="$work/out" "${runner[@]}" >"$work/run.log" 2>&1; then
  cat "$work/run.log"
  echo "--- configure.log (tail)"
  tail -30 "$work/out/configure.log" 2>/dev/null
  echo "fetch_debs: FAIL: run.sh --configure-only against the bundle failed (logs in $work)"
  exit 1
fi

# 2. Where each dependency was found: every one inside the prefix.
cache_file=$work/build/CMakeCache.txt
checks=(
  "cmake:CMAKE_COMMAND" "ninja:CMAKE_MAKE_PROGRAM"
  "jpeg:JPEG_LIBRARY_RELEASE" "jpeg:JPEG_INCLUDE_DIR" "png:PNG_LIBRARY_RELEASE" "png:PNG_PNG_INCLUDE_DIR"
  "zlib:ZLIB_LIBRARY_RELEASE" "zlib:ZLIB_INCLUDE_DIR"
  "mpi:MPI_C_COMPILER" "mpi:MPI_mpi_LIBRARY" "mpi:MPI_C_HEADER_DIR" "mpi:MPIEXEC_EXECUTABLE"
  "hdf5:HDF5_C_COMPILER_EXECUTABLE" "hdf5:HDF5_C_LIBRARY_hdf5"
  "gtest:GTest_DIR" "spdlog:spdlog_DIR" "fmt:fmt_DIR" "cli11:CLI11_DIR" "json:nlohmann_json_DIR"
  "pkg-config:PKG_CONFIG_EXECUTABLE" "toml++:pkgcfg_lib_TOMLPP_tomlplusplus"
)
bad=0
echo "where each dependency was found (bundle prefix: $pfx):"
for c in "${checks[@]}"; do
  what=${c%%:*} var=${c#*:}
  val=$(grep -m1 -E "^$var(:[A-Z]+)?=" "$cache_file" | cut -d= -f2- || true)
  if [ -z "$val" ]; then
    verdict="MISSING"; bad=1
  else
    verdict="bundle"
    # Every path in the value (a list for some) must lie in the prefix.
    IFS=';' read -r -a parts <<<"$val"
    for v in "${parts[@]}"; do
      case "$v" in "$pfx"/*) ;; *) verdict="NOT FROM THE BUNDLE"; bad=1 ;; esac
    done
  fi
  printf '  %-10s %-32s %s  [%s]\n' "$what" "$var" "${val:-?}" "$verdict"
done
# What the build would use: the HDF5 headers (FindHDF5 keeps them in no cache entry), and
# no header or library folder of the machine's /usr on any compile or link line (but the C
# runtime's libpthread/libdl/libm/librt).
ninja_file=$work/build/build.ninja
hdf5_inc=$(grep -o -E -- '(-isystem |-I)[^ ]*/include/hdf5/serial' "$ninja_file" | sed -E 's/^(-isystem |-I)//' | sort -u | paste -sd';')
case "$hdf5_inc" in
  "$pfx"/*) verdict=bundle ;;
  "") verdict=MISSING; bad=1 ;;
  *) verdict="NOT FROM THE BUNDLE"; bad=1 ;;
esac
[[ $hdf5_inc == *";"* ]] && { verdict="NOT FROM THE BUNDLE (several)"; bad=1; }
printf '  %-10s %-32s %s  [%s]\n' hdf5 "headers (build.ninja)" "${hdf5_inc:-?}" "$verdict"
leaks=$(grep -o -E "(^| |-I|-isystem |-L|-Wl,-rpath,)/usr/(include|lib/$multiarch|local/include|local/lib)[^ ]*" "$ninja_file" |
        sed -E 's/^ //' | grep -v -E "/lib(pthread|dl|m|rt|c)\.(a|so)$" | sort -u || true)
# The CUDA toolkit is the machine's on every machine here (/usr/local/cuda, and on some the
# links /usr/local/lib/libcudart.so -> /usr/local/cuda-13.0/...): a path that resolves into
# it is not a leak, whatever folder names it.
cuda_ok=""
if [ -n "$leaks" ]; then
  kept=""
  while IFS= read -r l; do
    target=$(readlink -f "$(sed -E 's/^(-I|-isystem |-L|-Wl,-rpath,)//' <<<"$l")" 2>/dev/null || true)
    case "$target" in
      /usr/local/cuda*/*|/usr/local/cuda*) cuda_ok="$cuda_ok $l" ;;
      *) kept="$kept$l"$'\n' ;;
    esac
  done <<<"$leaks"
  leaks=$(sed '/^$/d' <<<"$kept")
fi
[ -n "$cuda_ok" ] && echo "  the machine's CUDA toolkit (allowed):$cuda_ok"
if [ -n "$leaks" ]; then
  echo "  /usr on the build's compile or link lines (build.ninja): NOT FROM THE BUNDLE:"
  while IFS= read -r l; do echo "    $l"; done <<<"$leaks"
  bad=1
else
  echo "  build.ninja: no header or library folder under /usr on any compile or link line"
fi
if [ "$bad" = 1 ]; then
  echo "fetch_debs: FAIL: a dependency was missing or found outside the bundle (logs in $work)"
  exit 1
fi

# 3. A singleton MPI_Init from the prefix alone: the machine's Open MPI and PMIx folders are
#    hidden (a mount namespace) where that is allowed, as on a machine without them.
(
  # shellcheck disable=SC1091
  . "$cache/bundle.env"
  printf '#include <mpi.h>\n#include <stdio.h>\nint main(int c, char** v) { int r, n; MPI_Init(&c, &v);\n MPI_Comm_rank(MPI_COMM_WORLD, &r); MPI_Comm_size(MPI_COMM_WORLD, &n);\n printf("singleton MPI_Init: rank %%d of %%d\\n", r, n); MPI_Finalize(); return 0; }\n' >"$work/hello.c"
  "$pfx/usr/bin/mpicc.openmpi" "$work/hello.c" -o "$work/hello_mpi"
) >"$work/mpi.log" 2>&1 || { cat "$work/mpi.log"; echo "fetch_debs: FAIL: the bundle's mpicc could not build a program"; exit 1; }
hide=""
for d in "/usr/lib/$multiarch/openmpi" "/usr/lib/$multiarch/pmix2" /usr/share/openmpi /usr/share/pmix; do
  [ -d "$d" ] && hide+="mount --bind $work/empty $d && "
done
mkdir -p "$work/empty"
single=(bash -c "pfx='$pfx' && source '$cache/bundle.env' && exec '$work/hello_mpi'")
isolated="the machine's Open MPI/PMIx still visible"
if [ -n "$hide" ] && [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
  single=(unshare -m bash -c "${hide}pfx='$pfx' && source '$cache/bundle.env' && exec '$work/hello_mpi'")
  isolated="the machine's Open MPI and PMIx folders hidden"
fi
# Without PMIx's relocation it may still start, but says its plugins are "unavailable"
# (help files under /usr/lib/<multiarch>/pmix2): any such complaint fails the check.
if out=$(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 "${single[@]}" 2>&1) &&
   grep -q 'rank 0 of 1' <<<"$out" && ! grep -qiE 'pmix|sorry|help file|error|unavailable|not found|cannot' <<<"$out"; then
  echo "  mpi        singleton start-up             ok ($isolated): $out"
else
  echo "$out"
  echo "fetch_debs: FAIL: a singleton MPI_Init from the bundle's prefix failed ($isolated)"
  exit 1
fi
ok=1
echo "fetch_debs: bundle configure check passed in $(( $(date +%s) - t0 )) s ($(wc -l <"$cache/PACKAGES") packages)"
