#!/usr/bin/env bash
# The tree is formatted as .clang-format says (Debian 12's clang-format 14, which scripts/setup.sh
# installs); prints the offending files and fails otherwise. `clang-format -i FILE` fixes one.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' 2>/dev/null || find src include tests tools bench examples python -name '*.[ch]pp' -o -name '*.cu' -o -name '*.cuh')
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "format: ${#bad[@]} file(s) differ from .clang-format: ${bad[*]}"
  exit 1
fi
echo "format: ${#files[@]} files as .clang-format says"
