#!/usr/bin/env bash
# A local multi-host "cluster" on one machine: each host is a network namespace whose eth0
# is a veth end on a bridge that lives in a namespace of its own (nothing is added to the
# root namespace). Open MPI reaches the hosts over TCP through an rsh agent that enters the
# namespace of the address it is asked for. Root only.
#
#   eval "$(cluster/netns_hosts.sh up 2)"    # hosts $LT_NS_PREFIX-h1, -h2; prints the env
#   cluster/netns_hosts.sh mpirun 2 [mpirun options --] build/bin/leantrain train ...
#   cluster/netns_hosts.sh exec 2 CMD...      # run CMD inside host 2
#   cluster/netns_hosts.sh cut 2              # host 2's switch port goes dead (silently)
#   cluster/netns_hosts.sh cut 1 2            # only hosts 1 and 2 stop hearing each other
#   cluster/netns_hosts.sh heal 2 | heal 1 2  # undo a cut
#   cluster/netns_hosts.sh pids               # "NS PID COMM" of every process in the hosts
#   cluster/netns_hosts.sh down               # kill everything in the hosts, delete them
#   cluster/netns_hosts.sh sweep              # down for every cluster whose LT_NS_OWNER died
#
# Environment (up prints it; every other command reads it):
#   LT_NS_PREFIX  namespace name prefix; default for `up`: lt<pid><random> (unique, so
#                 parallel runs never collide). Namespaces: PREFIX-h1..hN, bridge PREFIX-sw.
#   LT_NS_SUBNET  first three octets of the private /24 (default 10.213.7); host K is
#                 SUBNET.(10+K). The subnet exists only inside these namespaces, so
#                 parallel clusters may reuse it.
#   LT_NS_OWNER   (up) a pid: once it is gone, `sweep` removes this cluster.
# `agent HOST CMD...` is the rsh agent (mpirun --mca plm_rsh_agent "netns_hosts.sh agent").
set -euo pipefail
self=$(readlink -f "${BASH_SOURCE[0]}")
here=$(dirname "$self")
state_dir=/run/leantrain-netns

die() { echo "netns_hosts: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" = 0 ] || die "must run as root (network namespaces)"; }

ensure_tools() {
  command -v ip >/dev/null && command -v nsenter >/dev/null && return 0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 util-linux >/dev/null
}

load_env() {
  [ -n "${LT_NS_PREFIX:-}" ] || die "LT_NS_PREFIX is not set (eval the output of 'up' first)"
  if [ -f "$state_dir/$LT_NS_PREFIX.env" ]; then
    # shellcheck disable=SC1090
    . "$state_dir/$LT_NS_PREFIX.env"
  fi
  LT_NS_SUBNET=${LT_NS_SUBNET:-10.213.7}
  LT_NS_HOSTS=${LT_NS_HOSTS:-0}
  export LT_NS_PREFIX LT_NS_SUBNET LT_NS_HOSTS   # the agent, started by mpirun, reads them
}

ns_of() { echo "$LT_NS_PREFIX-h$1"; }
addr_of() { echo "$LT_NS_SUBNET.$((10 + $1))"; }
sw_ns() { echo "$LT_NS_PREFIX-sw"; }
uts_of() { echo "$state_dir/$(ns_of "$1").uts"; }
# nsenter into host K: its network namespace and its UTS namespace (hostname PREFIX-hK).
enter() { local k=$1; shift; nsenter --net="/run/netns/$(ns_of "$k")" --uts="$(uts_of "$k")" "$@"; }
enter_exec() { local k=$1; shift; exec nsenter --net="/run/netns/$(ns_of "$k")" --uts="$(uts_of "$k")" "$@"; }

