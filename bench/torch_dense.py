"""PyTorch SDPA dense baselines for bench/cuda_dense (same shapes, same run): flash, cuDNN and efficient
backends, forward (and bf16 backward), plus the GPU's bf16 matrix peak (8192^3 matmul); then the shape rows
(head_dim 64, 256, 512 and GQA, bf16) in bench/cuda_dense.cpp's order. A backend that cannot run a shape
records why (its error's first line)."""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_timing import median_ms


def sampled_error(q, k, v, out, causal):
    """||out - ref|| / ||ref|| over the rows bench/cuda_dense.cpp samples (batch 0, heads 0 and 1, 32 rows
    spread over S), against attention in float64."""
    S, D = q.shape[2], q.shape[3]
    rows = torch.tensor([(S - 1) * t // 31 for t in range(32)], device=q.device)
    num = den = 0.0
    for h in range(2):
        qh, kh, vh = (x[0, h].detach().double() for x in (q, k, v))
        w = (qh[rows] @ kh.T) / D**0.5
        if causal:
            w = w.masked_fill(torch.arange(S, device=q.device)[None, :] > rows[:, None], float("-inf"))
        ref = torch.softmax(w, dim=-1) @ vh
        num += ((out[0, h, rows].double() - ref) ** 2).sum().item()
        den += (ref**2).sum().item()
    return (num / den) ** 0.5


# bench/cuda_dense.cpp's kShapeRows: (B, S, Hq, Hkv, D, repeats).
SHAPE_ROWS = [(4, 4096, 16, 16, 64, 20), (4, 4096, 16, 16, 256, 20), (16, 1024, 16, 16, 512, 3),
              (4, 4096, 32, 8, 128, 20)]


def shape_rows(backends):
    rows = []
    for B, S, Hq, Hkv, D, repeats in SHAPE_ROWS:
        q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn_like(k, requires_grad=True)
        for causal in (False, True):
            row = {"dtype": "bf16", "B": B, "S": S, "Hq": Hq, "Hkv": Hkv, "D": D, "causal": causal}
            for name, be in backends.items():
                try:
                    with sdpa_kernel([be]):
                        def fwd():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv)
                        row[name + "_fwd_ms"] = median_ms(fwd, repeats=repeats)
                        out = fwd()
                        g = torch.randn_like(out)
                        row[name + "_bwd_ms"] = median_ms(
                            lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True), repeats=repeats)
                except RuntimeError as e:
                    row[name + "_error"] = str(e).splitlines()[0][:160]
            rows.append(row)
            print(row, file=sys.stderr)
    return rows


def main():
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = median_ms(lambda: x @ x)
    report = {"torch": torch.__version__, "bf16_matmul_tflops": 2 * 8192**3 / (mm_ms * 1e-3) / 1e12, "forward": []}
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    if len(sys.argv) > 1:  # e.g. `torch_dense.py f32`: those dtypes only (quick comparisons while tuning)
        dtypes = {k: v for k, v in dtypes.items() if k in sys.argv[1:]}
    if sys.argv[1:] in ([], ["shapes"]):  # `torch_dense.py shapes`: the shape rows alone
        report["shapes"] = shape_rows(backends)
    for dname, dt in dtypes.items():
        for S in (1024, 4096, 16384):
            B = 16384 // S
            q = torch.randn(B, 16, S, 128, device="cuda", dtype=dt, requires_grad=True)
            k = torch.randn_like(q, requires_grad=True)
            v = torch.randn_like(q, requires_grad=True)
            for causal in (False, True):
                flops = 4 * B * 16 * S * S * 128 * (0.5 if causal else 1.0)
                row = {"dtype": dname, "S": S, "B": B, "causal": causal}
                for name, be in backends.items():
                    try:
                        with sdpa_kernel([be]):
                            ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                            row[name + "_fwd_ms"] = ms
                            row[name + "_fwd_tflops"] = flops / (ms * 1e-3) / 1e12
                            if dname == "f32":
                                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                                row[name + "_rel_error"] = sampled_error(q, k, v, out, causal)
                            if dname == "bf16":
                                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                                g = torch.randn_like(out)
                                bms = median_ms(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True))
                                row[name + "_bwd_ms"] = bms
                    except RuntimeError as e:
                        row[name + "_error"] = str(e).splitlines()[0][:160]
                report["forward"].append(row)
                print(row, file=sys.stderr)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
