#!/usr/bin/env bash
# cluster_cut_link: a 2-host mpirun training run; host 2's link is cut mid-run (its switch
# port goes dead silently: no RST, no carrier loss). The job must exit non-zero within 30 s
# of the cut, and no leantrain or orted may be left in any namespace (nor anywhere else).
# What ends it: Open MPI's out-of-band TCP keepalive set by cluster/mpirun.sh (3 s idle,
# 1 s interval, 2 probes): mpirun loses host 2's daemon and tears the job down, host 2's
# daemon loses mpirun and kills its rank.
. "$(dirname "$0")/lib.sh"

LIMIT=30
eval "$("$HOSTS" up 2)"
on_exit "'$HOSTS' down"

# Long enough to be cut mid-run (thousands of steps of a few ms each).
STEPS=100000
train_args "$WORK/cut" 16
"$HOSTS" mpirun 2 "$BIN" "${TRAIN[@]}" >"$WORK/cut.log" 2>&1 &
job=$!
on_exit "kill -9 $job"

# Cut once both ranks are well into training.
for ((i = 0; i < 600; i++)); do
  [ "$(last_step "$WORK/cut")" -ge 50 ] && break
  kill -0 "$job" 2>/dev/null || fail "the run ended before the cut"
  sleep 0.1
done
steps=$(last_step "$WORK/cut")
[ "$steps" -ge 50 ] || fail "no training progress after 60 s (step $steps)"
say "training at step $steps; in the hosts: $("$HOSTS" pids | awk '{print $1 ":" $3}' | sort | uniq -c | tr -s ' \n' ' ')"

t=$(date +%s.%N)
"$HOSTS" cut 2
say "host 2's link cut"
wait_pid_within "$job" "$t" "$LIMIT"
rc=$RC
exit_s=$(elapsed "$t")
[ -n "$rc" ] || fail "the job still runs $LIMIT s after the cut"
say "mpirun exited with code $rc $exit_s s after the cut (last logged step $(last_step "$WORK/cut"))"
[ "$rc" -ne 0 ] || fail "the job exited 0 after a cut link"

# Nothing may stay behind: poll until the daemons and ranks are gone, within the same bound.
left=
while :; do
  left=$( { "$HOSTS" pids | awk '$3 ~ /^(leantrain|orted|mpirun)$/ {print $1 ":" $2 ":" $3}'
            pgrep -f -a -- "$WORK/cut" || true; } | tr '\n' ' ')
  [ -z "${left// /}" ] && break
  past "$t" "$LIMIT" && break
  sleep 0.1
done
gone_s=$(elapsed "$t")
[ -z "${left// /}" ] || fail "left running $LIMIT s after the cut: $left"
say "no leantrain/orted/mpirun left anywhere $gone_s s after the cut"
grep -m1 -q 'lost communication with a remote daemon' "$WORK/cut.log" &&
  say "mpirun said: ORTE has lost communication with a remote daemon"
say "passed"
