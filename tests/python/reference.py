"""Attention in float64 torch ops, from SPEC §1's definitions: the oracle the tests hold flashtq to."""
import torch


def attention(q, k, v, causal=False, causal_offset=None, window=0, mask=None, scale=None, softcap=0.0, sinks=None):
    """q [B, Sq, H, D], k/v [B, Sk, Hkv, D] (bshd); returns (out [B, Sq, H, D], lse [B, H, Sq]) in float64.
    softcap (SPEC §1.8) caps the scaled products before the mask; sinks [H] (§1.9) is one more logit per head."""
    q, k, v = q.double(), k.double(), v.double()
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // Hkv, dim=2)
    v = v.repeat_interleave(H // Hkv, dim=2)
    scale = D ** -0.5 if scale is None else scale
    offset = Sk - Sq if causal_offset is None else causal_offset
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = s + mask.double()
    i = torch.arange(Sq, device=q.device)[:, None] + offset
    j = torch.arange(Sk, device=q.device)[None, :]
    visible = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if causal:
        visible &= j <= i
    if window:
        visible &= (i - j).abs() < window
    s = s.masked_fill(~visible, float("-inf"))
    s = s.masked_fill(s <= -1e30, float("-inf"))
    if sinks is not None:  # a column of logits with no value
        s = torch.cat([s, sinks.double().view(1, H, 1, 1).expand(B, H, Sq, 1)], dim=-1)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    out = torch.einsum("bhqk,bkhd->bqhd", p[..., :Sk] / torch.where(l == 0, torch.ones_like(l), l), v)
    lse = (m + torch.log(l)).squeeze(-1)
    return out, lse


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def floored_rel_err(a, b, floor: float) -> float:
    """rel_err with its denominator at least `floor`: the size below which a sum that cancels is compared absolutely."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / max(float(b.norm()), floor))


def grad_rel_err(a, b, scale: float, head_dim: int) -> float:
    """rel_err for a gradient, its denominator at least 0.1 * scale * D * sqrt(n) (docs/spec.md §3's choice, as the
    C++ suite: inputs are N(0, 1), so a gradient's natural size is about scale * D; one that cancels to nearly zero,
    as dq of a row whose softmax has a single key, is compared at that scale, not to its own vanishing norm)."""
    return floored_rel_err(a, b, 0.1 * scale * head_dim * b.numel() ** 0.5)


def sinks_grad_rel_err(a, b, rows: int) -> float:
    """rel_err for the sinks' gradient, its denominator at least 0.1 * sqrt(rows) (the C++ suite's floor,
    src/conformance/dense_checks.cpp): each head's dsink sums -P_sink * D_i over the batch's `rows` query rows, terms
    of either sign, so its natural size is about sqrt(rows); one that cancels to nearly zero is compared at that
    scale, not to its own vanishing norm."""
    return floored_rel_err(a, b, 0.1 * rows ** 0.5)
