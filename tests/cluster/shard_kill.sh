#!/usr/bin/env bash
# cluster_shard_kill: a sharded run (memory.shard = gradients, ZeRO stage 2) on 2 network-
# namespace hosts x 1 rank through mpirun, checkpointing every few steps. Once a checkpoint
# exists, one rank's leantrain gets SIGKILL from outside (as the OOM killer would send it).
# The job must exit non-zero within 15 s (the bound of the single-host SIGKILL test in
# tests/integration/test_faults.cpp) with nothing left running, leave only complete
# checkpoints (every step-*.h5 reads back and `latest` names one; a torn write may only stay
# as a *.tmp.* file, which never counts), and a rerun with --resume auto on the same 2 hosts
# resumes from the checkpoint `latest` names and trains to the end.
# KILL_RANK=0 kills rank 0 (the one that writes the checkpoints) instead of rank 1.
. "$(dirname "$0")/lib.sh"

"$BIN" train --help 2>/dev/null | grep -q -- '--resume' || skip "this leantrain has no --resume"

LIMIT=15
KILL_RANK=${KILL_RANK:-1}
EVERY=${EVERY:-10}
STEPS=${SHARD_KILL_STEPS:-600}  # the poll below kills at step >= 3 x EVERY; the rest is the resumed run
eval "$("$HOSTS" up 2)"
on_exit "'$HOSTS' down"

# The tiny GPT of tests/integration (cli_fixture.h's tiny_gpt_config) on synthetic tokens:
# no dataset, ~10 ms a step. Its 2 layers x d_model 32 split into 2 gradient/optimizer shards.
cat >"$WORK/tiny_gpt.toml" <<EOF
[model]
kind = "gpt"
vocab_size = 64
seq_len = 32
n_layer = 2
n_head = 2
d_model = 32
dropout = 0.0
[data]
kind = "synthetic"
synthetic_samples = 512
[train]
global_batch = 16
micro_batch = 4
steps = $STEPS
lr = 3e-3
warmup_steps = 2
eval_max_batches = 1
eval_batch = 32
threads = 1
[checkpoint]
every_steps = $EVERY
keep_last = 3
[log]
progress = "plain"
every_steps = 1000
EOF
OUT=$WORK/run
CKDIR=$OUT/checkpoints
TRAIN=(train --config "$WORK/tiny_gpt.toml" --out "$OUT" --set memory.shard=gradients --set log.all_ranks=true)

"$HOSTS" mpirun 2 "$BIN" "${TRAIN[@]}" >"$WORK/killed.log" 2>&1 &
job=$!
on_exit "kill -9 $job"

# Wait for a few checkpoints, then kill mid-run (between or during checkpoint writes).
for ((i = 0; i < 600; i++)); do
  [ "$(last_step "$OUT")" -ge $((3 * EVERY)) ] && [ -f "$CKDIR/latest" ] && break
  kill -0 "$job" 2>/dev/null || fail "the run ended before the kill"
  sleep 0.1
done
at=$(last_step "$OUT")
[ "$at" -ge $((3 * EVERY)) ] && [ -f "$CKDIR/latest" ] || fail "no checkpoint and step $((3 * EVERY)) after 60 s (step $at)"
victim=$("$HOSTS" pids | awk -v ns="$LT_NS_PREFIX-h$((KILL_RANK + 1))" '$1 == ns && $3 == "leantrain" {print $2}')
[ "$(wc -w <<<"$victim")" = 1 ] || fail "expected one leantrain in host $((KILL_RANK + 1)), found '$victim'"
t=$(date +%s.%N)
kill -KILL "$victim"
say "step $at, latest $(cat "$CKDIR/latest"): SIGKILL to rank $KILL_RANK (pid $victim in host $((KILL_RANK + 1)))"

