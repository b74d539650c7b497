#!/usr/bin/env bash
# The layers below the components name no model or data kind: runtime/, optim/, trainers/ and launch/
# reach models and data only through the registries (models/registry.h, data/registry.h) and
# the input contract. A string literal naming a built-in kind, or the example's, in their
# code (comments aside) fails this test, naming the line.
#   no_kind_names.sh SOURCE_DIR
set -euo pipefail
cd "$1"
kinds='gpt|bert|llama|resnet|mlp|fashion_mnist|text|synthetic|tiny_vit|bars'
hits=$(grep -rnE "\"($kinds)\"" runtime optim trainers launch --include='*.cpp' --include='*.h' \
       | grep -vE '^[^:]+:[0-9]+:\s*//' || true)
if [ -n "$hits" ]; then
  echo "no_kind_names: these lines name a component kind (use the registries instead):"
  echo "$hits"
  exit 1
fi
n=$(grep -rlE "\"($kinds)\"" models/src data/src | wc -l)
[ "$n" -ge 2 ] || { echo "no_kind_names: the pattern no longer finds the kinds in models/ and data/ ($n files)"; exit 1; }
echo "no_kind_names: OK (runtime/, optim/, trainers/, launch/ name no kind; models/ and data/ register them in $n files)"
