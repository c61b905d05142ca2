#!/usr/bin/env bash
# Builds the harnesses in the sanitize preset (clang: libFuzzer + ASan + UBSan) and runs each harness of tests/fuzz/ for
# SECONDS (default 60) on a copy of its corpus (tests/fuzz/corpus/<harness>/); the inputs it finds go
# to build/fuzz-runs/<harness>/, never into the tree. Exits nonzero on any finding, after printing the
# input that caused it and the command that replays it. `make fuzz` runs it for longer.
#
#   scripts/fuzz.sh [SECONDS] [HARNESS...]      (HARNESS: fuzz_dense, fuzz_tq_cache, fuzz_tq_load)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
harnesses=("$@")
((${#harnesses[@]})) || harnesses=(fuzz_dense fuzz_tq_cache fuzz_tq_load)

cmake --preset sanitize >/dev/null
cmake --build --preset fuzz -j "$(nproc)"

# Sanitizers stop at the first report (a finding), with a stack; a leak is a finding too.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
runs=$PWD/build/fuzz-runs
# One harness for SECONDS; its exit status goes to <work>/status. Each harness is one single-threaded process,
# so up to $(nproc) of them run at once: the same seconds each, in less wall time (CI's budget).
run_harness() {
  local h=$1 work=$runs/$1 status=0
  echo "== $h: ${seconds} s on $(ls "$work/corpus" | wc -l) seed inputs"
  # -timeout: one input may run 10 s (a hang is a finding); -rss_limit_mb: the process's memory, and
  # (libFuzzer's default) the largest single allocation; the harnesses' temporary files go to tmp/.
  TMPDIR=$work/tmp ./build/sanitize/tests/fuzz/"$h" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/corpus" >"$work/log" 2>&1 || status=$?
  echo "$status" >"$work/status"
}
for h in "${harnesses[@]}"; do
  work=$runs/$h
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts" "$work/tmp"
  cp tests/fuzz/corpus/"$h"/* "$work/corpus/"
  while (($(jobs -rp | wc -l) >= $(nproc))); do wait -n || true; done
  run_harness "$h" &
done
wait
failed=()
for h in "${harnesses[@]}"; do
  work=$runs/$h
  status=$(cat "$work/status" 2>/dev/null || echo "none (the harness did not finish)")
  echo "== $h: exit status $status"
  grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|Done )' "$work/log" | sed 's/^/   /' || true
  mapfile -t found < <(find "$work/artifacts" -type f | sort)
  if [ "$status" != 0 ] || ((${#found[@]})); then
    failed+=("$h")
    echo "!! $h: a finding (exit status $status); the end of its log ($work/log):"
    tail -n 60 "$work/log" | sed 's/^/   /'
    for f in "${found[@]}"; do
      echo "   input:  $f"
      echo "   replay: ./build/sanitize/tests/fuzz/$h $f"
    done
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]} (keep the input: it replays the same way on any machine; a fixed one goes into"
  echo "      tests/fuzz/corpus/<harness>/, an open one into tests/fuzz/regressions/<harness>/)"
  exit 1
fi
echo "fuzz: no findings in ${harnesses[*]} (${seconds} s each)"
