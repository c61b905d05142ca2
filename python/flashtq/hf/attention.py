"""attn_implementation="flashtq": the attention function and mask function transformers calls."""
from __future__ import annotations

from typing import Optional

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import flashtq
from flashtq._errors import error

NAME = "flashtq"


def flashtq_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                 mask_function=None, attention_mask: Optional[torch.Tensor] = None, local_size: Optional[int] = None,
                 allow_is_causal_skip: bool = True, config=None, **kwargs):
    """No mask where flashtq computes the same from its own parameters: a causal (or bidirectional) layer,
    or a sliding-window one (window from the `sliding_window` argument), without padding. Anything else
    (padding, chunked attention, custom mask functions) is materialised as sdpa would, as a bool mask."""
    sliding = getattr(config, "sliding_window", None) if config is not None else None
    plain = local_size is None or local_size == sliding
    if allow_is_causal_skip and plain and (attention_mask is None or bool(attention_mask.all())):
        return None
    args = dict(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
                attention_mask=attention_mask, local_size=local_size, allow_is_causal_skip=False, **kwargs)
    if mask_function is not None:
        args["mask_function"] = mask_function
    return sdpa_mask(**args)


def flashtq_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                              scaling: Optional[float] = None, sliding_window: Optional[int] = None,
                              softcap: Optional[float] = None, is_causal: Optional[bool] = None, **kwargs):
    """query [B, H, Sq, D], key/value [B, Hkv, Sk, D] as transformers passes them; returns ([B, Sq, H, D], None)."""
    # gpt-oss passes its per-head sink logits as s_aux (SPEC §1.9); Gemma 2 its logit cap as softcap (§1.8).
    sinks = kwargs.pop("s_aux", None)
    softcap = float(softcap or 0.0)
    if kwargs.get("output_attentions"):
        raise error("output_attentions", "flashtq never materialises attention weights; use attn_implementation='eager'")
    window = int(sliding_window or 0)
    packed = getattr(key, "_flashtq_packed", None)
    if packed is not None:
        # Keys and values were appended to the packed cache by TurboQuantCache.update: attend there.
        if attention_mask is not None:
            raise error("attention_mask", "the TurboQuant cache attends causally over every appended token; padded "
                                          "batches are not supported (run sequences of one length, or one at a time)")
        out = packed.cache.attend(packed.layer, query.transpose(1, 2), window=window, scale=scaling, softcap=softcap,
                                  sinks=sinks)
        return out.to(query.dtype), None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    seed = 0
    if dropout > 0.0:
        seed = int(torch.randint(0, 2**32 - 1, (), dtype=torch.int64).item())  # fresh dropout decisions per call
    if attention_mask is not None:
        # A materialised mask already says causality and the window; bool True = visible, float = additive.
        mask = attention_mask[..., : k.shape[1]]
        out = flashtq.attention(q, k, v, mask=mask, scale=scaling, dropout_p=dropout, seed=seed, softcap=softcap,
                                sinks=sinks)
    else:
        out = flashtq.attention(q, k, v, causal=causal, window=window if causal else 0, scale=scaling,
                                dropout_p=dropout, seed=seed, softcap=softcap, sinks=sinks)
    return out, None


def _accept_our_name() -> None:
    """transformers 5.17 takes every attn_implementation whose name contains "flash" for a FlashAttention
    kernel and tries to import one when a model selects it; "flashtq" is not such a kernel, so the import is
    skipped for this name only (the one patch of transformers; pinned to 5.17.0)."""
    import transformers.modeling_utils as modeling_utils

    original = modeling_utils.lazy_import_flash_attention
    if getattr(original, "_flashtq", False):
        return

    def lazy_import_flash_attention(implementation, *args, **kwargs):
        if implementation is not None and implementation.split("|")[-1] == NAME:
            return None
        return original(implementation, *args, **kwargs)

    lazy_import_flash_attention._flashtq = True
    modeling_utils.lazy_import_flash_attention = lazy_import_flash_attention


def register() -> None:
    """Registers attn_implementation="flashtq" with transformers (idempotent)."""
    AttentionInterface.register(NAME, flashtq_attention_forward)
    AttentionMaskInterface.register(NAME, flashtq_mask)
    _accept_our_name()
