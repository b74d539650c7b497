#!/usr/bin/env bash
# The CPU rehearsal of the device script (ctest gpu_script_cpu_rehearsal, issue 39): proves on
# a CPU machine the plumbing and the criteria that will judge the one GPU run.
#   1. checks.py selftest: every criterion against made-up runs, passing and failing ones;
#   2. tests/gpu/run.sh --device cpu on an existing build (nothing rebuilt): every check at
#      tiny shapes, MPI for NCCL, the GPU-only gtests skipped by their binaries;
#   3. $OUT/gpu_results.json parsed: complete, device cpu, every expected check present with a
#      status and numbers, its result agreeing with run.sh's exit status.
#
#   bash tests/gpu/rehearse.sh BUILD_DIR OUT_DIR
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:?usage: rehearse.sh BUILD_DIR OUT_DIR}
out=${2:?usage: rehearse.sh BUILD_DIR OUT_DIR}
py=$top/.venv/bin/python
[ -x "$py" ] || py=$(command -v python3)

rm -rf "$out"
mkdir -p "$out"
if ! "$py" "$top/tests/gpu/checks.py" selftest >"$out/selftest.txt" 2>&1; then
  cat "$out/selftest.txt"
  echo "rehearse: FAIL: checks.py selftest"
  exit 1
fi
tail -1 "$out/selftest.txt"

t0=$(date +%s)
OUT=$out bash "$top/tests/gpu/run.sh" --device cpu --build-dir "$build"
rc=$?
echo "rehearse: run.sh --device cpu exited $rc after $(( $(date +%s) - t0 )) s"

# What the GPU run's file must hold too; the rehearsal's set of checks (one checkpoint
# direction: one device; MPI in place of NCCL).
"$py" - "$out/gpu_results.json" "$rc" <<'EOF'
import json, sys
path, rc = sys.argv[1], int(sys.argv[2])
with open(path, encoding="utf-8") as f:
    r = json.load(f)
want = {"probe", "torch", "build", "leantrain_version", "gtest_feed_forward_cuda", "gtest_nccl_world_of_one",
        "gtest_adamw8bit_gpu_tables", "fallback_single_process", "world_of_one_mpi", "bf16",
        "fp16_loss_scaling", "dropout_full_recompute_replay", "int8_optimizer_state",
        "recompute_peak_memory", "oom_backoff", "mfu_gpt2_small_bf16", "checkpoint_gpu_to_cpu",
        "two_ranks_mpi_sharded"}
problems = []
if r.get("device") != "cpu":
    problems.append(f"device {r.get('device')!r}")
if r.get("complete") is not True:
    problems.append("not marked complete")
if not isinstance(r.get("probe"), dict) or "cores" not in r["probe"]:
    problems.append("no probe")
if not isinstance(r.get("elapsed_s"), (int, float)):
    problems.append("no elapsed_s")
names = [c.get("name") for c in r.get("checks", [])]
if set(want) - set(names):
    problems.append(f"checks missing: {sorted(set(want) - set(names))}")
for c in r.get("checks", []):
    if c.get("status") not in ("pass", "fail", "skip") or not isinstance(c.get("numbers"), dict) \
            or not isinstance(c.get("detail"), str):
        problems.append(f"malformed check {c}")
    elif c["status"] == "skip" and not c["name"].startswith("gtest_") and c["name"] != "torch":
        problems.append(f"{c['name']} skipped in the rehearsal: {c['detail']}")
if (r.get("result") == "pass") != (rc == 0):
    problems.append(f"result {r.get('result')!r} but run.sh exited {rc}")
print(f"rehearse: {path}: {len(names)} checks, result {r.get('result')}, {r.get('elapsed_s')} s"
      + ("" if not problems else "; PROBLEMS: " + "; ".join(problems)))
sys.exit(1 if problems else 0)
EOF
json_rc=$?
[ "$rc" = 0 ] && [ "$json_rc" = 0 ]
