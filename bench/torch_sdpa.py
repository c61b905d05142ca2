"""PyTorch SDPA baselines over a bf16 cache of the same shapes as bench/cuda_turboquant (same run, same GPU).

Prints JSON. Decode: q [B, 32, 1, 128], k/v [B, 8, ctx, 128] bf16 with enable_gqa, L2 flushed before each call;
and, where the flashinfer package imports (../shared/peers), FlashInfer's paged decode over the same keys in bf16 and
fp8-e4m3 pages. Prefill: a chunk of
queries against a 32k cache (not causal: PyTorch aligns is_causal top-left, and only the chunk's own
last keys would be masked bottom-right).
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_timing import median_ms


def run(backend, q, k, v, cold):
    """Median ms of one SDPA call, eager and replayed from a captured CUDA graph (cold: L2 flushed before each)."""
    with sdpa_kernel([backend]):
        eager = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), cold=cold)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return min(eager, median_ms(graph.replay, cold=cold)), eager


def flashinfer_decode(q, k, v, kv_dtype, page=64, shuffled=False):
    """Median ms of FlashInfer's paged decode (tensor cores) over k, v in pages of `page` timesteps, cast to
    kv_dtype (bf16, or fp8-e4m3 with unit scales), L2 flushed before each call; None where FlashInfer is absent.
    The sequences' pages follow each other in the pool, or (shuffled) lie in a random order of it, as
    bench/cuda_turboquant's paged rows of flashtq do."""
    try:
        import flashinfer
    except ImportError:
        return None
    batch, hkv, ctx, dim = k.shape
    pages = ctx // page
    def paged(x):
        return x.transpose(1, 2).reshape(batch * pages, page, hkv, dim).to(kv_dtype).contiguous()
    k_pages, v_pages = paged(k), paged(v)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    indptr = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * pages
    indices = torch.arange(0, batch * pages, dtype=torch.int32, device="cuda")
    if shuffled:
        indices = torch.randperm(batch * pages, device="cuda").to(torch.int32)
    last = torch.full((batch,), page, dtype=torch.int32, device="cuda")
    wrapper.plan(indptr, indices, last, q.shape[1], hkv, dim, page, q_data_type=torch.bfloat16, kv_data_type=kv_dtype)
    q3 = q[:, :, 0, :].contiguous()
    return median_ms(lambda: wrapper.run(q3, (k_pages, v_pages)), cold=True)


def main():
    torch.manual_seed(0)
    report = {"torch": torch.__version__, "decode": [], "prefill": []}
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}

    def measure(row, q, k, v, cold=False):
        for name, b in backends.items():
            try:
                row[name + "_ms"], row[name + "_eager_ms"] = run(b, q, k, v, cold)
            except RuntimeError as e:
                row[name + "_error"] = str(e).splitlines()[0][:200]
        print(row, file=sys.stderr)
        return row

    for batch, ctx in [(1, 32768), (1, 131072), (8, 32768), (32, 8192)]:
        q = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, 8, ctx, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        row = {"batch": batch, "ctx": ctx, "bf16_bytes": 2 * k.numel() * 2, "l2_flushed": True}
        for name, dtype, page, shuffled in (
                ("flashinfer_bf16", torch.bfloat16, 64, False), ("flashinfer_fp8", torch.float8_e4m3fn, 64, False),
                ("flashinfer_bf16_page16", torch.bfloat16, 16, False),
                ("flashinfer_bf16_page64_shuffled", torch.bfloat16, 64, True),
                ("flashinfer_bf16_page16_shuffled", torch.bfloat16, 16, True)):
            try:
                ms = flashinfer_decode(q, k, v, dtype, page, shuffled)
                if ms is not None:
                    row[name + "_ms"] = ms
            except Exception as e:  # a peer that does not run here is reported, not fatal
                row[name + "_error"] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        report["decode"].append(measure(row, q, k, v, cold=True))
        del q, k, v
    k = torch.randn(1, 8, 32768, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    for chunk in (512, 2048):
        q = torch.randn(1, 32, chunk, 128, device="cuda", dtype=torch.bfloat16)
        report["prefill"].append(measure({"ctx": 32768, "chunk": chunk}, q, k, v))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
