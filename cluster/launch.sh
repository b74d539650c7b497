#!/usr/bin/env bash
# Starts a leantrain job on a real cluster with the settings users forget, under Slurm
# (inside an allocation: sbatch/salloc) or with plain Open MPI over hosts.
#
#   cluster/launch.sh [-n NP] [-H HOST[:SLOTS],... | --hostfile FILE] [--dry-run]
#                     [LAUNCHER OPTIONS --] leantrain train --config ...
#
# Under Slurm (SLURM_JOB_ID set; LT_LAUNCHER=mpirun forces mpirun):
#   srun -K1 (a rank that dies ends the step instead of leaving the others hanging),
#   --mpi=pmix (else pmi2, else Open MPI's mpirun inside the allocation); GPUs: every rank
#   of a node must see the node's allocated GPUs in the same order, as leantrain takes the
#   k-th visible GPU for local rank k (SLURM_LOCALID): an allocation made with
#   --gpus-per-task (where Slurm shows each rank only its own GPU) gets a step with
#   --gpus-per-node = ranks per node x gpus per task instead;
#   train.threads = --cpus-per-task for `leantrain train`, mpi_yield_when_idle when a node
#   has more ranks than CPUs, the glibc MALLOC_* settings. NP defaults to the allocation's.
# Otherwise: cluster/mpirun.sh (root, oversubscription, --bind-to none, out-of-band TCP
#   keepalive, MALLOC_*) with -H/--hostfile; LT_RANKS_PER_HOST = ceil(NP / hosts); GPU
#   ranks: local rank = GPU index (CUDA_DEVICE_ORDER=PCI_BUS_ID so that index is
#   nvidia-smi's), and more ranks per host than GPUs is refused (leantrain would put the
#   extra ranks on the CPU) unless the command says train.device=cpu.
# --dry-run prints the command instead of running it.
set -euo pipefail
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "launch: $*" >&2; exit 2; }

np="" hosts="" hostfile="" dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    -n|-np) np=${2:?}; shift 2 ;;
    -H|--host) hosts=${2:?}; shift 2 ;;
    --hostfile) hostfile=${2:?}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || usage
extra=()
if [[ " $* " == *" -- "* ]]; then
  while [ "$1" != "--" ]; do extra+=("$1"); shift; done
  shift
fi
cmd=("$@")
[ -n "$np" ] && { [[ "$np" =~ ^[1-9][0-9]*$ ]] || die "-n wants a positive integer, got '$np'"; }

run() {
  if [ "$dry" = 1 ]; then
    local env_shown
    env_shown=$(env | grep -E '^(OMPI_MCA_|MALLOC_|CUDA_DEVICE_ORDER|LT_RANKS_PER_HOST)' | sort | tr '\n' ' ')
    echo "${env_shown}$(printf '%q ' "$@")"
    exit 0
  fi
  exec "$@"
}

export MALLOC_MMAP_THRESHOLD_=4294967295 MALLOC_TRIM_THRESHOLD_=4294967295
export CUDA_DEVICE_ORDER=${CUDA_DEVICE_ORDER:-PCI_BUS_ID}

