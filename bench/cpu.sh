#!/usr/bin/env bash
# The CPU benchmark: flashtq's cpu backend and, where bench/setup_torch_cpu.sh has installed it,
# PyTorch's CPU SDPA, in one run on this machine; JSON into bench/results/cpu-<commit>.json.
# Usage: bench/cpu.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
flashtq=build/release/tools/flashtq/flashtq
threads=$(nproc)
commit=$(git rev-parse --short HEAD)
out=bench/results/cpu-$commit.json
torch_json=""
python=build/torch-venv/bin/python
[ -x "$python" ] || python=build/venv/bin/python  # the venv `make test` makes, with its pinned torch
if [ -x "$python" ] && "$python" -c 'import torch' 2>/dev/null; then
  torch_json=$(mktemp)
  "$python" bench/torch_cpu_sdpa.py "$threads" "${1:-}" > "$torch_json"
else
  echo "cpu.sh: PyTorch is not installed (run bench/setup_torch_cpu.sh); measuring flashtq alone" >&2
fi
"$flashtq" bench ${1:-} --threads "$threads" --output "$out.tmp" ${torch_json:+--torch-json "$torch_json"} > /dev/null
python3 - "$out.tmp" "$commit" > "$out" <<'PY'
import json, platform, subprocess, sys
r = json.load(open(sys.argv[1]))
cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
gxx = subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
r["machine"] = {"cpu": cpu, "cores": len([l for l in open("/proc/cpuinfo") if l.startswith("processor")]), "compiler": gxx}
r["commit"] = sys.argv[2]
if "torch" in r:
    by_shape = {(t["dtype"], t["D"], t["S"], t["causal"]): t for t in r["torch"]["dense"]}
    for row in r["dense"]:
        t = by_shape.get((row["dtype"], row["D"], row["S"], row["causal"]))
        if t:
            row["torch_fwd_s"] = t["fwd_s"]
            row["fwd_speed_vs_torch"] = t["fwd_s"] / row["fwd_s"]
            row["torch_bwd_s"] = t["bwd_s"]
    by_ctx = {t["ctx"]: t for t in r["torch"].get("decode", [])}
    for row in r["decode"]:
        t = by_ctx.get(row["ctx"])
        if t:
            row["torch_bf16_decode_s"] = t["bf16_decode_s"]
            row["speedup_vs_torch_bf16"] = t["bf16_decode_s"] / row["turboquant_s"]
print(json.dumps(r, indent=2))
PY
rm -f "$out.tmp"
python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['machine']['cpu']}, {r['threads']} threads, {r['backend']}: FMA peak {r['fma_peak_gflops']:.0f} GFLOP/s, copy {r['copy_bandwidth_gbs']:.1f} GB/s")
for d in r["dense"]:
    print(f"{d['dtype']:>4} D={d['D']:>3} S={d['S']:>5} causal={d['causal']!s:>5}: fwd {d['fwd_gflops']:6.1f} GFLOP/s "
          f"({100 * d['fwd_fraction_of_peak']:4.1f}% of peak) vs torch x{d.get('fwd_speed_vs_torch', float('nan')):.2f}; "
          f"bwd {d.get('bwd_gflops', float('nan')):6.1f} GFLOP/s")
for d in r["decode"]:
    torch_part = (f", torch bf16 {d['torch_bf16_decode_s'] * 1e3:8.2f} ms, x{d['speedup_vs_torch_bf16']:.2f}"
                  if "torch_bf16_decode_s" in d else "")
    print(f"decode ctx={d['ctx']:>6} {d.get('preset', 'seed'):>8} ({d.get('kernel', '?')}): dense f16 "
          f"{d['dense_f16_s'] * 1e3:8.2f} ms, turboquant {d['turboquant_s'] * 1e3:8.2f} ms, x{d['speedup']:.2f}{torch_part}")
PY
