#!/usr/bin/env bash
# Runs on a GPU machine: `flashtq bench --gpu` (cuda and webgpu side by side: dense f32 and f16 forward,
# TurboQuant decode at B = 1 and 8 and chunked prefill (bf16-class and exact paths), beside the copy bandwidth and FMA peaks measured through WebGPU in the same
# run), JSON into bench/results/gpu-<commit>.json (or $1) with the machine named.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/nvidia_vulkan.sh
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
out=${1:-bench/results/gpu-$commit.json}
tmp=$(mktemp)
"${FLASHTQ:-build/release/tools/flashtq/flashtq}" bench --gpu --output "$tmp" > /dev/null
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
    if "error" in row:
        print(f"{row['backend']:>7} refused: {row['error']}")
        continue
    if row["op"] == "limits":
        print(f"limits (WebGPU): copy {row['copy_gbs']:.0f} GB/s (command {row.get('copy_command_gbs', 0):.0f}, "
              f"kernel {row.get('copy_kernel_gbs', 0):.0f}), f32 FMA {row['f32_fma_tflops']:.2f} TFLOP/s, "
              f"f16 FMA {row['f16_fma_tflops']:.2f} TFLOP/s")
        continue
    if row["op"].startswith("dense"):
        shape = f"S={row['S']}"
        extra = f"{row['tflops']:.2f} TFLOP/s ({100 * row.get('fraction_of_f32_fma_peak', 0):.0f} % of f32 FMA)"
    else:
        shape = f"B={row['batch']} ctx={row['ctx']}" + (f" rows={row['n_queries']}" if row.get("n_queries", 1) > 1 else "")
        extra = f"{row['packed_gbs']:.1f} GB/s packed ({100 * row.get('fraction_of_copy_bw', 0):.0f} % of copy)"
    print(f"{row['backend']:>7} {row['op']:<26} {shape:<24} {row['ms']:9.3f} ms  {extra}  {row.get('kernel', '')}")
PY
