"""Context-parallel dense attention over a torch.distributed process group (ring attention).

Each rank holds a shard of one long sequence: its queries, keys and values for the tokens it owns, given by
`shard_positions` (the load-balanced "zigzag" order by default: of 2N equal chunks, rank r owns chunks r and
2N - 1 - r, so under a causal mask every rank does the same work). Keys and values travel around the ring, one
neighbour's block per step, the next block's transfer posted before the current block is attended; each block's
partial output is merged into the running one by its log-sum-exp. The backward sends each block's dK and dV
around with it, so they arrive back at their owner after N steps. Every position-based feature (causal with
offset, window) uses global positions: a pair of local and visiting chunks is attended with
causal_offset = (query chunk's first position) - (key chunk's first position), which is spec §1's rule in global
positions. The attention itself is flashtq's (any backend); communication is torch.distributed's (NCCL on GPUs,
gloo on CPUs).

Not here yet (docs/python.md says so): dropout (its hash uses the row index within the local Sq, so global
decisions need a row offset in the kernels' API), sinks, masks and ragged batches; the TurboQuant cache split
across ranks.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from ._errors import error
from .ops import _backward

Segments = list[tuple[int, int]]  # (first global position, length) of each run of a rank's tokens, in local order


def shard_positions(seq_len: int, world_size: int, rank: int, zigzag: bool = True) -> Segments:
    """The global positions rank `rank` owns: zigzag, chunks r and 2N - 1 - r of 2N (seq_len a multiple of 2N);
    else the r-th of N contiguous chunks (seq_len a multiple of N)."""
    parts = 2 * world_size if zigzag else world_size
    if seq_len <= 0 or seq_len % parts != 0:
        raise error("seq_len", f"must be a positive multiple of {parts} ({'2 x ' if zigzag else ''}world size), "
                    f"got {seq_len}")
    if not 0 <= rank < world_size:
        raise error("rank", f"must be in [0, {world_size}), got {rank}")
    c = seq_len // parts
    if not zigzag:
        return [(rank * c, c)]
    return [(rank * c, c), ((parts - 1 - rank) * c, c)]


def shard(x: Tensor, segments: Segments, dim: int = 1) -> Tensor:
    """The rows of a whole-sequence tensor that `segments` names, in local order (a copy)."""
    return torch.cat([x.narrow(dim, start, length) for start, length in segments], dim=dim).contiguous()


def _visible(q_seg: tuple[int, int], k_seg: tuple[int, int], causal: bool, window: int) -> bool:
    """Whether any key of k_seg is visible to any query of q_seg (global positions)."""
    (qs, ql), (ks, kl) = q_seg, k_seg
    if causal and ks > qs + ql - 1:
        return False
    if window > 0:
        nearest = 0 if (ks <= qs + ql - 1 and qs <= ks + kl - 1) else min(abs(ks - (qs + ql - 1)), abs(qs - (ks + kl - 1)))
        if nearest >= window:
            return False
    return True


def _pairs(q_segments: Segments, k_segments: Segments, causal: bool, window: int):
    """(local query rows, local key rows, causal_offset) for each pair of segments with a visible key."""
    q0 = 0
    for qs, ql in q_segments:
        k0 = 0
        for ks, kl in k_segments:
            if _visible((qs, ql), (ks, kl), causal, window):
                yield slice(q0, q0 + ql), slice(k0, k0 + kl), qs - ks
            k0 += kl
        q0 += ql


def _merge(out: Tensor, lse: Tensor, part: Tensor, part_lse: Tensor) -> None:
    """out, lse (f32, [B, S, H, D] and [B, H, S]) := the softmax-weighted union of themselves and a part. Rows
    where both are empty (lse -inf) stay 0 and -inf."""
    new = torch.logaddexp(lse, part_lse)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    a = torch.exp(lse - safe).transpose(1, 2).unsqueeze(-1)
    b = torch.exp(part_lse - safe).transpose(1, 2).unsqueeze(-1)
    out.mul_(a).add_(part.float() * b)
    lse.copy_(new)


class _Ring:
    """One ring exchange: post the sends of `tensors` to the next rank and receives from the previous one."""

    def __init__(self, group, tensors: Sequence[Tensor]):
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        nxt = dist.get_global_rank(group, (rank + 1) % size) if group is not None else (rank + 1) % size
        prv = dist.get_global_rank(group, (rank - 1) % size) if group is not None else (rank - 1) % size
        self.received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, nxt, group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, prv, group) for t in self.received]
        self.requests = dist.batch_isend_irecv(ops)

    def wait(self) -> list[Tensor]:
        for r in self.requests:
            r.wait()
        return self.received


class _RingAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, segments, group, causal, window, scale, softcap, backend):
        size = dist.get_world_size(group)
        rank = dist.get_rank(group)
        everyone = [None] * size
        dist.all_gather_object(everyone, segments, group=group)  # which positions each rank's block holds
        B, S, H, D = q.shape
        out = torch.zeros((B, S, H, D), dtype=torch.float32, device=q.device)
        lse = torch.full((B, H, S), -math.inf, dtype=torch.float32, device=q.device)
        block = [k, v]
        for step in range(size):
            owner = (rank - step) % size
            ring = _Ring(group, block) if step + 1 < size else None  # the next block's transfer runs meanwhile
            kb, vb = block
            for rows, keys, offset in _pairs(segments, everyone[owner], causal, window):
                part, part_lse = torch.ops.flashtq.attention_forward(
                    q[:, rows], kb[:, keys], vb[:, keys], None, scale, causal, offset, window, 0.0, 0, softcap, None,
                    None, None, 0, 0, False, backend)
                _merge(out[:, rows], lse[:, :, rows], part, part_lse)
            if ring is not None:
                block = ring.wait()
        out = out.to(q.dtype)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (segments, everyone, group, causal, window, scale, softcap, backend)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):  # lse is not differentiable (mark_non_differentiable)
        q, k, v, out, lse = ctx.saved_tensors
        segments, everyone, group, causal, window, scale, softcap, backend = ctx.args
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        # The block in hand and its dK, dV so far travel together; after N passes they are home.
        block = [k, v, torch.zeros(k.shape, dtype=torch.float32, device=k.device),
                 torch.zeros(v.shape, dtype=torch.float32, device=v.device)]
        for step in range(size):
            owner = (rank - step) % size
            ring = _Ring(group, block[:2]) if step + 1 < size else None  # K, V run ahead; dK, dV follow the work
            kb, vb, dkb, dvb = block
            for rows, keys, offset in _pairs(segments, everyone[owner], causal, window):
                gq, gk, gv, _ = _backward(q[:, rows].contiguous(), kb[:, keys].contiguous(), vb[:, keys].contiguous(),
                                          out[:, rows].contiguous(), dout[:, rows].contiguous(),
                                          lse[:, :, rows].contiguous(), None, scale, causal, offset, window, 0.0, 0,
                                          softcap, None, None, None, 0, 0, backend)
                dq[:, rows] += gq.float()
                dkb[:, keys] += gk.float()
                dvb[:, keys] += gv.float()
            grads = _Ring(group, [dkb, dvb]).wait()  # to the next rank, which holds this block next
            block = (ring.wait() if ring is not None else [kb, vb]) + grads
        dk, dv = block[2], block[3]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, group: Optional[dist.ProcessGroup] = None, *,
                   positions: Optional[Segments] = None, causal: bool = True, window: int = 0,
                   scale: Optional[float] = None, softcap: float = 0.0, return_lse: bool = False,
                   backend: Optional[str] = None):
    """Attention of this rank's queries over every rank's keys and values (one sequence split across the group).

    q [B, S_local, H, D], k/v [B, S_local, Hkv, D] ("bshd"), the rows of the global positions `positions`
    ((start, length) runs in local order; default: the zigzag shard of a sequence of S_local x world size
    tokens, shard_positions). Every rank must pass the same B, H, Hkv, D, dtype and options. Returns out
    [B, S_local, H, D] (and lse [B, H, S_local], f32, with return_lse=True); differentiable in q, k and v.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise error("group", "torch.distributed must be initialised (init_process_group) before ring_attention")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise error(name, "must be a 4-D tensor [B, S_local, heads, D]")
    if k.shape != v.shape or k.shape[1] != q.shape[1] or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise error("k", f"must be [B, S_local, Hkv, D] like v with q's B, S_local and D: q {tuple(q.shape)}, "
                    f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise error("window", f"must be a non-negative integer, got {window!r}")
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if positions is None:
        positions = shard_positions(q.shape[1] * size, size, rank)
    positions = [(int(s), int(n)) for s, n in positions]
    if sum(n for _, n in positions) != q.shape[1] or any(s < 0 or n <= 0 for s, n in positions):
        raise error("positions", f"must be (start >= 0, length > 0) runs covering q's {q.shape[1]} rows, got "
                    f"{positions}")
    out, lse = _RingAttention.apply(q, k, v, positions, group, bool(causal), window,
                                    None if scale is None else float(scale), float(softcap), backend or "")
    return (out, lse) if return_lse else out
