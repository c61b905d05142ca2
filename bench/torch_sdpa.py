"""PyTorch SDPA baselines over a bf16 cache of the same shapes as bench/cuda_turboquant (same run, same GPU).

Prints JSON. Decode: q [B, 32, 1, 128], k/v [B, 8, ctx, 128] bf16 with enable_gqa. Prefill: a chunk of
queries against a 32k cache (not causal: PyTorch aligns is_causal top-left, and only the chunk's own
last keys would be masked bottom-right).
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_timing import median_ms


def run(backend, q, k, v):
    """Median ms of one SDPA call, eager and replayed from a captured CUDA graph."""
    with sdpa_kernel([backend]):
        eager = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return min(eager, median_ms(graph.replay)), eager


def main():
    torch.manual_seed(0)
    report = {"torch": torch.__version__, "decode": [], "prefill": []}
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}

    def measure(row, q, k, v):
        for name, b in backends.items():
            try:
                row[name + "_ms"], row[name + "_eager_ms"] = run(b, q, k, v)
            except RuntimeError as e:
                row[name + "_error"] = str(e).splitlines()[0][:200]
        print(row, file=sys.stderr)
        return row

    for batch, ctx in [(1, 32768), (1, 131072), (8, 32768), (32, 8192)]:
        q = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, 8, ctx, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        report["decode"].append(measure({"batch": batch, "ctx": ctx, "bf16_bytes": 2 * k.numel() * 2}, q, k, v))
        del q, k, v
    k = torch.randn(1, 8, 32768, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    for chunk in (512, 2048):
        q = torch.randn(1, 32, chunk, 128, device="cuda", dtype=torch.bfloat16)
        report["prefill"].append(measure({"ctx": 32768, "chunk": chunk}, q, k, v))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
