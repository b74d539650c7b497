#!/usr/bin/env bash
# A local Slurm cluster on the network-namespace hosts of cluster/netns_hosts.sh: slurmctld
# on host 1 (which is also the "login node" and compute node node1), one slurmd per host
# (nodeK on host K), AuthType=auth/none and CredType=cred/none, config, state, spool and
# logs under one temp dir. Debian 12's Slurm 22.05 (installed here when missing). Root only.
#
#   eval "$(cluster/slurm_local.sh up 2)"     # prints the env (also in $LT_SLURM_DIR/env)
#   cluster/slurm_local.sh run sinfo          # any Slurm client command, run on host 1
#   cluster/slurm_local.sh run srun -N2 -n2 --mpi=pmix -K1 build/bin/leantrain train ...
#   cluster/slurm_local.sh run sbatch --wait -N2 job.sh
#   cluster/slurm_local.sh down               # stop the daemons, hosts and the temp dir
#
# Environment: LT_NS_PREFIX / LT_NS_SUBNET as for netns_hosts.sh (the hosts), LT_SLURM_GPUS
# (up: N pretend GPUs per node, gres/gpu on /dev/null-like devices; default 0), LT_SLURM_DIR
# (created by up: slurm.conf, state/, nodeK/{spool,tmp,slurmd.log}, slurmctld.log, env),
# SLURM_CONF=$LT_SLURM_DIR/slurm.conf.
set -euo pipefail
self=$(readlink -f "${BASH_SOURCE[0]}")
here=$(dirname "$self")
hosts=$here/netns_hosts.sh
debs=(slurmctld slurmd slurm-client)

die() { echo "slurm_local: $*" >&2; exit 1; }

ensure_slurm() {
  local missing=() p
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "slurm_local: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
}

load_env() {
  [ -n "${LT_SLURM_DIR:-}" ] && [ -f "$LT_SLURM_DIR/env" ] ||
    die "LT_SLURM_DIR is not set or has no env file (eval the output of 'up' first)"
  # shellcheck disable=SC1091
  . "$LT_SLURM_DIR/env"
}

# Runs a command on host 1 (the login node) with SLURM_CONF set.
on_login() { "$hosts" exec 1 env SLURM_CONF="$SLURM_CONF" "$@"; }

