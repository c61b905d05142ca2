#!/usr/bin/env bash
# Instructions the cpu backend's TurboQuant attention kernel (attend_heads) executes per token and kv head, per
# preset: callgrind over bench/cpu_tq_decode (one call at 4096 tokens, Hkv = 8). A count, not a time: on a
# shared machine whose timings move by a third between runs it tells two versions of the kernel apart.
# Usage: bench/cpu_tq_instructions.sh [preset ...]   (default: every preset)
#        DRIVER=<other build>/bench/cpu_tq_decode bench/cpu_tq_instructions.sh   (e.g. a build with -g, to annotate)
set -euo pipefail
cd "$(dirname "$0")/.."
driver=${DRIVER:-build/release/bench/cpu_tq_decode}
command -v valgrind >/dev/null || { echo "cpu_tq_instructions.sh: needs valgrind (apt install valgrind)" >&2; exit 1; }
[ -x "$driver" ] || { echo "cpu_tq_instructions.sh: build first (make build)" >&2; exit 1; }
context=4096
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(seed default quality small)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for preset in "${presets[@]}"; do
  valgrind --tool=callgrind --callgrind-out-file="$out/$preset" --collect-atstart=no \
    "--toggle-collect=*attend_heads*" "$driver" --preset "$preset" --context $context --calls 1 >/dev/null 2>&1
  total=$(callgrind_annotate "$out/$preset" | awk '/PROGRAM TOTALS/ && !seen {gsub(",", "", $1); print $1; seen = 1}')
  python3 -c "print(f'$preset: {$total / ($context * 8):.1f} instructions per token and kv head in attend_heads')"
done
