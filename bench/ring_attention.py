"""Context-parallel attention (flashtq.distributed.ring_attention): forward + backward time per step at N ranks,
against one rank running flashtq.attention over the whole sequence (scaling) and, where it imports, ring-flash-attn's
zigzag ring attention in the same run. One process per GPU (NCCL) or, without GPUs, per CPU process (gloo):

    torchrun --nproc-per-node N bench/ring_attention.py [--tokens 131072] [--heads 32] [--kv-heads 8] [--dim 128]

Rank 0 prints JSON (machine, commit, world size, times, fraction of ideal scaling) to stdout; redirect it to
bench/results/ring_attention-<commit>.json.
"""
import argparse
import json
import os
import platform
import subprocess
import time

import torch
import torch.distributed as dist

import flashtq
from flashtq.distributed import ring_attention, shard, shard_positions


def timed(step, device, repeats):
    step()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    return (time.perf_counter() - start) / repeats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if cuda else torch.float32
    S, H, Hkv, D = args.tokens, args.heads, args.kv_heads, args.dim
    pos = shard_positions(S, world, rank)
    g = torch.Generator(device=device).manual_seed(1)
    q, k, v, dout = (torch.randn(1, S // world, h, D, device=device, dtype=dtype, generator=g)
                     for h in (H, Hkv, Hkv, H))
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def ours():
        ring_attention(q, k, v, positions=pos, causal=True).backward(dout)

    rows = {"flashtq_ring_s": timed(ours, device, args.repeats)}
    try:  # ring-flash-attn (PyPI ring-flash-attn, needs flash-attn): [B, S, H, D] in the same zigzag order
        from ring_flash_attn import zigzag_ring_flash_attn_func

        def peer():
            zigzag_ring_flash_attn_func(q, k, v, causal=True).backward(dout)

        rows["ring_flash_attn_s"] = timed(peer, device, args.repeats)
    except ImportError as e:
        rows["ring_flash_attn_s"] = None
        rows["ring_flash_attn_missing"] = str(e)
    if rank == 0:  # one rank over the whole sequence: the scaling baseline
        full = [torch.randn(1, S, h, D, device=device, dtype=dtype, generator=g).requires_grad_() for h in (H, Hkv, Hkv)]
        full_dout = torch.randn(1, S, H, D, device=device, dtype=dtype, generator=g)

        def one():
            flashtq.attention(*full, causal=True, causal_offset=0).backward(full_dout)

        one()
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(args.repeats):
            one()
        if cuda:
            torch.cuda.synchronize(device)
        rows["one_rank_whole_sequence_s"] = (time.perf_counter() - start) / args.repeats
        rows["fraction_of_ideal_scaling"] = rows["one_rank_whole_sequence_s"] / (world * rows["flashtq_ring_s"])
        flops = 4 * S * S / 2 * H * D * 3.5  # causal: half the products; forward 2 GEMMs, backward 5
        rows["flashtq_ring_tflops_per_rank"] = flops / world / rows["flashtq_ring_s"] / 1e12
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        machine = torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine()
        print(json.dumps({"commit": commit, "machine": machine, "world": world, "backend": dist.get_backend(),
                          "tokens": S, "heads": H, "kv_heads": Hkv, "dim": D, "dtype": str(dtype), "causal": True,
                          **rows}, indent=2))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
