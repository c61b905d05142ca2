#!/usr/bin/env bash
# Regenerates the fuzzers' seed corpora in tests/fuzz/corpus/<harness>/ (committed): each harness
# writes its own with --write-corpus=DIR (tests/fuzz/fuzz_support.hpp). Inputs added to a corpus by
# hand (a fixed finding's input, say) are kept; the generated ones are rewritten in place.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset sanitize >/dev/null
cmake --build --preset fuzz -j "$(nproc)"
for h in fuzz_dense fuzz_tq_cache fuzz_tq_load; do
  mkdir -p tests/fuzz/corpus/"$h"
  ./build/sanitize/tests/fuzz/"$h" --write-corpus=tests/fuzz/corpus/"$h" >/dev/null 2>&1
  echo "tests/fuzz/corpus/$h: $(ls tests/fuzz/corpus/"$h" | wc -l) files, $(du -sk tests/fuzz/corpus/"$h" | cut -f1) KB"
done
