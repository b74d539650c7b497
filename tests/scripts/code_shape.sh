#!/usr/bin/env bash
# The shape issue 38 set for the code, held by CI:
#   - no file in trainers/ over 600 lines;
#   - no function in trainers/ or launch/ over 80 lines (universal-ctags' start and end lines,
#     tools/function_lengths.sh);
#   - the config key activation_checkpoint named nowhere but in its alias (runtime/src/config.cpp),
#     the alias's tests (tests/unit/test_config.cpp, Cli.DeprecatedRecomputeKeyTrainsWithOneWarning)
#     and the changelog (docs/CHANGELOG.md).
#   code_shape.sh SOURCE_DIR
set -euo pipefail
cd "$1"
bad=0
while read -r n f; do
  [[ $f == total ]] && continue
  if (( n > 600 )); then echo "code_shape: $f has $n lines (limit 600)"; bad=1; fi
done < <(wc -l $(find trainers -name '*.cpp' -o -name '*.h'))
bash tools/function_lengths.sh 80 $(find trainers launch -name '*.cpp' -o -name '*.h') || bad=1
hits=$(grep -rn activation_checkpoint . --exclude-dir=.git --exclude-dir='build*' --exclude-dir=.venv \
         --exclude-dir=runs --exclude-dir=out --exclude-dir=.cache \
       | grep -vE '^\./(runtime/src/config\.cpp|tests/unit/test_config\.cpp|tests/integration/test_cli\.cpp|docs/CHANGELOG\.md|tests/scripts/code_shape\.sh):' || true)
if [[ -n $hits ]]; then echo "code_shape: activation_checkpoint outside its alias, tests and changelog:"; echo "$hits"; bad=1; fi
(( bad == 0 )) && echo "code_shape: OK (trainers/ files <= 600 lines, trainers/ and launch/ functions <= 80 lines, activation_checkpoint only in its alias)"
exit $bad
