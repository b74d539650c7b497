#!/usr/bin/env bash
# The installed package from another project (ctest: install_consumer):
#   1. cmake --install BUILD --prefix TMP/prefix
#   2. configure tests/install/consumer with CMAKE_PREFIX_PATH="TMP/prefix;<LibTorch prefix>",
#      build it (same compiler, generator and ccache settings as the project), run it
#   3. check what it prints: config parsed, local communicator, finite loss that one SGD step
#      lowers, checkpoint read back equal, every installed header compiled
# TMP is a fresh folder in BUILD (same depth on every run, so ccache hits), removed on exit.
#
#   run.sh BUILD SOURCE [CMAKE [GENERATOR [CXX [CC [TORCH_DIR]]]]]
# TORCH_DIR (the project's Torch_DIR) is used only when SOURCE/.venv has no torch.
set -euo pipefail
fail_prefix=install_consumer
source "$(dirname "${BASH_SOURCE[0]}")/build_against_install.sh"
build_against_install "$1" "$2" "$(cd "$2" && pwd)/tests/install/consumer" install_consumer "${@:3}"
t0=$(($(date +%s) - t_install - t_build))
cfg=$(find "$prefix" -name leantrainConfig.cmake | head -1)
for h in runtime/config.h models/model.h comm/communicator.h checkpoint_io/checkpoint.h optim/optimizer.h trainers/trainer.h; do
  [[ -f $prefix/include/leantrain/$h ]] || fail "header include/leantrain/$h not installed"
done
echo "installed: $(find "$prefix" -type f | wc -l) files, config ${cfg#"$prefix/"}"
if [[ -e $prefix/bin/leantrain ]]; then  # built with LEANTRAIN_BUILD_CLI: it runs from the prefix
  version=$("$prefix/bin/leantrain" --version) || fail "installed bin/leantrain --version"
  [[ $version == "leantrain "* ]] || fail "installed bin/leantrain --version printed: $version"
  echo "installed bin/leantrain: ${version%%$'\n'*}"
fi

# 3. Run and check.
mkdir "$tmp/out"
rc=0
out=$("$pbuild/consumer" "$tmp/out") || rc=$?
[[ $rc == 0 ]] || { echo "$out"; fail "consumer exited with $rc"; }
echo "$out"
field() { sed -n "s/^$1 .*\\b$2=\\([^ ]*\\).*/\\1/p" <<< "$out"; }
[[ $(field config model) == mlp && $(field config seed) == 7 ]] || fail "config not parsed"
[[ $(field comm backend) == local && $(field comm size) == 1 && $(field comm sum) == 3 ]] || fail "local communicator"
[[ $(field train lr) == 0.05 ]] || fail "lr_at"
loss=$(field train loss); after=$(field train loss_after)
[[ $loss =~ ^[0-9]+\.[0-9]+$ && $after =~ ^[0-9]+\.[0-9]+$ ]] || fail "loss $loss / $after not finite"
awk -v a="$loss" -v b="$after" 'BEGIN { exit !(a > 0 && b < a) }' || fail "one step did not lower the loss ($loss -> $after)"
[[ $(field checkpoint equal) == 1 && $(field checkpoint tensors) -gt 0 && $(field checkpoint step) == 1 ]] \
  || fail "checkpoint not read back equal"
[[ -s $tmp/out/consumer.h5 ]] || fail "no checkpoint file"
headers=$(find "$prefix/include/leantrain" -name '*.h' | wc -l)
[[ $(field headers included) == "$headers" ]] || fail "the consumer compiled $(field headers included) of $headers installed headers"
echo "install_consumer: OK (install+configure $t_install s, build $t_build s, total $(($(date +%s) - t0)) s)"
