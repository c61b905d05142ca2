"""Outside baselines for the evaluation only (not the library): what a user could pick instead of TurboQuant,
applied as quantize-then-dequantize of the keys and values a model writes into its cache, attention exact.

rtn<b>:   per-token round-to-nearest, b bits per coordinate, one f16 scale and one f16 zero point per
          (token, kv head) vector, for keys and values alike.
kivi<b>:  KIVI-style (Liu et al. 2024): keys per channel over groups of 32 consecutive tokens, values per token
          over groups of 32 channels, b bits, an f16 scale and zero point per group; a trailing key group of
          fewer than 32 tokens stays exact until it fills (KIVI's full-precision residual).
Bytes per token and kv head count the codes and the f16 scales and zero points.
"""
from __future__ import annotations

import re

import torch
from transformers.cache_utils import DynamicCache

GROUP = 32
_NAME = re.compile(r"^(rtn|kivi)([1-8])$")


def is_baseline(name: str) -> bool:
    return bool(_NAME.match(name))


def _parse(name: str) -> tuple[str, int]:
    m = _NAME.match(name)
    if not m:
        raise ValueError(f"flashtq: argument 'config': unknown baseline {name!r} (rtn<b> or kivi<b>, b in 1..8)")
    return m.group(1), int(m.group(2))


def bytes_per_token_per_head(name: str, head_dim: int) -> float:
    kind, bits = _parse(name)
    codes = head_dim * bits / 8
    if kind == "rtn":
        return 2 * (codes + 4)  # keys and values: codes + f16 scale + f16 zero per vector
    return 2 * (codes + 4 * head_dim / GROUP)  # a scale and a zero per group of 32 (tokens for keys, channels for values)


def quantize(x: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """x rounded to 2^bits levels between its minimum and maximum along `dim` (asymmetric, f16 scale and zero)."""
    xf = x.float()
    lo = xf.amin(dim=dim, keepdim=True).half().float()
    hi = xf.amax(dim=dim, keepdim=True)
    scale = ((hi - lo) / (2 ** bits - 1)).half().float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round((xf - lo) / safe), 0, 2 ** bits - 1)
    return torch.where(scale > 0, q * safe + lo, lo).to(x.dtype)


def keys_per_channel(k: torch.Tensor, bits: int, group: int = GROUP) -> torch.Tensor:
    """k [B, H, S, D]: full groups of `group` tokens quantized per channel; the trailing partial group exact."""
    B, H, S, D = k.shape
    full = S // group * group
    out = k.clone()
    if full:
        g = k[:, :, :full].reshape(B, H, full // group, group, D)
        out[:, :, :full] = quantize(g, bits, dim=3).reshape(B, H, full, D)
    return out


def values_per_token(v: torch.Tensor, bits: int) -> torch.Tensor:
    """v [B, H, S, D] with D a multiple of GROUP: each token's groups of GROUP channels quantized."""
    B, H, S, D = v.shape
    return quantize(v.reshape(B, H, S, D // GROUP, GROUP), bits, dim=4).reshape(B, H, S, D)


class BaselineCache(DynamicCache):
    """A DynamicCache that stores the keys and values of each update as a baseline quantizer returns them."""

    def __init__(self, model_config, name: str):
        super().__init__(config=model_config)
        self.kind, self.bits = _parse(name)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self.kind == "rtn":
            k, v = quantize(key_states, self.bits, dim=-1), quantize(value_states, self.bits, dim=-1)
            return super().update(k, v, layer_idx, *args, **kwargs)
        # KIVI streams: the cache holds exact keys, and the keys attention sees are re-derived from all of them,
        # so groups are aligned from the first token whatever the chunks, each full group is quantized, and the
        # group still filling stays exact (KIVI's residual); values are quantized per token as they come.
        keys, values = super().update(key_states, values_per_token(value_states, self.bits), layer_idx, *args, **kwargs)
        return keys_per_channel(keys, self.bits), values
