#!/usr/bin/env bash
# Everything `make test` runs after the release build: the unit and conformance tests, the same
# tests under AddressSanitizer + UndefinedBehaviorSanitizer, the fuzzers for a minute each, the
# concurrency tests under ThreadSanitizer, the installed package consumed from an outside project
# (which also builds the README's example), the CLI's conformance bar, and the Python package.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
flashtq=./build/release/tools/flashtq/flashtq
# Each step's heading carries the seconds since the start, so a slow CI run shows where its time went.
step() { echo "== $* (at ${SECONDS} s)"; }

# Mesa's Vulkan loader looks for a runtime directory; a private one keeps its warnings out of the log.
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}

step "format (.clang-format)"
./scripts/check_format.sh

step "tests (release)"
ctest --preset release -j "$jobs"

step "tests under ASan + UBSan"
cmake --preset sanitize >/dev/null
cmake --build --preset sanitize -j "$jobs"
# LargeGrids is about launch grids past 65535 blocks, which only the GPU backends have (none are in this build); its
# host instances run in the release step above, and under ASan the cpu one alone took 99 s, the end of this step.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --preset sanitize -j "$jobs" -E '^Backends/LargeGrids[.]'

step "fuzzing: the libFuzzer harnesses of tests/fuzz/ (built beside the tests above), 60 s each"
./scripts/fuzz.sh 60

step "concurrency tests and the cpu backend's conformance cases under ThreadSanitizer"
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$jobs"
# clang's libomp is not instrumented, so TSan cannot see OpenMP's own synchronisation and reports
# every parallel region as racing (it does, without archer). libomp's archer tool (an OMPT tool
# loaded through OMP_TOOL_LIBRARIES) tells TSan about it, so the cpu kernels run on their usual
# threads and a race between them is still seen; ignore_noninstrumented_modules drops the reports
# inside libomp itself. A race fails the job (halt_on_error).
archer=$(dirname "$(readlink -f "$(command -v clang++)")")/../lib/libarcher.so
[ -f "$archer" ] || { echo "libarcher.so not found beside clang++ (libomp-dev): $archer"; exit 1; }
OMP_TOOL_LIBRARIES=$archer \
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1 \
  ./build/tsan/tests/flashtq_tests --gtest_brief=1 \
  --gtest_filter='Concurrency.*:Registry.*:Backends/*.*/cpu*'

step "install and consume flashtq::flashtq from an outside project (with the README example)"
rm -rf build/install build/consumer
cmake --install build/release --prefix build/install >/dev/null
./scripts/readme_example.sh > build/readme_example.cpp
cmake -S examples/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$PWD/build/install" \
  -DREADME_EXAMPLE="$PWD/build/readme_example.cpp" >/dev/null
cmake --build build/consumer -j "$jobs"
./build/consumer/consumer
./build/consumer/readme_example

step "flashtq check --json --cases 200"
status=0
report=$("$flashtq" check --json --cases 200) || status=$?
echo "$report"
[ "$status" -eq 0 ] || { echo "flashtq check exited with status $status"; exit 1; }
python3 -c 'import json,sys; r=json.loads(sys.argv[1]); bad={k:v for k,v in r["backends"].items() if v["failed"]}; sys.exit(1 if bad or not r["backends"] else 0)' "$report"
step "Python package: venv, pinned wheels, pip install ., pytest"
./scripts/python_test.sh
echo "== all tests passed in ${SECONDS} s"
