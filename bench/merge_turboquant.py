"""Merges flashtq's and PyTorch's TurboQuant-benchmark JSON (one run, one GPU) and computes the ratios.

merge_turboquant.py FLASHTQ.json TORCH.json COMMIT  -> merged JSON on stdout
merge_turboquant.py --table MERGED.json            -> a table
"""
import json
import platform
import subprocess
import sys


def merge(flashtq_path, torch_path, commit):
    f = json.load(open(flashtq_path))
    t = json.load(open(torch_path))
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    out = {"machine": {"gpu": gpu, "host": platform.node()}, "commit": commit, "torch": t["torch"],
           "copy_bandwidth_gbs": f["copy_bandwidth_gbs"], "decode": [], "prefill": []}
    sdpa_decode = {(r["batch"], r["ctx"]): r for r in t["decode"]}
    # flashtq's own bf16 decode of each shape, shown beside the peers (not one of the bar's bf16 rows).
    for r in f.get("dense_decode", []):
        sdpa_decode[(r["batch"], r["ctx"])]["flashtq_bf16_ms"] = r["ms"]
    out["dense_decode"] = f.get("dense_decode", [])
    for ours in f["decode"]:  # every layout's decode beside SDPA's over bf16 of the same shape
        theirs = sdpa_decode[(ours["batch"], ours["ctx"])]
        row = dict(ours)
        row.update({k: v for k, v in theirs.items() if k not in row})
        # The fastest bf16 decode beside it: SDPA's flash and cuDNN backends, FlashInfer's bf16 pages where it ran.
        times = [theirs[k] for k in ("flash_ms", "cudnn_ms", "flashinfer_bf16_ms") if k in theirs]
        if times:
            row["best_bf16_ms"] = min(times)
            row["speedup_vs_best_bf16"] = min(times) / ours["ms"]
            # The bar for presets: the speed-up against the compression ratio.
            if "compression_vs_bf16" in ours:
                row["speedup_per_compression"] = row["speedup_vs_best_bf16"] / ours["compression_vs_bf16"]
        row["bf16_floor_ms"] = theirs["bf16_bytes"] / (f["copy_bandwidth_gbs"] * 1e9) * 1e3
        row["packed_floor_ms"] = ours["packed_bytes"] / (f["copy_bandwidth_gbs"] * 1e9) * 1e3
        out["decode"].append(row)
    sdpa_prefill = {r["chunk"]: r for r in t["prefill"]}
    for ours in f["prefill"]:  # every layout's chunk beside SDPA's over bf16 of the same shape
        theirs = sdpa_prefill.get(ours["chunk"], {})
        row = dict(ours)
        row.update({k: v for k, v in theirs.items() if k not in row})
        # The products of a chunk against the whole cache (Hq = 32, D = 128): 4 * chunk * ctx * 32 * 128 FLOPs.
        row["tflops"] = 4 * ours["chunk"] * ours["ctx"] * 32 * 128 / (ours["ms"] * 1e-3) / 1e12
        if "flash_ms" in theirs:
            row["speed_vs_flash"] = theirs["flash_ms"] / ours["ms"]
        if "cudnn_ms" in theirs:
            row["speed_vs_cudnn"] = theirs["cudnn_ms"] / ours["ms"]
        out["prefill"].append(row)
    return out


def num(x):
    """A number of the JSON, NaN where it held none (nlohmann writes a NaN as null)."""
    return float('nan') if x is None else x


def table(merged):
    print(f"{merged['machine']['gpu']}  commit {merged['commit']}  copy {merged['copy_bandwidth_gbs']:.0f} GB/s")
    nan = float('nan')
    print(f"{'layout':>8} {'vs bf16':>7} {'B':>3} {'ctx':>7} {'flashtq ms':>11} {'exact ms':>9} {'error':>8} "
          f"{'flash ms':>9} {'cudnn ms':>9} {'FI bf16':>8} {'FI fp8':>8} {'ftq bf16':>8} {'speedup':>8} {'/ratio':>6} "
          f"{'GB/s':>7}")
    for r in merged["decode"]:
        print(f"{r.get('layout', 'seed'):>8} {r.get('compression_vs_bf16', nan):>7.2f} {r['batch']:>3} "
              f"{r['ctx']:>7} {r['ms']:>11.4f} {r.get('exact_ms', nan):>9.4f} {num(r.get('error_vs_exact')):>8.1e} "
              f"{r.get('flash_ms', nan):>9.4f} {r.get('cudnn_ms', nan):>9.4f} {r.get('flashinfer_bf16_ms', nan):>8.4f} "
              f"{r.get('flashinfer_fp8_ms', nan):>8.4f} {r.get('flashtq_bf16_ms', nan):>8.4f} "
              f"{r.get('speedup_vs_best_bf16', nan):>8.2f} "
              f"{r.get('speedup_per_compression', nan):>6.2f} {r['gbs']:>7.0f}")
        for p in (16, 64):  # the same sequences in one pool of pages (issue 19: within 10 % of contiguous)
            if f"paged{p}_ms" in r:
                print(f"{'':>8} pages of {p}: {r[f'paged{p}_ms']:.4f} ms, {r[f'paged{p}_vs_contiguous']:.3f}x "
                      f"contiguous, error vs exact {num(r.get(f'paged{p}_error_vs_exact')):.1e}")
    for r in merged.get("dense_decode", []):
        best = [x for x in merged["decode"] if (x["batch"], x["ctx"]) == (r["batch"], r["ctx"])][:1]
        peers = {k: best[0][k] for k in ("flash_ms", "cudnn_ms", "flashinfer_bf16_ms", "flashinfer_bf16_page16_ms",
                                         "flashinfer_bf16_page64_shuffled_ms", "flashinfer_bf16_page16_shuffled_ms")
                 if best and k in best[0]}
        paged = ", ".join(f"pages of {p} {r[f'paged{p}_ms']:.4f} ms ({r[f'paged{p}_ms'] / r['ms']:.3f}x contiguous)"
                          for p in (16, 64) if f"paged{p}_ms" in r)
        print(f"dense bf16 decode B={r['batch']} ctx={r['ctx']}: flashtq {r['ms']:.4f} ms ({r['gbs']:.0f} GB/s, "
              f"floor {r['bytes'] / (merged['copy_bandwidth_gbs'] * 1e9) * 1e3:.4f} ms), {paged}; "
              + ", ".join(f"{k[:-3]} {v:.4f} ms ({v / r['ms']:.2f}x)" for k, v in peers.items()))
    for r in merged["prefill"]:
        print(f"prefill {r.get('layout', 'seed')} chunk {r['chunk']}: flashtq {r['ms']:.3f} ms "
              f"(exact path {r.get('exact_ms', nan):.3f} ms, error vs exact {num(r.get('error_vs_exact')):.1e}, "
              f"{r['tflops']:.0f} TFLOP/s), flash {r.get('flash_ms', nan):.3f} ms, cudnn {r.get('cudnn_ms', nan):.3f} ms, "
              f"speed vs flash {r.get('speed_vs_flash', nan):.3f}, vs cudnn {r.get('speed_vs_cudnn', nan):.3f}")


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(json.load(open(sys.argv[2])))
    else:
        print(json.dumps(merge(sys.argv[1], sys.argv[2], sys.argv[3]), indent=2))