# Host index from "K", "hK", "PREFIX-hK" or an address SUBNET.(10+K).
host_index() {
  local h=$1
  case "$h" in
    "$LT_NS_SUBNET".*) h=$(( ${h##*.} - 10 )) ;;
    "$LT_NS_PREFIX"-h*) h=${h#"$LT_NS_PREFIX"-h} ;;
    h*) h=${h#h} ;;
  esac
  [[ "$h" =~ ^[0-9]+$ ]] && [ "$h" -ge 1 ] && [ "$h" -le "$LT_NS_HOSTS" ] ||
    die "unknown host '$1' (hosts 1..$LT_NS_HOSTS, addresses $(addr_of 1)..$(addr_of "$LT_NS_HOSTS"))"
  echo "$h"
}

cmd_up() {
  need_root; ensure_tools
  local n=${1:?usage: netns_hosts.sh up N}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "N must be 1..200"
  LT_NS_PREFIX=${LT_NS_PREFIX:-lt$$$(printf '%04x' $((RANDOM)))}
  LT_NS_SUBNET=${LT_NS_SUBNET:-10.213.7}
  LT_NS_HOSTS=$n
  [ ${#LT_NS_PREFIX} -le 40 ] || die "LT_NS_PREFIX too long"
  ip netns list | grep -q "^$LT_NS_PREFIX-" && die "namespaces $LT_NS_PREFIX-* already exist"
  mkdir -p "$state_dir"
  printf 'LT_NS_PREFIX=%s\nLT_NS_SUBNET=%s\nLT_NS_HOSTS=%s\nLT_NS_OWNER=%s\n' \
    "$LT_NS_PREFIX" "$LT_NS_SUBNET" "$n" "${LT_NS_OWNER:-}" >"$state_dir/$LT_NS_PREFIX.env"
  # A failure half-way removes what was made.
  up_ok=0
  trap '[ "$up_ok" = 1 ] || cmd_down >/dev/null 2>&1 || true' EXIT
  local sw; sw=$(sw_ns)
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  local k ns
  for ((k = 1; k <= n; k++)); do
    ns=$(ns_of "$k")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # Created inside the host, the peer end placed straight into the switch namespace.
    ip -n "$ns" link add eth0 type veth peer name "p$k" netns "$sw"
    ip -n "$sw" link set "p$k" master br0
    ip -n "$sw" link set "p$k" up
    ip -n "$ns" addr add "$(addr_of "$k")/24" dev eth0
    ip -n "$ns" link set eth0 up
    # Its own hostname too, so logs and Open MPI tell the hosts apart.
    touch "$(uts_of "$k")"
    unshare --uts="$(uts_of "$k")" hostname "$ns"
  done
  # Every host reaches every other at once (a bridge without STP forwards immediately);
  # check host 1 -> host K with bash's /dev/tcp to a closed port: "refused" means reached.
  for ((k = 2; k <= n; k++)); do
    local tries=0
    until [[ "$(enter 1 timeout 2 bash -c \
        "exec 3<>/dev/tcp/$(addr_of "$k")/9" 2>&1)" == *refused* ]]; do
      tries=$((tries + 1)); [ $tries -lt 10 ] || die "host $k does not answer"
    done
  done
  up_ok=1
  printf 'export LT_NS_PREFIX=%s LT_NS_SUBNET=%s LT_NS_HOSTS=%s\n' "$LT_NS_PREFIX" "$LT_NS_SUBNET" "$n"
}

# Every process inside the prefix's namespaces: "NS PID COMM".
cmd_pids() {
  load_env
  local ns p
  for ns in $(ip netns list | awk '{print $1}' | grep "^$LT_NS_PREFIX-" || true); do
    for p in $(ip netns pids "$ns" 2>/dev/null); do
      echo "$ns $p $(cat "/proc/$p/comm" 2>/dev/null || echo '?')"
    done
  done
}

cmd_down() {
  need_root; load_env
  local ns p round
  local nss; nss=$(ip netns list | awk '{print $1}' | grep "^$LT_NS_PREFIX-" || true)
  for _ in 1 2 3 4 5; do
    local any=
    for ns in $nss; do
      for p in $(ip netns pids "$ns" 2>/dev/null); do any=1; kill -9 "$p" 2>/dev/null || true; done
    done
    [ -z "$any" ] && break
    sleep 0.2
  done
  for ns in $nss; do
    ip netns del "$ns" 2>/dev/null || true
    if [ -e "$state_dir/$ns.uts" ]; then
      umount "$state_dir/$ns.uts" 2>/dev/null || true
      rm -f "$state_dir/$ns.uts"
    fi
  done
  rm -f "$state_dir/$LT_NS_PREFIX.env"
}

# Removes every cluster whose owner process (LT_NS_OWNER at `up`) is gone: what a test
# killed without a chance to clean up (e.g. by a ctest timeout) left behind.
cmd_sweep() {
  need_root
  local f
  for f in "$state_dir"/*.env; do
    [ -f "$f" ] || continue
    (
      unset LT_NS_OWNER LT_SLURM_DIR
      # shellcheck disable=SC1090
      . "$f"
      [ -n "${LT_NS_OWNER:-}" ] && ! kill -0 "$LT_NS_OWNER" 2>/dev/null || exit 0
      echo "netns_hosts: sweeping $LT_NS_PREFIX (owner $LT_NS_OWNER is gone)" >&2
      cmd_down
      case "${LT_SLURM_DIR:-}" in */lt-slurm.*) rm -rf "$LT_SLURM_DIR" ;; esac
    )
  done
}

# rsh agent for Open MPI: agent [options] HOST COMMAND... ; runs COMMAND in HOST's namespace.
cmd_agent() {
  load_env
  while [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done
  local k; k=$(host_index "${1:?agent: no host}"); shift
  enter_exec "$k" sh -c "$*"
}

cmd_exec() {
  need_root; load_env
  local k; k=$(host_index "${1:?usage: exec HOST CMD...}"); shift
  enter_exec "$k" "$@"
}

# mpirun NP [mpirun options --] COMMAND...: mpirun inside host 1, ranks in blocks of
# ceil(NP/N) per host (NP=2 on 2 hosts: rank 0 on host 1, rank 1 on host 2), over TCP.
cmd_mpirun() {
  need_root; load_env
  local np=${1:?usage: mpirun NP [mpirun options --] COMMAND...}; shift
  local n=$LT_NS_HOSTS per hosts="" k
  per=$(( (np + n - 1) / n ))
  for ((k = 1; k <= n; k++)); do hosts+="${hosts:+,}$(addr_of "$k"):$per"; done
  local extra=()
  if [[ " $* " == *" -- "* ]]; then
    while [ "$1" != "--" ]; do extra+=("$1"); shift; done
    shift
  fi
  # cluster/mpirun.sh adds: root, oversubscription (ranks > cores of this machine, which all
  # the namespace hosts share), the out-of-band TCP keepalive and the MALLOC_* env.
  enter_exec 1 "$here/mpirun.sh" "$np" \
    -H "$hosts" --mca plm_rsh_agent "$self agent" \
    --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
    "${extra[@]}" -- "$@"
}

dead_mac=02:00:00:de:ad:00
cmd_cut() {
  need_root; load_env
  local a b
  a=$(host_index "${1:?usage: cut HOST | cut A B}")
  if [ $# -ge 2 ]; then
    # Only A <-> B: each sends the other's frames to a MAC nobody owns (the bridge floods
    # them, every host drops them). No error reaches either socket: a silent cut.
    b=$(host_index "$2")
    ip -n "$(ns_of "$a")" neigh replace "$(addr_of "$b")" lladdr $dead_mac dev eth0 nud permanent
    ip -n "$(ns_of "$b")" neigh replace "$(addr_of "$a")" lladdr $dead_mac dev eth0 nud permanent
  else
    # The host's switch port leaves the bridge: its frames go nowhere, its carrier stays up
    # (like a dead switch port or a pulled cable further along), so only TCP timeouts and
    # keepalives can notice.
    ip -n "$(sw_ns)" link set "p$a" nomaster
  fi
}

cmd_heal() {
  need_root; load_env
  local a b
  a=$(host_index "${1:?usage: heal HOST | heal A B}")
  if [ $# -ge 2 ]; then
    b=$(host_index "$2")
    ip -n "$(ns_of "$a")" neigh del "$(addr_of "$b")" dev eth0 || true
    ip -n "$(ns_of "$b")" neigh del "$(addr_of "$a")" dev eth0 || true
  else
    ip -n "$(sw_ns)" link set "p$a" master br0
  fi
}

sub=${1:-}
[ $# -gt 0 ] && shift
case "$sub" in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  agent) cmd_agent "$@" ;;
  exec) cmd_exec "$@" ;;
  mpirun) cmd_mpirun "$@" ;;
  cut) cmd_cut "$@" ;;
  heal) cmd_heal "$@" ;;
  pids) cmd_pids ;;
  sweep) cmd_sweep ;;
  *) sed -n '2,/^set -euo/p' "$self" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
