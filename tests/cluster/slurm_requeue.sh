#!/usr/bin/env bash
# cluster_slurm_requeue: the CPU sbatch template's preemption path on the local Slurm
# cluster. Mid-run the batch shell gets SIGUSR1 (what --signal=B:USR1@120 sends before the
# time limit); the template forwards it to the ranks, leantrain checkpoints and exits 75,
# the template requeues the job, the requeued job resumes with --resume auto and finishes.
# The final loss matches an uninterrupted 2-rank run (1e-6 relative).
. "$(dirname "$0")/lib.sh"

"$BIN" train --help 2>/dev/null | grep -q -- '--resume' || skip "this leantrain has no --resume"

t=$(date +%s.%N)
eval "$("$SLURM" up 2 | grep '^export')"
on_exit "'$SLURM' down"
say "Slurm up in $(elapsed "$t") s"
export OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=eth0

STEPS=${REQUEUE_STEPS:-4000}  # long enough that the poll below (0.1 s + a python start) catches it mid-run: on a
# quiet machine 1200 steps of this MLP took 2.9 s, and once a poll first saw the run at its end
t=$(date +%s.%N)
train_args "$WORK/run" 16
job=$(LEANTRAIN=$BIN OUT=$WORK/run "$SLURM" run sbatch --parsable -N2 --ntasks-per-node=1 \
  --cpus-per-task=1 -o "$WORK/sbatch.log" -D "$WORK" "$SRC/cluster/sbatch/cpu.sbatch" "${SETS[@]}")
on_exit "'$SLURM' run scancel $job"
for ((i = 0; i < 600; i++)); do
  [ "$(last_step "$WORK/run")" -ge 20 ] && break
  sleep 0.1
done
at=$(last_step "$WORK/run")
[ "$at" -ge 20 ] || fail "job $job made no progress in 60 s"
[ "$at" -lt "$STEPS" ] || fail "job $job finished before the signal; raise REQUEUE_STEPS"
"$SLURM" run scancel --signal=USR1 --batch "$job"
ts=$(date +%s.%N)
say "job $job at step $at: SIGUSR1 to its batch shell"

state=
for ((i = 0; i < 600; i++)); do
  state=$("$SLURM" run squeue -h -j "$job" -o %T 2>/dev/null || true)
  [ -z "$state" ] && break
  sleep 0.2
done
[ -z "$state" ] || fail "job $job still $state 120 s after the signal"
info=$("$SLURM" run scontrol show job "$job")
say "job $job ended $(elapsed "$ts") s after the signal ($(elapsed "$t") s in all): $(grep -oE 'JobState=\S+|Restarts=\S+|ExitCode=\S+' <<<"$info" | tr '\n' ' ')"
grep -q 'JobState=COMPLETED' <<<"$info" && grep -q 'ExitCode=0:0' <<<"$info" || fail "job $job did not complete"
grep -q 'Restarts=1' <<<"$info" || fail "job $job was not requeued exactly once"
grep -q 'requeueing job' "$WORK/sbatch.log" || fail "the template did not requeue (see sbatch.log)"
grep -q 'restart 1:.*--resume auto' "$WORK/sbatch.log" || fail "the requeued run did not pass --resume auto"
grep -E 'preempt|resum' "$WORK/sbatch.log" | sed 's/^/    /' | head -6
[ "$(last_step "$WORK/run")" = "$STEPS" ] || fail "the requeued run ended at step $(last_step "$WORK/run"), not $STEPS"
loss_requeued=$(final_loss "$WORK/run")

reference_2rank "$WORK/straight"
assert_close "requeued + resumed vs uninterrupted (2 ranks, $STEPS steps)" \
  "$loss_requeued" "$(final_loss "$WORK/straight")" 1e-6
say "passed"
