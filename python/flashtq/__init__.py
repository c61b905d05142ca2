"""flashtq: exact FlashAttention and attention over a TurboQuant-compressed KV cache.

`import flashtq` needs no GPU: CUDA tensors use the cuda backend where it is compiled in and a GPU exists.
"""
# torch first: its CUDA and OpenMP runtimes must be the ones loaded before the extension's (the other order aborted
# with "free(): invalid pointer" on the GPU machine, where the extension links the system's CUDA runtime and libgomp).
import torch  # noqa: F401

from flashtq._flashtq import FlashTQError, __version__
from flashtq.backends import backends, set_threads
from flashtq.ops import attention, attention_paged, attention_varlen, paged_kv_append
from flashtq.cache import CacheConfig, TurboQuantCache, TurboQuantConfig, cache_configs, presets
from flashtq.paged_cache import PagedTurboQuantCache

__all__ = ["FlashTQError", "__version__", "attention", "attention_paged", "attention_varlen", "paged_kv_append",
           "backends", "set_threads", "CacheConfig", "TurboQuantCache", "PagedTurboQuantCache",
           "TurboQuantConfig", "cache_configs", "presets"]
