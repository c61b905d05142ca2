"""flashtq.hf.TurboQuantCache: a transformers Cache whose layers live in flashtq's packed words.

update() encodes the new keys and values into the packed cache and returns only those new rows, marked
so that attn_implementation="flashtq" attends over the packed words of that layer (fused: the context is
never decoded into a dense copy). Sliding-window layers (Gemma 3) keep every token and attend within
their window.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from flashtq._errors import error
from flashtq.cache import TurboQuantConfig, resolve_config
from flashtq.cache import TurboQuantCache as PackedCache
from flashtq.hf.attention import NAME


@dataclass(frozen=True)
class _Packed:
    """What a marked key tensor tells the attention function: which packed cache and layer to attend."""
    cache: PackedCache
    layer: int


class TurboQuantLayer(CacheLayerMixin):
    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, owner: "TurboQuantCache", layer_idx: int, sliding_window: Optional[int] = None):
        super().__init__()
        self.owner, self.layer_idx = owner, layer_idx
        self.sliding_window = sliding_window
        self.is_sliding = sliding_window is not None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.owner._packed_for(key_states)
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        packed = self.owner.packed
        if packed.config.key_outliers and packed.length(self.layer_idx) == 0:
            # Outlier channels are chosen before the first append: from the calibration keys given, else from
            # these (a prompt's own keys).
            given = self.owner.calibration[self.layer_idx] if self.owner.calibration is not None else None
            keys = key_states.detach() if given is None else given.to(key_states.device)
            packed.calibrate(self.layer_idx, keys.expand(packed.batch_size, -1, -1, -1), layout="bhsd")
        packed.append(self.layer_idx, key_states.detach(), value_states.detach(), layout="bhsd")
        marked = key_states.view_as(key_states)  # a new tensor object: only it carries the mark
        marked._flashtq_packed = _Packed(packed, self.layer_idx)
        return marked, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.packed.length(self.layer_idx) if self.is_initialized else 0

    def get_max_length(self) -> int:
        return self.owner.max_length

    def reset(self) -> None:
        self.owner.packed = None
        for layer in self.owner.layers:
            layer.is_initialized = False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise error("beam_idx", "the TurboQuant cache does not reorder sequences (beam search); use greedy or sampling")

    def crop(self, tokens_to_remove: int) -> None:
        raise error("tokens_to_remove", "the TurboQuant cache cannot drop tokens (assisted decoding is not supported)")


class TurboQuantCache(Cache):
    """A transformers Cache over flashtq's packed TurboQuant words, for every attention layer of `config`.

    config: the model's config (its text config is used: layers, kv heads, head_dim, layer types).
    cache_config: a preset or configuration name (flashtq.cache.presets(), e.g. "default" or "seed"), a
        TurboQuantConfig or a dict; None is the default preset.
    max_length: tokens each sequence may hold (default: the model's max_position_embeddings).
    device: where the packed words live (default: where the first keys are: cpu, or cuda on torch's stream).
    calibration: with outlier channels (a config with key_outliers), the keys each layer's outliers are chosen
        from, one [1, Hkv, T, D] tensor per layer (calibration_keys() records them from a text); None chooses them
        from each layer's first keys (the prompt's).
    The model must run with attn_implementation="flashtq" (import flashtq.hf registers it).
    """

    def __init__(self, config, cache_config: Union[str, TurboQuantConfig, dict, None] = None,
                 max_length: Optional[int] = None, device: Union[str, torch.device, None] = None,
                 calibration: Optional[list] = None):
        text = config.get_text_config(decoder=True)
        self.model_config = text
        self.num_layers = text.num_hidden_layers
        self.num_kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        self.max_length = int(max_length or text.max_position_embeddings)
        self.cache_config, self.device = cache_config, device
        if calibration is not None and len(calibration) != self.num_layers:
            raise error("calibration", f"must hold one key tensor per layer ({self.num_layers}), holds {len(calibration)}")
        self.calibration = calibration
        self.packed: Optional[PackedCache] = None
        layer_types = getattr(text, "layer_types", None) or ["full_attention"] * self.num_layers
        window = getattr(text, "sliding_window", None)
        layers = []
        for i, kind in enumerate(layer_types[: self.num_layers]):
            if kind not in ("full_attention", "sliding_attention"):
                raise error("config", f"layer {i} is of type {kind!r}; the TurboQuant cache serves attention layers only")
            layers.append(TurboQuantLayer(self, i, window if kind == "sliding_attention" else None))
        super().__init__(layers=layers)

    def _packed_for(self, key_states: torch.Tensor) -> PackedCache:
        """The packed cache, made at the first update (when the batch size is known)."""
        if self.packed is None:
            self.packed = PackedCache(self.num_layers, self.num_kv_heads, self.head_dim, self.max_length,
                                      config=self.cache_config, device=self.device or key_states.device,
                                      batch_size=key_states.shape[0])
        return self.packed

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        impl = getattr(self.model_config, "_attn_implementation", None)
        if impl != NAME:
            # Another attention function would see only the new rows and compute the wrong thing.
            raise error("attn_implementation", f"the model runs {impl!r}; the TurboQuant cache needs "
                                               f"attn_implementation='{NAME}' (import flashtq.hf)")
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def bytes_per_token(self) -> int:
        """Packed bytes one token costs (all layers and kv heads) in one sequence."""
        if self.packed is not None:
            return self.packed.bytes_per_token()
        # The layout's count, wherever the words will live, from a cache just large enough for its exact tokens.
        config = resolve_config(self.cache_config, self.head_dim)
        capacity = max(1, config.sink_tokens + config.recent_tokens)
        return PackedCache(self.num_layers, self.num_kv_heads, self.head_dim, capacity, config=config,
                           device="cpu").bytes_per_token()


@torch.no_grad()
def calibration_keys(model, ids: torch.Tensor) -> list:
    """Each layer's keys [1, Hkv, T, D] (after RoPE, as the cache receives them) for token ids [1, T], with exact
    attention: what TurboQuantCache(calibration=...) chooses outlier channels from (docs/quality.md uses the
    calibration split of the corpus, never the text it is evaluated on)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model(ids.to(model.device), past_key_values=cache, use_cache=True)
    return [layer.keys.detach() for layer in cache.layers]