wait_pid_within "$job" "$t" "$LIMIT"
rc=$RC
exit_s=$(elapsed "$t")
[ -n "$rc" ] || fail "the job still runs $LIMIT s after the kill"
killed_at=$(last_step "$OUT")
say "mpirun exited with code $rc $exit_s s after the kill (last logged step $killed_at)"
[ "$rc" -ne 0 ] || fail "the job exited 0 after a rank was killed"
[ "$killed_at" -lt "$STEPS" ] || fail "the run reached its last step before the kill; raise SHARD_KILL_STEPS"
left=
while :; do
  left=$("$HOSTS" pids | awk '$3 ~ /^(leantrain|orted|mpirun)$/ {print $1 ":" $2 ":" $3}' | tr '\n' ' ')
  [ -z "${left// /}" ] && break
  past "$t" "$LIMIT" && break
  sleep 0.1
done
[ -z "${left// /}" ] || fail "left running $LIMIT s after the kill: $left"

# Only complete checkpoints: every step-*.h5 reads back, anything else is `latest` or the
# temporary file of a torn write, and `latest` names one of them. (It names the newest
# unless the kill fell between a checkpoint's rename and the pointer's update: then the
# one before, which --resume auto takes first all the same.)
checkpoints=() temps=()
for f in "$CKDIR"/*; do
  n=$(basename "$f")
  case "$n" in
    latest) ;;
    step-[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9].h5)
      "$BIN" inspect "$f" >"$WORK/inspect.log" 2>&1 || fail "$n is not a complete checkpoint: $(tail -3 "$WORK/inspect.log")"
      checkpoints+=("$n") ;;
    *.tmp.*) temps+=("$n") ;;
    *) fail "unexpected file in the checkpoint directory: $n" ;;
  esac
done
[ ${#checkpoints[@]} -gt 0 ] || fail "no checkpoint left in $CKDIR"
latest=$(cat "$CKDIR/latest")
[ -f "$CKDIR/$latest" ] && [[ " ${checkpoints[*]} " == *" $latest "* ]] || fail "latest names '$latest', not one of: ${checkpoints[*]}"
resume_step=$((10#${latest:5:8}))
[ $((resume_step % EVERY)) = 0 ] && [ "$resume_step" -le "$killed_at" ] || fail "checkpoint step $resume_step (every $EVERY, killed at $killed_at)"
say "checkpoints: ${checkpoints[*]} (all read back); latest -> $latest${temps:+; torn: ${temps[*]}}"

# Resume on the same 2 hosts, to the end.
t=$(date +%s.%N)
timeout 120 "$HOSTS" mpirun 2 "$BIN" "${TRAIN[@]}" --resume auto >"$WORK/resumed.log" 2>&1 ||
  fail "the resumed run failed (exit $?)"
grep -q "resumed from $CKDIR/$latest at step $resume_step" "$WORK/resumed.log" ||
  fail "the rerun did not resume from $CKDIR/$latest at step $resume_step: $(grep -m1 -E 'resum|no checkpoint' "$WORK/resumed.log")"
! grep -q "skipping damaged checkpoint" "$WORK/resumed.log" || fail "the rerun found a damaged checkpoint: $(grep -m1 'skipping damaged' "$WORK/resumed.log")"
final=$(last_step "$OUT")
[ "$final" = "$STEPS" ] || fail "the resumed run ended at step $final, not $STEPS"
say "resumed from step $resume_step, finished step $STEPS in $(elapsed "$t") s: $(grep -m1 -o 'resumed from .*' "$WORK/resumed.log")"
for f in "$CKDIR"/*; do
  case "$(basename "$f")" in *.tmp.*) fail "a torn write stayed after the resumed run: $f" ;; esac
done
[ -f "$CKDIR/$(printf 'step-%08d.h5' "$STEPS")" ] || fail "no final checkpoint step $STEPS"
"$BIN" inspect "$CKDIR/$(printf 'step-%08d.h5' "$STEPS")" >/dev/null 2>&1 || fail "the final checkpoint does not read back"
say "passed"
