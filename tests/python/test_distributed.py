"""Ring attention (flashtq.distributed) in several processes over gloo on the cpu backend, against the oracle
(the reference backend) on the whole sequence in each process: outputs and gradients of every rank's shard."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashtq
from flashtq.distributed import ring_attention, shard, shard_positions

CASES = {
    # name: (world, B, S, H, Hkv, D, causal, window, zigzag, dtype, tolerance)
    "causal_zigzag": (2, 1, 64, 4, 2, 32, True, 0, True, torch.float32, 1e-4),
    "causal_window_zigzag_3_ranks": (3, 2, 48, 2, 1, 16, True, 11, True, torch.float32, 1e-4),
    "full_contiguous": (2, 1, 40, 2, 2, 64, False, 0, False, torch.float32, 1e-4),
    "band_contiguous_bf16": (2, 1, 64, 4, 4, 32, False, 9, False, torch.bfloat16, 3e-2),
}


def _relative(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()


def _worker(rank, world, init, seed, case, failures):
    torch.set_num_threads(1)
    flashtq.set_threads("cpu", 1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        _, B, S, H, Hkv, D, causal, window, zigzag, dtype, tol = CASES[case]
        g = torch.Generator().manual_seed(seed)
        q, k, v, dout = (torch.randn(B, S, h, D, generator=g).to(dtype) for h in (H, Hkv, Hkv, H))
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        want = flashtq.attention(*full, causal=causal, causal_offset=0, window=window, backend="reference")
        want.backward(dout)
        positions = shard_positions(S, world, rank, zigzag)
        local = [shard(t, positions).requires_grad_() for t in (q, k, v)]
        got = ring_attention(*local, positions=positions, causal=causal, window=window, backend="cpu")
        got.backward(shard(dout, positions))
        for name, x, y in (("out", got, want), ("dq", local[0].grad, full[0].grad), ("dk", local[1].grad, full[1].grad),
                           ("dv", local[2].grad, full[2].grad)):
            err = _relative(x.detach(), shard(y.detach(), positions))
            if not err <= tol:
                failures.put(f"{case} rank {rank}: {name} relative error {err:.3g} > {tol} (FLASHTQ_TEST_SEED={seed})")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("case", list(CASES))
def test_ring_attention_equals_the_oracle_on_the_whole_sequence(case, seed):
    world = CASES[case][0]
    failures = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, f"file://{os.path.join(tmp, 'rendezvous')}", seed, case, failures),
                 nprocs=world, join=True)
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    assert not errors, "\n".join(errors)


def test_shard_positions_and_bad_input():
    assert shard_positions(16, 2, 0) == [(0, 4), (12, 4)]
    assert shard_positions(16, 2, 1) == [(4, 4), (8, 4)]
    assert shard_positions(16, 4, 3, zigzag=False) == [(12, 4)]
    with pytest.raises(flashtq.FlashTQError, match="seq_len"):
        shard_positions(18, 2, 0)
    with pytest.raises(flashtq.FlashTQError, match="rank"):
        shard_positions(16, 2, 2)
    if not dist.is_initialized():
        with pytest.raises(flashtq.FlashTQError, match="group"):
            ring_attention(torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 1, 8))
