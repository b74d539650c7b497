#!/usr/bin/env bash
# Starts leantrain under Open MPI with what users forget:
#   - root: --allow-run-as-root;
#   - more ranks than cores: --oversubscribe and mpi_yield_when_idle (spinning ranks
#     otherwise starve each other: 87 ms vs 3.5 ms per collective on 2 cores);
#   - TCP keepalive on the runtime's out-of-band channel, so a dead link ends the job in
#     seconds instead of ~8 minutes;
#   - glibc keeps freed memory (fresh pages fault in slowly on VMs), forwarded to ranks.
# Usage: cluster/mpirun.sh NP [mpirun options --] leantrain train --config ...
set -euo pipefail
np=${1:?usage: cluster/mpirun.sh NP [mpirun options --] COMMAND...}
shift
extra=()
if [[ " $* " == *" -- "* ]]; then
  while [ "$1" != "--" ]; do extra+=("$1"); shift; done
  shift
fi
opts=(-np "$np" --mca oob_tcp_keepalive_time 3 --mca oob_tcp_keepalive_intvl 1
      --mca oob_tcp_keepalive_probes 2
      -x MALLOC_MMAP_THRESHOLD_=4294967295 -x MALLOC_TRIM_THRESHOLD_=4294967295)
[ "$(id -u)" = 0 ] && opts+=(--allow-run-as-root)
if [ "$np" -gt "$(nproc)" ]; then
  opts+=(--oversubscribe --mca mpi_yield_when_idle 1)
fi
exec mpirun "${opts[@]}" "${extra[@]}" "$@"