is_train=0
if [ ${#cmd[@]} -ge 2 ] && [[ "$(basename "${cmd[0]}")" == leantrain* ]] && [ "${cmd[1]}" = train ]; then
  is_train=1
fi
has_set() { [[ " ${cmd[*]} " == *" $1"* || " ${cmd[*]} " == *"=$1"* ]]; }

gpus_here() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
  else
    echo 0
  fi
}

# First number of a Slurm per-node list such as "4(x2),3" -> 4.
first_count() { local v=${1%%[(,]*}; echo "${v:-1}"; }

launcher=${LT_LAUNCHER:-}
if [ -z "$launcher" ]; then
  if [ -n "${SLURM_JOB_ID:-}" ] && command -v srun >/dev/null 2>&1; then launcher=srun; else launcher=mpirun; fi
fi

if [ "$launcher" = srun ]; then
  [ -n "$hosts$hostfile" ] && die "-H/--hostfile make no sense inside a Slurm allocation"
  mpi=""
  mpis=$(srun --mpi=list 2>&1 || true)
  if grep -qw pmix <<<"$mpis"; then mpi=pmix
  elif grep -qw pmi2 <<<"$mpis"; then mpi=pmi2
  fi
  # Ranks per node vs CPUs per node: yield instead of spinning when oversubscribed.
  per_node=$(first_count "${SLURM_NTASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-1}}")
  if [ -n "$np" ] && [ -n "${SLURM_JOB_NUM_NODES:-}" ]; then
    per_node=$(( (np + SLURM_JOB_NUM_NODES - 1) / SLURM_JOB_NUM_NODES ))
  fi
  cpus_node=$(first_count "${SLURM_CPUS_ON_NODE:-${SLURM_JOB_CPUS_PER_NODE:-$(nproc)}}")
  cpt=${SLURM_CPUS_PER_TASK:-1}
  if [ $((per_node * cpt)) -gt "$cpus_node" ]; then export OMPI_MCA_mpi_yield_when_idle=1; fi
  if [ "$is_train" = 1 ] && [ -n "${SLURM_CPUS_PER_TASK:-}" ] && ! has_set train.threads=; then
    cmd+=(--set "train.threads=$SLURM_CPUS_PER_TASK")
  fi
  opts=(-K1)
  [ -n "$np" ] && opts+=(-n "$np")
  srun_cmd=(srun)
  if [ -n "${SLURM_GPUS_PER_TASK:-}" ]; then
    # srun reads SLURM_GPUS_PER_TASK from the environment: drop it for this step.
    srun_cmd=(env -u SLURM_GPUS_PER_TASK srun --ntasks-per-node="$per_node"
              --gpus-per-node=$((per_node * SLURM_GPUS_PER_TASK)))
  fi
  if [ -n "$mpi" ]; then
    run "${srun_cmd[@]}" "${opts[@]}" --mpi="$mpi" "${extra[@]}" "${cmd[@]}"
  fi
  # No PMI plugin: Open MPI's mpirun starts its daemons through srun itself.
  np=${np:-${SLURM_NTASKS:-1}}
  export LT_RANKS_PER_HOST=$per_node
  run "$here/mpirun.sh" "$np" "${extra[@]}" -- "${cmd[@]}"
fi

# Plain Open MPI over hosts.
nhosts=1
hostopt=()
if [ -n "$hosts" ]; then
  IFS=, read -r -a hl <<<"$hosts"; nhosts=${#hl[@]}
elif [ -n "$hostfile" ]; then
  [ -r "$hostfile" ] || die "cannot read hostfile '$hostfile'"
  nhosts=$(grep -cvE '^\s*(#|$)' "$hostfile"); hostopt=(--hostfile "$hostfile")
fi
gpus=$(gpus_here)
if [ -z "$np" ]; then
  if [ "$gpus" -gt 0 ]; then np=$((gpus * nhosts)); else np=$nhosts; fi
fi
per_host=$(( (np + nhosts - 1) / nhosts ))
export LT_RANKS_PER_HOST=$per_host
if [ -n "$hosts" ]; then
  # A host without ":SLOTS" gets ceil(NP / hosts) slots (Open MPI's default is 1 for -H).
  hl2=()
  for h in "${hl[@]}"; do [[ "$h" == *:* ]] && hl2+=("$h") || hl2+=("$h:$per_host"); done
  hostopt=(-H "$(IFS=,; echo "${hl2[*]}")")
fi
if [ "$gpus" -gt 0 ] && [ "$per_host" -gt "$gpus" ] && ! has_set train.device=cpu; then
  die "$per_host ranks per host but $gpus GPUs here: leantrain gives each local rank the GPU of its index, so extra ranks would run on the CPU (start at most $gpus per host, or --set train.device=cpu)"
fi
run "$here/mpirun.sh" "$np" "${hostopt[@]}" -x CUDA_DEVICE_ORDER "${extra[@]}" -- "${cmd[@]}"
