"""PyTorch's CPU scaled_dot_product_attention on the dense shapes of `flashtq bench` (B=1, H=8, S x S) and
on its decode shapes (one query, Hq = 32 over Hkv = 8, D = 128, a bf16 cache of ctx tokens), timed the same
way (median of 3 after a warm-up), with the same thread count. Prints JSON."""
import json
import sys
import time

import torch
import torch.nn.functional as F


def median_s(fn, repeats=3):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads()
    quick = len(sys.argv) > 2 and sys.argv[2] == "--quick"
    torch.set_num_threads(threads)
    rows = []
    for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        for D in (64, 128):
            for S in ((1024,) if quick else (1024, 4096)):
                q = torch.randn(1, 8, S, D, dtype=dtype, requires_grad=True)
                k = torch.randn_like(q, requires_grad=True)
                v = torch.randn_like(q, requires_grad=True)
                for causal in (False, True):
                    flops = 4 * 8 * S * S * D * (0.5 if causal else 1.0)
                    with torch.no_grad():
                        fwd = median_s(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    g = torch.randn_like(out)
                    bwd = median_s(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True), 1)
                    row = {"dtype": name, "D": D, "S": S, "causal": causal, "fwd_s": fwd, "fwd_gflops": flops / fwd / 1e9,
                           "bwd_s": bwd, "bwd_gflops": 2.5 * flops / bwd / 1e9}
                    print(row, file=sys.stderr)
                    rows.append(row)
    decode = []
    for ctx in ((4096,) if quick else (4096, 32768, 131072)):
        q = torch.randn(1, 32, 1, 128, dtype=torch.bfloat16)
        k = torch.randn(1, 8, ctx, 128, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        with torch.no_grad():
            s = median_s(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        row = {"ctx": ctx, "bf16_decode_s": s}
        print(row, file=sys.stderr)
        decode.append(row)
    print(json.dumps({"torch": torch.__version__, "threads": threads, "dense": rows, "decode": decode}, indent=2))


if __name__ == "__main__":
    main()
