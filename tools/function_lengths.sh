#!/usr/bin/env bash
# Lists the functions longer than LIMIT lines (universal-ctags' start and end lines) in the
# given files: issue 38's rule, "no function in trainers/ or launch/ over 80 lines".
#   tools/function_lengths.sh LIMIT FILE...     exit 1 when any is longer
set -euo pipefail
limit=$1
shift
ctags-universal --fields=+ne --c++-kinds=f -f - "$@" | awk -F'\t' -v lim="$limit" '
  $4 == "f" { s = e = 0
    for (i = 5; i <= NF; i++) { if ($i ~ /^line:/) s = substr($i, 6); if ($i ~ /^end:/) e = substr($i, 5) }
    if (e - s + 1 > lim) { printf "%s:%d: %s is %d lines (limit %d)\n", $2, s, $1, e - s + 1, lim; bad = 1 } }
  END { exit bad }'
