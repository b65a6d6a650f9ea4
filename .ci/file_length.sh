#!/usr/bin/env bash
# Files in src/ and kernels/src hold one job each: one past 600 lines fails CI unless its first
# five lines say why, in a line with "Over 600 lines:" (issue 41).
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
while read -r n f; do
  [[ "$f" == total ]] && continue
  if (( n > 600 )) && ! head -n 5 "$f" | grep -q "Over 600 lines:"; then
    echo "$f: $n lines: split it, or say why in its first five lines (\"Over 600 lines: ...\")"
    fail=1
  fi
done < <(find src kernels/src -name '*.rs' -print0 | xargs -0 wc -l)
exit "$fail"
