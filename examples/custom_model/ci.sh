#!/usr/bin/env bash
# The example as CI runs it (ctest: example_custom_model): install leantrain into a temporary
# prefix, build this folder against it, then under `mpirun -np 2`:
#   1. train 40 steps (bf16, full recompute, 2 ranks x micro-batch 8 x accumulation 2):
#      the loss falls, checkpoints are written;
#   2. train 20 steps in another folder, then resume it with --resume auto to 40: steps
#      21..40 have bitwise the losses of the uninterrupted run, and so does the final eval.
#
#   ci.sh BUILD SOURCE MPIEXEC [CMAKE [GENERATOR [CXX [CC [TORCH_DIR]]]]]
set -euo pipefail
fail_prefix=example_custom_model
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$2/tests/install/build_against_install.sh"
mpiexec=$3
build_against_install "$1" "$2" "$here" example_custom_model "${@:4}"
echo "built against the installed leantrain: install+configure $t_install s, build $t_build s"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=("$mpiexec" -n 2 --oversubscribe --mca mpi_yield_when_idle 1)
train() {  # OUT [ARGS...]
  local out=$1
  shift
  "${mpi[@]}" "$pbuild/custom_model" --out "$tmp/$out" "$@" > "$tmp/$out.log" 2>&1 \
    || { cat "$tmp/$out.log"; fail "custom_model --out $out $*"; }
}
train whole
train part --set train.steps=20
train part --resume auto
# A key tiny_vit does not have is a config error (exit 2) naming its keys.
if "${mpi[@]}" "$pbuild/custom_model" --out "$tmp/bad" --set model.dpeth=6 > "$tmp/bad.log" 2>&1; then
  fail "--set model.dpeth=6 was accepted"
fi
grep -q 'unknown key model.dpeth for model.kind = "tiny_vit"; its keys: image, patch' "$tmp/bad.log" \
  || { cat "$tmp/bad.log"; fail "no config error naming tiny_vit's keys"; }
grep -q "resumed from .*step-00000020.h5 at step 20" "$tmp/part.log" || { cat "$tmp/part.log"; fail "no resume at step 20"; }

python3 - "$tmp/whole" "$tmp/part" <<'PY'
import json, os, sys
def events(run, kind):
    return [j for j in map(json.loads, open(os.path.join(run, "metrics.jsonl"))) if j["event"] == kind]
whole, part = sys.argv[1], sys.argv[2]
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
print(f"example_custom_model: OK: loss {first:.4f} -> {last:.4f}, eval accuracy {ea['eval_accuracy']:.3f}, "
      f"steps 21-40 bitwise equal after resume, checkpoints {cks}")
PY
