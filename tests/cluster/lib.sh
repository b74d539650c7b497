# shellcheck shell=bash
# Shared by the tests in tests/cluster/: arguments, skipping, cleanup on every exit path,
# the tiny training config, and the final loss of a run.
# Each test: bash tests/cluster/NAME.sh LEANTRAIN_BINARY SOURCE_DIR
set -euo pipefail

BIN=$(readlink -f "${1:?usage: $0 LEANTRAIN_BINARY SOURCE_DIR}")
SRC=$(readlink -f "${2:?usage: $0 LEANTRAIN_BINARY SOURCE_DIR}")
NAME=$(basename "$0" .sh)
HOSTS=$SRC/cluster/netns_hosts.sh
SLURM=$SRC/cluster/slurm_local.sh
T0=$(date +%s.%N)

say() { printf '[%s %6.2fs] %s\n' "$NAME" "$(elapsed "$T0")" "$*"; }
skip() { echo "$NAME: SKIPPED: $*"; exit 77; }
fail() { echo "$NAME: FAILED: $*" >&2; exit 1; }
elapsed() { awk -v now="$(date +%s.%N)" -v t="$1" 'BEGIN { printf "%.2f", now - t }'; }
past() { awk -v e="$(elapsed "$1")" -v l="$2" 'BEGIN { exit !(e > l) }'; }  # past T0 LIMIT_S

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "no ip(8)"
probe=ltprobe$$
if ! ip netns add "$probe" 2>/dev/null; then skip "cannot create network namespaces ('ip netns add' failed)"; fi
ip netns del "$probe"
command -v mpirun >/dev/null || skip "no mpirun"
[ -x "$BIN" ] || fail "no leantrain binary at $BIN"
[ -d /usr/share/datasets/fashion-mnist ] || fail "no Fashion-MNIST (Debian package dataset-fashion-mnist)"

# Fresh names for this test's hosts and cluster, whatever the caller's shell holds; this
# test owns them (a later test sweeps them away if this one is killed before its cleanup).
unset LT_NS_PREFIX LT_NS_HOSTS LT_SLURM_DIR SLURM_CONF
export LT_NS_OWNER=$$
"$HOSTS" sweep
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lt-$NAME.XXXXXX")
CLEANUP=()   # commands run in reverse order on exit, whatever the exit path
on_exit() { CLEANUP+=("$*"); }
run_cleanup() {
  local rc=$? i
  trap - EXIT INT TERM
  for ((i = ${#CLEANUP[@]} - 1; i >= 0; i--)); do eval "${CLEANUP[$i]}" >/dev/null 2>&1 || true; done
  if [ $rc -ne 0 ] && [ $rc -ne 77 ] && [ -z "${KEEP_WORK:-}" ]; then
    # Show what the runs printed before the evidence goes.
    for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "--- $f (tail)"; tail -15 "$f"; }; done
  fi
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
  exit $rc
}
trap run_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The tiny run: MLP on 2048 Fashion-MNIST images, 5 optimizer steps of 64 samples, fp32,
# no dropout (so 1 and 2 ranks agree), one thread per rank, one eval batch. Seconds per run.
STEPS=${STEPS:-5}
RUN_LIMIT=40   # seconds for one such run (they take 2-5 s): a hang fails the test, not ctest
train_args() {  # train_args OUT MICRO_BATCH [more --set ...]: sets the arrays SETS and TRAIN
  local out=$1 micro=$2; shift 2
  SETS=(--config "$SRC/configs/fashion_mnist_mlp.toml"
    --set "train.steps=$STEPS" --set data.limit=2048 --set train.global_batch=64
    --set "train.micro_batch=$micro" --set model.dropout=0 --set train.threads=1
    --set train.eval_max_batches=1 --set log.progress=plain --set log.every_steps=1000 "$@")
  TRAIN=(train --out "$out" "${SETS[@]}")
}

# The "loss" of the last {"event":"step"} line of OUT/metrics.jsonl.
final_loss() {
  python3 - "$1/metrics.jsonl" <<'PY'
import json, sys
loss = None
for line in open(sys.argv[1]):
    o = json.loads(line)
    if o.get("event") == "step":
        loss = o["loss"]
if loss is None:
    sys.exit("no step line in " + sys.argv[1])
print(repr(loss))
PY
}

# last_step OUT: the "step" of the last step line (0 if none).
last_step() {
  python3 - "$1/metrics.jsonl" <<'PY'
import json, os, sys
step = 0
if os.path.exists(sys.argv[1]):
    for line in open(sys.argv[1]):
        try:
            o = json.loads(line)
        except ValueError:
            continue
        if o.get("event") == "step":
            step = o["step"]
print(step)
PY
}

# assert_close WHAT A B REL: |A - B| <= REL * |B|.
assert_close() {
  python3 - "$@" <<'PY' || exit 1
import sys
what, a, b, rel = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
d = abs(a - b) / max(abs(b), 1e-30)
ok = d <= rel
print(f"{what}: {a!r} vs {b!r}: relative difference {d:.3e} (limit {rel:g}) {'ok' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
}

# The reference every multi-host run must match: 2 ranks on this one host, plain mpirun.
reference_2rank() {  # reference_2rank OUT
  local t; t=$(date +%s.%N)
  train_args "$1" 16
  timeout "$RUN_LIMIT" "$SRC/cluster/mpirun.sh" 2 "$BIN" "${TRAIN[@]}" >"$WORK/ref2.log" 2>&1 ||
    fail "single-host 2-rank run failed (see $WORK/ref2.log)"
  say "1 host x 2 ranks (mpirun): loss $(final_loss "$1") in $(elapsed "$t") s"
}

# wait_job JOB [TIMEOUT_S]: waits until the Slurm job leaves the queue; fails unless it
# COMPLETED with exit code 0. Sets JOB_INFO to `scontrol show job` output.
wait_job() {
  local job=$1 limit=${2:-60} t state=x
  t=$(date +%s.%N)
  while [ -n "$state" ]; do
    state=$("$SLURM" run squeue -h -j "$job" -o %T 2>/dev/null || true)
    [ -z "$state" ] && break
    past "$t" "$limit" && fail "job $job still $state after $limit s"
    sleep 0.2
  done
  JOB_INFO=$("$SLURM" run scontrol show job "$job")
  grep -q 'JobState=COMPLETED' <<<"$JOB_INFO" && grep -q 'ExitCode=0:0' <<<"$JOB_INFO" ||
    fail "job $job: $(grep -oE 'JobState=\S+|ExitCode=\S+' <<<"$JOB_INFO" | tr '\n' ' ')"
}

# wait_pid_within PID T LIMIT_S: waits until background process PID (a child of this shell)
# exits, at most LIMIT_S seconds after time T (date +%s.%N). Sets RC to its exit code, empty
# when it still runs then.
wait_pid_within() {
  local pid=$1 t=$2 limit=$3
  RC=
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      set +e; wait "$pid"; RC=$?; set -e
      return
    fi
    past "$t" "$limit" && return
    sleep 0.1
  done
}