cmd_up() {
  [ "$(id -u)" = 0 ] || die "must run as root"
  local n=${1:?usage: slurm_local.sh up N}
  ensure_slurm
  local dir; dir=$(mktemp -d "${TMPDIR:-/tmp}/lt-slurm.XXXXXX")
  chmod 755 "$dir"
  export LT_SLURM_DIR=$dir SLURM_CONF=$dir/slurm.conf
  up_ok=0
  trap '[ "$up_ok" = 1 ] || cmd_down >/dev/null 2>&1 || true' EXIT
  # The hosts; their env (prefix, subnet) goes into ours.
  eval "$("$hosts" up "$n")"
  # netns_hosts.sh sweep removes this dir too when the owner is gone.
  echo "LT_SLURM_DIR=$dir" >>"/run/leantrain-netns/$LT_NS_PREFIX.env"
  printf 'export LT_NS_PREFIX=%s LT_NS_SUBNET=%s LT_NS_HOSTS=%s LT_SLURM_DIR=%s SLURM_CONF=%s\n' \
    "$LT_NS_PREFIX" "$LT_NS_SUBNET" "$LT_NS_HOSTS" "$dir" "$SLURM_CONF" >"$dir/env"
  local cpus; cpus=$(nproc)
  local gpus=${LT_SLURM_GPUS:-0}
  local mem; mem=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)
  local k
  mkdir -p "$dir/state"
  for ((k = 1; k <= n; k++)); do mkdir -p "$dir/node$k/spool" "$dir/node$k/tmp"; done
  {
    echo "# Written by cluster/slurm_local.sh: a throw-away cluster on network namespaces."
    echo "ClusterName=lt$(echo "$LT_NS_PREFIX" | tr -cd 'a-z0-9' | tail -c 30)"
    echo "SlurmctldHost=$LT_NS_PREFIX-h1($LT_NS_SUBNET.11)"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/none"
    echo "CredType=cred/none"
    # A requeued job may start again after cred_expire seconds (default 120).
    echo "AuthInfo=cred_expire=${LT_SLURM_CRED_EXPIRE:-5}"
    echo "StateSaveLocation=$dir/state"
    echo "SlurmctldPidFile=$dir/slurmctld.pid"
    echo "SlurmctldLogFile=$dir/slurmctld.log"
    echo "SlurmdSpoolDir=$dir/%n/spool"
    echo "SlurmdPidFile=$dir/%n/slurmd.pid"
    echo "SlurmdLogFile=$dir/%n/slurmd.log"
    echo "TmpFS=$dir/%n/tmp"
    # No cgroups: processes tracked through /proc, no task binding, no accounting.
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "SchedulerType=sched/builtin"
    # Schedule every second (default 60 s: a requeued job would wait for the next pass).
    echo "SchedulerParameters=sched_interval=1"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "SlurmdParameters=config_overrides"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=30"
    echo "KillWait=5"
    echo "InactiveLimit=0"
    echo "MinJobAge=30"
    local gres=""
    if [ "$gpus" -gt 0 ]; then echo "GresTypes=gpu"; gres=" Gres=gpu:$gpus"; fi
    for ((k = 1; k <= n; k++)); do
      echo "NodeName=node$k NodeAddr=$LT_NS_SUBNET.$((10 + k)) NodeHostname=$LT_NS_PREFIX-h$k CPUs=$cpus RealMemory=$mem State=UNKNOWN$gres"
    done
    echo "PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
  } >"$SLURM_CONF"
  if [ "$gpus" -gt 0 ]; then
    # Pretend GPUs: character devices (copies of /dev/null) that Slurm hands out as gres/gpu,
    # so GPU binding (CUDA_VISIBLE_DEVICES per task) can be checked on a machine without one.
    for ((k = 1; k <= n; k++)); do
      local g
      for ((g = 0; g < gpus; g++)); do mknod "$dir/node$k/gpu$g" c 1 3; done
      echo "NodeName=node$k Name=gpu File=$dir/node$k/gpu[0-$((gpus - 1))]"
    done >"$dir/gres.conf"
  fi
  # nsenter (not `ip netns exec`, which remounts /sys and hides /sys/fs/cgroup).
  on_login slurmctld
  for ((k = 1; k <= n; k++)); do
    "$hosts" exec "$k" env SLURM_CONF="$SLURM_CONF" slurmd -N "node$k"
  done
  # Ready when every node is idle.
  local tries=0 idle
  while :; do
    idle=$(on_login sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$' || true)
    [ "$idle" -ge "$n" ] && break
    tries=$((tries + 1))
    [ $tries -lt 150 ] || { tail -5 "$dir/slurmctld.log" >&2; die "nodes not idle after 30 s"; }
    sleep 0.2
  done
  up_ok=1
  echo "# env file: $dir/env"
  cat "$dir/env"
}

cmd_down() {
  load_env
  local f p
  # Daemons first, politely (slurmd kills its job steps), then whatever is left in the hosts.
  if [ -f "$SLURM_CONF" ]; then
    on_login scancel --quiet --full --state=RUNNING --partition=local 2>/dev/null || true
  fi
  for f in "$LT_SLURM_DIR"/node*/slurmd.pid "$LT_SLURM_DIR/slurmctld.pid"; do
    [ -f "$f" ] || continue
    p=$(cat "$f" 2>/dev/null || true)
    [ -n "$p" ] && kill -TERM "$p" 2>/dev/null || true
  done

  for _ in $(seq 20); do
    local alive=
    for f in "$LT_SLURM_DIR"/node*/slurmd.pid "$LT_SLURM_DIR/slurmctld.pid"; do
      [ -f "$f" ] || continue
      p=$(cat "$f" 2>/dev/null || true)
      [ -n "$p" ] && [ -d "/proc/$p" ] && alive=1
    done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  "$hosts" down
  case "$LT_SLURM_DIR" in
    */lt-slurm.*) rm -rf "$LT_SLURM_DIR" ;;
  esac
}

cmd_run() {
  load_env
  exec "$hosts" exec 1 env SLURM_CONF="$SLURM_CONF" "$@"
}

sub=${1:-}
[ $# -gt 0 ] && shift
case "$sub" in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  run) cmd_run "$@" ;;
  *) sed -n '2,/^set -euo/p' "$self" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
