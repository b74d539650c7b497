#!/usr/bin/env bash
# Starts leantrain under Open MPI with what users forget:
#   - root: --allow-run-as-root;
#   - more ranks per host than cores: --oversubscribe and mpi_yield_when_idle (spinning
#     ranks otherwise starve each other: 87 ms vs 3.5 ms per collective on 2 cores);
#   - --bind-to none unless the caller binds or maps: Open MPI binds each rank to ONE core
#     when np <= 2, and leantrain runs cores/ranks intra-op threads per rank (a 64-core host
#     with 2 ranks would run 32 threads on one core);
#   - TCP keepalive on the runtime's out-of-band channel (oob_tcp_keepalive_*: first probe
#     after 3 s idle, then every 1 s, 2 missed = dead), so a dead link ends the job in
#     seconds instead of ~8 minutes (Open MPI 4.1 has no keepalive for the tcp BTL itself);
#   - glibc keeps freed memory (fresh pages fault in slowly on VMs), forwarded to ranks.
# Usage: cluster/mpirun.sh NP [mpirun options --] leantrain train --config ...
# LT_RANKS_PER_HOST (default NP: one host) decides oversubscription on multi-host runs.
# Settings the caller gives (options before --, or OMPI_MCA_* in the environment) win.
set -euo pipefail
np=${1:?usage: cluster/mpirun.sh NP [mpirun options --] COMMAND...}
shift
extra=()
if [[ " $* " == *" -- "* ]]; then
  while [ "$1" != "--" ]; do extra+=("$1"); shift; done
  shift
fi
per_host=${LT_RANKS_PER_HOST:-$np}
opts=(-np "$np")
# An MCA setting is added only when the caller set it neither on the command line (mpirun
# refuses a parameter given twice) nor as OMPI_MCA_<name> in the environment.
add_mca() {
  local v="OMPI_MCA_$1"
  [[ " ${extra[*]:-} " == *" $1 "* || -n "${!v:-}" ]] || opts+=(--mca "$1" "$2")
}
add_mca oob_tcp_keepalive_time 3
add_mca oob_tcp_keepalive_intvl 1
add_mca oob_tcp_keepalive_probes 2
opts+=(-x MALLOC_MMAP_THRESHOLD_=4294967295 -x MALLOC_TRIM_THRESHOLD_=4294967295)
[ "$(id -u)" = 0 ] && opts+=(--allow-run-as-root)
if [ "$per_host" -gt "$(nproc)" ]; then
  [[ " ${extra[*]:-} " == *" --oversubscribe "* ]] || opts+=(--oversubscribe)
  add_mca mpi_yield_when_idle 1
fi
if [[ " ${extra[*]:-} " != *" --bind-to "* && " ${extra[*]:-} " != *" --map-by "* &&
      " ${extra[*]:-} " != *" -bind-to "* && " ${extra[*]:-} " != *" -map-by "* ]]; then
  opts+=(--bind-to none)
fi
exec mpirun "${opts[@]}" "${extra[@]}" "$@"
