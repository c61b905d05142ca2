#!/usr/bin/env bash
# Runs on a GPU machine: `flashtq bench --gpu` (cuda and webgpu side by side: dense f32 forward,
# TurboQuant decode), JSON into bench/results/gpu-<commit>.json (or $1) with the machine named.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/nvidia_vulkan.sh
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
out=${1:-bench/results/gpu-$commit.json}
tmp=$(mktemp)
build/release/tools/flashtq/flashtq bench --gpu --output "$tmp" > /dev/null
python3 - "$tmp" "$commit" > "$out" <<'PY'
import json, subprocess, sys
r = json.load(open(sys.argv[1]))
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
r["machine"] = {"gpu": gpu}
r["commit"] = sys.argv[2]
print(json.dumps(r, indent=2))
PY
python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(r["machine"]["gpu"], "commit", r["commit"])
for row in r["gpu"]:
    shape = f"S={row['S']}" if row["op"].startswith("dense") else f"ctx={row['ctx']}"
    extra = f"{row['tflops']:.2f} TFLOP/s" if "tflops" in row else f"{row['packed_gbs']:.1f} GB/s packed"
    print(f"{row['backend']:>7} {row['op']:<18} {shape:<9} {row['ms']:9.3f} ms  {extra}  ({row['device']})")
PY
