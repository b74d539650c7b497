#!/usr/bin/env bash
# cluster_slurm_srun: a local Slurm cluster (slurmctld + one slurmd per namespace host,
# 2 pretend GPUs per node). The tiny run via `srun --mpi=pmix -K1` on 2 nodes x 1 task, via
# the CPU sbatch template and via cluster/launch.sh inside an allocation, each ends with the
# loss of 2 ranks on one host (1e-6 relative). The GPU template and launch.sh give every rank
# the node's GPUs in the same order (what leantrain's local rank -> GPU rule needs).
. "$(dirname "$0")/lib.sh"

t=$(date +%s.%N)
eval "$(LT_SLURM_GPUS=2 "$SLURM" up 2 | grep '^export')"
on_exit "'$SLURM' down"
say "Slurm up in $(elapsed "$t") s: $("$SLURM" run sinfo -h -o '%D nodes %T %N %G')"
mpis=$("$SLURM" run srun --mpi=list 2>&1)
grep -qw pmix <<<"$mpis" || fail "srun --mpi=list has no pmix: $mpis"

# Open MPI's TCP transport on the hosts' eth0 (direct launch: no mpirun, so no -mca).
export OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=eth0
t=$(date +%s.%N)
train_args "$WORK/srun" 16
timeout "$RUN_LIMIT" "$SLURM" run srun -N2 -n2 --ntasks-per-node=1 --mpi=pmix -K1 \
  sh -c 'echo "$(hostname) $SLURMD_NODENAME" >"$0.where.$SLURM_PROCID"; exec "$@"' "$WORK/srun" \
  "$BIN" "${TRAIN[@]}" >"$WORK/srun.log" 2>&1 || fail "srun failed (exit $?)"
loss_srun=$(final_loss "$WORK/srun")
say "srun 2 nodes x 1 task: loss $loss_srun in $(elapsed "$t") s; rank 0 on $(cat "$WORK/srun.where.0"), rank 1 on $(cat "$WORK/srun.where.1")"
[ "$(cat "$WORK/srun.where.0")" = "$LT_NS_PREFIX-h1 node1" ] && [ "$(cat "$WORK/srun.where.1")" = "$LT_NS_PREFIX-h2 node2" ] ||
  fail "ranks not on node1/host 1 and node2/host 2"

# The CPU template, as a user would submit it (its own srun -K1 --mpi=pmix inside).
t=$(date +%s.%N)
train_args "$WORK/sbatch" 16
job=$(LEANTRAIN=$BIN OUT=$WORK/sbatch "$SLURM" run sbatch --parsable -N2 --ntasks-per-node=1 \
  --cpus-per-task=1 -o "$WORK/sbatch.log" -D "$WORK" "$SRC/cluster/sbatch/cpu.sbatch" "${SETS[@]}")
on_exit "'$SLURM' run scancel $job"
wait_job "$job"
loss_sbatch=$(final_loss "$WORK/sbatch")
say "sbatch cluster/sbatch/cpu.sbatch (2 nodes x 1 task): loss $loss_sbatch in $(elapsed "$t") s"

# cluster/launch.sh inside an allocation (it picks srun -K1 --mpi=pmix by itself).
t=$(date +%s.%N)
train_args "$WORK/launch" 16
job=$("$SLURM" run sbatch --parsable -N2 --ntasks-per-node=1 --cpus-per-task=1 -o "$WORK/launch.log" \
  -D "$WORK" --wrap "$(printf '%q ' "$SRC/cluster/launch.sh" "$BIN" "${TRAIN[@]}")")
on_exit "'$SLURM' run scancel $job"
wait_job "$job"
loss_launch=$(final_loss "$WORK/launch")
say "sbatch + cluster/launch.sh (2 nodes x 1 task): loss $loss_launch in $(elapsed "$t") s"

# GPU binding, with a stand-in for leantrain that records what each rank sees.
stub=$WORK/stub-leantrain
cat >"$stub" <<'STUB'
#!/bin/sh
[ "$2" = --help ] && exit 0
echo "local=$SLURM_LOCALID node=$SLURMD_NODENAME gpus=${CUDA_VISIBLE_DEVICES:-unset}" >"$3.where.$SLURM_PROCID"
STUB
chmod +x "$stub"
t=$(date +%s.%N)
job=$(LEANTRAIN=$stub OUT=$WORK/gpu "$SLURM" run sbatch --parsable -N2 --ntasks-per-node=2 \
  --gpus-per-node=2 --cpus-per-task=1 -o "$WORK/gpu.log" -D "$WORK" "$SRC/cluster/sbatch/gpu.sbatch")
on_exit "'$SLURM' run scancel $job"
job2=$("$SLURM" run sbatch --parsable -N1 -n2 --gpus-per-task=1 --cpus-per-task=1 -o "$WORK/lgpu.log" \
  -D "$WORK" --wrap "$SRC/cluster/launch.sh $stub train --out $WORK/lgpu")
on_exit "'$SLURM' run scancel $job2"
wait_job "$job"
wait_job "$job2"
for r in 0 1 2 3; do
  w=$(cat "$WORK/gpu.where.$r" 2>/dev/null) || fail "GPU template: rank $r did not run"
  say "gpu.sbatch rank $r: $w"
  [ "$w" = "local=$((r % 2)) node=node$((r / 2 + 1)) gpus=0,1" ] || fail "GPU template: rank $r sees '$w'"
done
for r in 0 1; do
  w=$(cat "$WORK/lgpu.where.$r" 2>/dev/null) || fail "launch.sh (--gpus-per-task): rank $r did not run"
  say "launch.sh in a --gpus-per-task=1 allocation, rank $r: $w"
  [ "$w" = "local=$r node=node1 gpus=0,1" ] || fail "launch.sh (--gpus-per-task): rank $r sees '$w'"
done
say "GPU binding checked in $(elapsed "$t") s"

reference_2rank "$WORK/host1"
loss_host1=$(final_loss "$WORK/host1")
assert_close "srun 2 nodes vs 1 host (2 ranks)" "$loss_srun" "$loss_host1" 1e-6
assert_close "sbatch CPU template vs 1 host (2 ranks)" "$loss_sbatch" "$loss_host1" 1e-6
assert_close "sbatch + launch.sh vs 1 host (2 ranks)" "$loss_launch" "$loss_host1" 1e-6
say "passed"
