#!/usr/bin/env bash
# Runs on a lent GPU machine from the repository root, with .gpu/ (bench/device/pack.sh) carried: unpacks the
# binaries, libraries and Vulkan loader, then runs the modes asked for, each writing under $OUT.
#   TESTS=1 FILTER=gtest-filter        the test binary
#   CHECK=1 CASES=n SEED=s             flashtq check --backend cuda
#   SANITIZE=1 SFILTER=.. TOOLS=..     compute-sanitizer (memcheck racecheck by default) on the tests
#   BENCH=1 COMMIT=c                   cuda_turboquant_bench, bench/torch_sdpa.py with the peers, the merged table
#   NCU='bench args' NCUOPTS=..        ncu on bench_a (NCUBIN=name for another), details and SASS pages as text
#   AB='args;args' ROUNDS=n VARIANTS='b c'   the same benchmark arguments on several binaries, interleaved
#   DURATIONS='bench args' KERNELS=regex VARIANTS='b c'   each kernel's duration by ncu (launches 5-16 that match)
#   WEBGPU=1                           bench/gpu.sh (cuda and webgpu side by side, through the NVIDIA Vulkan driver)
#   CMD=..                             anything else, last
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/bin
for f in .gpu/vulkan/*.deb; do dpkg -x "$f" / ; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for f in .gpu/bin/*.xz; do b=$(basename "$f" .xz); xz -dc "$f" > /tmp/bin/$b; chmod +x /tmp/bin/$b; done
mkdir -p /tmp/lib; cp .gpu/lib/*.so* /tmp/lib/ 2>/dev/null; for f in /tmp/lib/*.xz; do [ -e "$f" ] && xz -d "$f"; done
export LD_LIBRARY_PATH=/tmp/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
peers() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/peers/*.whl
  export PYTHONPATH=/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/fi TRITON_CACHE_DIR=/tmp/tc TORCH_EXTENSIONS_DIR=/tmp/te \
    TVM_FFI_CACHE_DIR=/tmp/tvm TORCH_CUDA_ARCH_LIST=9.0
}
if [ "${TESTS:-0}" = 1 ]; then
  ( cd /tmp && /tmp/bin/flashtq_tests --gtest_filter="${FILTER:-*}" --gtest_brief=1 ) > "$OUT/tests.txt" 2>&1
  echo "tests rc=$?"; grep -E "FAILED|PASSED|SKIPPED|seed" "$OUT/tests.txt" | tail -40
fi
if [ "${CHECK:-0}" = 1 ]; then
  /tmp/bin/flashtq check --backend cuda --cases "${CASES:-300}" --seed "${SEED:-46}" > "$OUT/check.txt" 2>&1; echo "check rc=$?"; tail -5 "$OUT/check.txt"
fi
if [ "${SANITIZE:-0}" = 1 ]; then
  for t in ${TOOLS:-memcheck racecheck}; do
    compute-sanitizer --tool $t --error-exitcode 9 /tmp/bin/flashtq_tests --gtest_filter="${SFILTER}" --gtest_brief=1 > "$OUT/san-$t.txt" 2>&1
    echo "$t rc=$?"; tail -4 "$OUT/san-$t.txt"
  done
fi
if [ "${BENCH:-0}" = 1 ]; then
  peers
  BIN=/tmp/bin/bench_a COMMIT=${COMMIT:-unknown} bash bench/cuda_turboquant.sh "$OUT/merged.json" 2>&1 | tail -60
fi
if [ -n "${NCU:-}" ]; then
  ncu ${NCUOPTS:---set full} -o "$OUT/prof" /tmp/bin/${NCUBIN:-bench_a} $NCU > "$OUT/ncu-log.txt" 2>&1; echo "ncu rc=$?"; tail -3 "$OUT/ncu-log.txt"
  ncu -i "$OUT/prof.ncu-rep" --page details > "$OUT/ncu-details.txt" 2>&1
  ncu -i "$OUT/prof.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-sass.csv" 2>&1
  grep -E "Duration|Registers|Achieved Occupancy|Issue Slots Busy|Executed Ipc|Memory Throughput|L1/TEX Hit|Warp Cycles Per Issued" "$OUT/ncu-details.txt" | head -30
fi
if [ -n "${AB:-}" ]; then
  IFS=';' read -ra sets <<< "$AB"
  for r in $(seq ${ROUNDS:-2}); do for args in "${sets[@]}"; do for v in ${VARIANTS:-b c}; do echo "$v r$r [$args] $(/tmp/bin/bench_$v $args 2>&1 | tail -1)"; done; done; done | tee "$OUT/ab.txt"
fi
if [ -n "${DURATIONS:-}" ]; then
  for v in ${VARIANTS:-a}; do
    ncu -k "regex:${KERNELS:-.}" --launch-skip 4 --launch-count 12 --metrics gpu__time_duration.sum \
      /tmp/bin/bench_$v $DURATIONS > "$OUT/durations-$v.txt" 2>&1
    grep -E "^  [a-zA-Z_].*\(|gpu__time_duration" "$OUT/durations-$v.txt" | paste - - |
      sed -E 's/\(.*\) \(/ (/' | awk -v v=$v '{print v, $1, $2, $3, $NF " us"}'
  done
fi
if [ "${WEBGPU:-0}" = 1 ]; then
  FLASHTQ=/tmp/bin/flashtq COMMIT=${COMMIT:-unknown} bash bench/gpu.sh "$OUT/gpu.json" 2>&1 | tail -30
fi
if [ -n "${CMD:-}" ]; then eval "$CMD"; fi
