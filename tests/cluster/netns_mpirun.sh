#!/usr/bin/env bash
# cluster_netns_mpirun: the tiny run on 2 network-namespace hosts through mpirun (1 rank per
# host, TCP between them, ranks started by the rsh agent) ends with the same training loss
# as 2 ranks on one host (1e-6 relative) and as 1 process with doubled accumulation (1e-5).
. "$(dirname "$0")/lib.sh"

eval "$("$HOSTS" up 2)"
on_exit "'$HOSTS' down"
say "hosts up: $LT_NS_PREFIX-h1 ($LT_NS_SUBNET.11), $LT_NS_PREFIX-h2 ($LT_NS_SUBNET.12)"

# 2 hosts x 1 rank x 16 micro x 2 accumulation. Each rank notes where it runs, then becomes
# leantrain.
t=$(date +%s.%N)
train_args "$WORK/hosts2" 16
timeout "$RUN_LIMIT" "$HOSTS" mpirun 2 sh -c 'echo "$(hostname) $(readlink /proc/self/ns/net)" >"$0.where.$OMPI_COMM_WORLD_RANK"; exec "$@"' \
  "$WORK/hosts2" "$BIN" "${TRAIN[@]}" >"$WORK/hosts2.log" 2>&1 || fail "2-host mpirun failed (exit $?)"
loss_hosts=$(final_loss "$WORK/hosts2")
say "2 hosts x 1 rank (netns mpirun): loss $loss_hosts in $(elapsed "$t") s"
w0=$(cat "$WORK/hosts2.where.0") w1=$(cat "$WORK/hosts2.where.1")
say "rank 0 on: $w0; rank 1 on: $w1"
[ "${w0%% *}" = "$LT_NS_PREFIX-h1" ] && [ "${w1%% *}" = "$LT_NS_PREFIX-h2" ] ||
  fail "ranks not on hosts h1 and h2: '$w0' / '$w1'"
[ "${w0#* }" != "${w1#* }" ] || fail "both ranks in the same network namespace"
[ "${w0#* }" != "$(readlink /proc/self/ns/net)" ] || fail "rank 0 ran in the root namespace"

reference_2rank "$WORK/host1"
loss_host1=$(final_loss "$WORK/host1")

# 1 process x 16 micro x 4 accumulation: the same 64 samples per step.
t=$(date +%s.%N)
train_args "$WORK/single" 16
timeout "$RUN_LIMIT" "$BIN" "${TRAIN[@]}" >"$WORK/single.log" 2>&1 || fail "single-process run failed"
loss_single=$(final_loss "$WORK/single")
say "1 process x 4 accumulation: loss $loss_single in $(elapsed "$t") s"

assert_close "2 hosts vs 1 host (2 ranks)" "$loss_hosts" "$loss_host1" 1e-6
assert_close "2 hosts vs 1 process" "$loss_hosts" "$loss_single" 1e-5
say "passed"
