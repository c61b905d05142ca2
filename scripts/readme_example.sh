#!/usr/bin/env bash
# Prints the C++ example of README.md (the block between the example markers) so CI compiles it.
set -euo pipefail
cd "$(dirname "$0")/.."
sed -n '/<!-- example:begin -->/,/<!-- example:end -->/p' README.md | sed '1,2d;$d' | sed '$d'
