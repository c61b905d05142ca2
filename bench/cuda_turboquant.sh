#!/usr/bin/env bash
# Runs on the GPU machine: flashtq's TurboQuant benchmark and PyTorch SDPA over a bf16 cache, in one
# run on one GPU, merged into bench/results/cuda_turboquant-<commit>.json (or $1).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build/release/bench/cuda_turboquant_bench}  # BIN: a binary built elsewhere (bench/device/run.sh)
if [ ! -x "$bin" ]; then
  cmake --preset release -DFLASHTQ_BUILD_TESTS=OFF >/dev/null
  cmake --build --preset release --target cuda_turboquant_bench -j "$(nproc)"
fi
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
out=${1:-bench/results/cuda_turboquant-$commit.json}
tmp=$(mktemp -d)
"$bin" > "$tmp/flashtq.json"
python3 bench/torch_sdpa.py > "$tmp/torch.json"
python3 bench/merge_turboquant.py "$tmp/flashtq.json" "$tmp/torch.json" "$commit" > "$out"
python3 bench/merge_turboquant.py --table "$out"
