#!/usr/bin/env bash
# The example as CI runs it (ctest: example_custom_model): install leantrain into a temporary
# prefix, build this folder against it (its main is lt::cli::main after registering two kinds),
# then use it as a user would:
#   1. mpirun -np 2 custom_model train: 40 steps (bf16, full recompute, 2 ranks x micro-batch 8 x
#      accumulation 2): the loss falls, checkpoints are written; 20 steps in another folder, then
#      --resume auto to 40: steps 21..40 have bitwise the losses of the uninterrupted run;
#   2. mpirun -np 2 custom_model plan --memory-budget: a plan.json with a fitting choice;
#   3. mpirun -np 2 custom_model options lists tiny_vit and bars beside the built-ins (once: rank 0
#      alone prints); inspect and export --format safetensors read its checkpoint;
#   4. a bad key exits 2 naming tiny_vit's keys; a data file missing on one rank of two exits 2
#      on both, promptly (the setup agreement, Note [Setup agreement]).
#
#   ci.sh BUILD SOURCE MPIEXEC [CMAKE [GENERATOR [CXX [CC [TORCH_DIR]]]]]
set -euo pipefail
fail_prefix=example_custom_model
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$2/tests/install/build_against_install.sh"
mpiexec=$3
build_against_install "$1" "$2" "$here" example_custom_model "${@:4}"
echo "built against the installed leantrain: install+configure $t_install s, build $t_build s"
lines=$(grep -cv '^\s*\(//.*\)\?$' "$here/main.cpp")
(( lines <= 20 )) || fail "main.cpp has $lines lines of code (a user's program is register + lt::cli::main)"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=("$mpiexec" --oversubscribe --mca mpi_yield_when_idle 1)
app=$pbuild/custom_model
config=$here/vit.toml
run() {  # LOG CMD... : runs it, its output in $tmp/LOG.log; fails on a non-zero exit
  local log=$1
  shift
  "$@" > "$tmp/$log.log" 2>&1 || { cat "$tmp/$log.log"; fail "$* (exit $?)"; }
}
expect_exit() {  # CODE LOG CMD... : runs it (at most 120 s), expects exit CODE
  local code=$1 log=$2 rc=0
  shift 2
  timeout 120 "$@" > "$tmp/$log.log" 2>&1 || rc=$?
  [[ $rc == "$code" ]] || { cat "$tmp/$log.log"; fail "$* exited $rc, not $code"; }
}

run whole "${mpi[@]}" -n 2 "$app" train --config "$config" --out "$tmp/whole"
run part "${mpi[@]}" -n 2 "$app" train --config "$config" --out "$tmp/part" --set train.steps=20
run resume "${mpi[@]}" -n 2 "$app" train --config "$config" --out "$tmp/part" --resume auto
grep -q "resumed from .*step-00000020.h5 at step 20" "$tmp/resume.log" || { cat "$tmp/resume.log"; fail "no resume at step 20"; }

run plan "${mpi[@]}" -n 2 "$app" plan --config "$config" --memory-budget 256MiB --out "$tmp/plan"
# The file subcommands under mpirun: rank 0 alone reads, prints and writes.
run options "${mpi[@]}" -n 2 "$app" options
(( $(grep -c '^### \[model\] kind = "tiny_vit"' "$tmp/options.log") == 1 )) || { cat "$tmp/options.log"; fail "options printed twice"; }
for kind in model:tiny_vit data:bars model:gpt model:resnet data:fashion_mnist; do
  grep -q "^### \[${kind%%:*}\] kind = \"${kind#*:}\"" "$tmp/options.log" \
    || { cat "$tmp/options.log"; fail "options does not list [${kind%%:*}] kind = ${kind#*:}"; }
done
ckpt=$tmp/whole/checkpoints/step-00000040.h5
run inspect "${mpi[@]}" -n 2 "$app" inspect "$ckpt" --json
run export "${mpi[@]}" -n 2 "$app" export "$ckpt" --format safetensors --out "$tmp/export"

# A key tiny_vit does not have is a config error (exit 2) naming its keys.
expect_exit 2 bad "${mpi[@]}" -n 2 "$app" train --config "$config" --out "$tmp/bad" --set model.dpeth=6
grep -q 'unknown key model.dpeth for model.kind = "tiny_vit"; its keys: image, patch' "$tmp/bad.log" \
  || { cat "$tmp/bad.log"; fail "no config error naming tiny_vit's keys"; }
