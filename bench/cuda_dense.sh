#!/usr/bin/env bash
# Runs on the GPU machine: flashtq's dense CUDA kernels and PyTorch SDPA, one run, one GPU, merged into
# bench/results/cuda_dense-<commit>.json (or $1). COMMIT names the commit when .git is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/release/bench/cuda_dense_bench
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
out=${1:-bench/results/cuda_dense-$commit.json}
tmp=$(mktemp -d)
# SHAPES=1: the shape rows alone (head_dim 64, 256, 512 and GQA).
"$bin" ${SHAPES:+--shapes} > "$tmp/flashtq.json"
python3 bench/torch_dense.py ${SHAPES:+shapes} > "$tmp/torch.json"
python3 - "$tmp/flashtq.json" "$tmp/torch.json" "$commit" > "$out" <<'PY'
import json, subprocess, sys
f, t = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
def beside(ours, theirs):
    row = dict(ours); row.update({k: v for k, v in theirs.items() if k not in row})
    for name in ("flash", "cudnn", "efficient"):
        if name + "_fwd_ms" in theirs:
            row["ratio_vs_" + name] = theirs[name + "_fwd_ms"] / ours["fwd_ms"]
        for variant in ("tf32", "pedantic"):
            if name + "_fwd_ms" in theirs and variant + "_fwd_ms" in ours:
                row[variant + "_ratio_vs_" + name] = theirs[name + "_fwd_ms"] / ours[variant + "_fwd_ms"]
        if name + "_bwd_ms" in theirs and "bwd_ms" in ours:
            row["bwd_ratio_vs_" + name] = theirs[name + "_bwd_ms"] / ours["bwd_ms"]
    row["fraction_of_bf16_peak"] = ours["fwd_tflops"] / t["bf16_matmul_tflops"]
    return row
rows = [beside(ours, theirs) for ours, theirs in zip(f.get("forward", []), t.get("forward", []))]
shapes = [beside(ours, theirs) for ours, theirs in zip(f.get("shapes", []), t.get("shapes", []))]
print(json.dumps({"machine": {"gpu": gpu}, "commit": sys.argv[3], "torch": t["torch"],
                  "bf16_matmul_tflops": t["bf16_matmul_tflops"], "forward": rows, "shapes": shapes}, indent=2))
PY
python3 - "$out" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{d['machine']['gpu']} commit {d['commit']} bf16 matmul {d['bf16_matmul_tflops']:.0f} TFLOP/s")
for r in d["shapes"]:
    peers = "  ".join(f"{n} {r[n + '_fwd_ms']:.3f}/{r[n + '_bwd_ms']:.3f}" if n + "_fwd_ms" in r else f"{n}: {r.get(n + '_error', '')[:60]}"
                      for n in ("flash", "cudnn", "efficient"))
    print(f"bf16 B={r['B']} S={r['S']} Hq={r['Hq']} Hkv={r['Hkv']} D={r['D']} causal={r['causal']!s:>5} "
          f"flashtq {r['fwd_ms']:.3f}/{r['bwd_ms']:.3f} ms ({r['fwd_tflops']:.0f}/{r['bwd_tflops']:.0f} TF/s, "
          f"{r['fwd_kernel']}/{r['bwd_kernel']})  {peers}")
for r in d["forward"]:
    print(f"{r['dtype']:>4} S={r['S']:>5} causal={r['causal']!s:>5} flashtq {r['fwd_ms']:9.3f} ms {r['fwd_tflops']:7.2f} TF/s  "
          f"flash {r.get('flash_fwd_ms', float('nan')):.3f}  cudnn {r.get('cudnn_fwd_ms', float('nan')):.3f}  "
          f"eff {r.get('efficient_fwd_ms', float('nan')):.3f}  bwd {r.get('bwd_ms', float('nan')):.3f} vs flash {r.get('flash_bwd_ms', float('nan')):.3f} "
          f"cudnn {r.get('cudnn_bwd_ms', float('nan')):.3f}"
          + (f"\n     error {r['rel_error']:.1e} (efficient {r.get('efficient_rel_error', float('nan')):.1e})"
             f"  pedantic {r['pedantic_fwd_ms']:.3f} ms (error {r['pedantic_rel_error']:.1e})"
             f"  tf32 {r['tf32_fwd_ms']:.3f} ms (error {r['tf32_rel_error']:.1e})" if "tf32_fwd_ms" in r else ""))
PY