# The data file of one rank is missing (fashion_mnist from another folder on rank 1): both ranks
# exit 2 at once, rank 1 naming the folder, rank 0 naming rank 1; no MPI_Abort, no deadline.
fmnist=(--set data.kind=fashion_mnist --set model.image=28 --set model.classes=10 --set train.steps=2)
t0=$(date +%s)
expect_exit 2 onerank "${mpi[@]}" -n 1 "$app" train --config "$config" --out "$tmp/onerank" "${fmnist[@]}" \
  --set data.path=/usr/share/datasets/fashion-mnist : \
  -n 1 "$app" train --config "$config" --out "$tmp/onerank" "${fmnist[@]}" --set data.path="$tmp/no-such-folder"
elapsed=$(( $(date +%s) - t0 ))
grep -q "config error: data.path: '$tmp/no-such-folder' does not exist" "$tmp/onerank.log" \
  || { cat "$tmp/onerank.log"; fail "rank 1 did not name its missing data folder"; }
grep -q "stopped: rank 1 failed while setting up (exit 2" "$tmp/onerank.log" \
  || { cat "$tmp/onerank.log"; fail "rank 0 did not name rank 1"; }
(( elapsed < 60 )) || fail "a data file missing on one rank took $elapsed s to end the job"

python3 - "$tmp" <<'PY'
import json, os, struct, sys
tmp = sys.argv[1]
def events(run, kind):
    return [j for j in map(json.loads, open(os.path.join(run, "metrics.jsonl"))) if j["event"] == kind]
whole, part = os.path.join(tmp, "whole"), os.path.join(tmp, "part")
a = {e["step"]: e["loss"] for e in events(whole, "step")}
b = {e["step"]: e["loss"] for e in events(part, "step")}
assert sorted(a) == list(range(1, 41)), f"uninterrupted run: steps {sorted(a)}"
assert sorted(b) == list(range(1, 41)), f"resumed run: steps {sorted(b)}"
first, last = sum(a[s] for s in range(1, 6)) / 5, sum(a[s] for s in range(36, 41)) / 5
assert last < 0.8 * first, f"the loss did not fall: {first:.4f} (steps 1-5) -> {last:.4f} (steps 36-40)"
differ = [s for s in range(21, 41) if a[s] != b[s]]
assert not differ, f"resumed losses differ at steps {differ}: {[(a[s], b[s]) for s in differ[:3]]}"
ea, eb = events(whole, "epoch")[-1], events(part, "epoch")[-1]
assert ea["eval_loss"] == eb["eval_loss"], (ea["eval_loss"], eb["eval_loss"])
cks = sorted(f for f in os.listdir(os.path.join(whole, "checkpoints")) if f.endswith(".h5"))
assert cks == ["step-00000020.h5", "step-00000030.h5", "step-00000040.h5"], cks
# The registered kinds' options, defaults included, are what config.json records.
cfg = json.load(open(os.path.join(whole, "config.json")))
assert cfg["model"] == {"kind": "tiny_vit", "image": 16, "patch": 4, "channels": 1, "classes": 4, "dim": 64,
                        "heads": 4, "depth": 4}, cfg["model"]
assert cfg["data"] == {"kind": "bars", "seed": 7, "limit": 0, "train_samples": 4096, "eval_samples": 512}, cfg["data"]
assert cfg["memory"]["recompute"] == "full", cfg["memory"]
# plan: a choice that fits the budget, for the user's model.
plan = json.load(open(os.path.join(tmp, "plan", "plan.json")))
assert plan["world_size"] == 2 and "chosen" in plan, {k: plan[k] for k in ("world_size", "budget_bytes")}
chosen = plan["chosen"]
assert chosen["fits"] and chosen["measured_peak_bytes"] <= plan["budget_bytes"], chosen
assert any(s.startswith("memory.recompute=") for s in plan["set"]), plan["set"]
# inspect --json: the checkpoint of step 40, with the user's parameters.
jsons = [l for l in open(os.path.join(tmp, "inspect.log")) if l.startswith("{")]
assert len(jsons) == 1, f"inspect under mpirun -np 2 printed {len(jsons)} summaries"
info = json.loads(jsons[0])
assert info["step"] == 40 and info["world_size"] == 2, (info["step"], info["world_size"])
assert any(t["name"] == "blocks.0.qkv.weight" for t in info["model"]), [t["name"] for t in info["model"]][:5]
# export: a safetensors file holding every parameter under leantrain's names.
st = os.path.join(tmp, "export", "model.safetensors")
with open(st, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
names = set(header) - {"__metadata__"}
assert "blocks.0.qkv.weight" in names and "head.weight" in names and "pos" in names, sorted(names)[:8]
print(f"example_custom_model: OK: loss {first:.4f} -> {last:.4f}, eval accuracy {ea['eval_accuracy']:.3f}, "
      f"steps 21-40 bitwise equal after resume, checkpoints {cks}, {len(names)} tensors exported")
PY
echo "example_custom_model: a data file missing on one rank ended the job in $elapsed s (exit 2)"
