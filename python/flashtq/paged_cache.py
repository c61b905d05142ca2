"""flashtq.PagedTurboQuantCache: the library's packed KV cache in pages (SPEC §2.7), shared by many sequences.

One pool of `num_pages` pages of `page_size` tokens per layer on the cache's device; a serving engine's block
manager hands pages out (allocate_page) and maps them to sequences (map_pages); fork shares a sequence's pages
with a new one, copy_page gives a sequence its own copy of a shared page before it appends into it (the cache
refuses to write into a page two sequences map), and freeing a page a sequence still maps is an error. Attention
takes a batch of sequences of any lengths, each with its own query rows ending at its length.
"""
from __future__ import annotations

import contextlib
import math
from typing import Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from flashtq import _flashtq as _ext
from flashtq._errors import error
from flashtq._tensors import view
from flashtq.cache import TurboQuantConfig, backend_for_device, cache_rows, resolve_config
from flashtq.ops import _check_softcap, _pointer, _prepare_sinks


class PagedTurboQuantCache:
    """Packed keys and values of `num_layers` layers in `num_pages` pages of `page_size` tokens, for up to
    `max_sequences` sequences at once (each keeps its exact sink and recent tokens apart from the pages)."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_pages: int, page_size: int = 64,
                 config: Union[str, TurboQuantConfig, dict, None] = None, device: Union[str, torch.device] = "cpu",
                 max_sequences: int = 64):
        if not isinstance(head_dim, int) or head_dim < 1:
            raise error("head_dim", f"must be an integer >= 1, got {head_dim!r}")
        self.config = resolve_config(config, head_dim)
        self.backend, self.device = backend_for_device(device)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.num_pages, self.page_size = num_pages, page_size
        c = self.config
        with self._scope():
            self._pool = _ext.TqPagedCache(num_layers, num_kv_heads, head_dim, num_pages, page_size, max_sequences,
                                           c.key_bits, c.value_bits, c.seed, self.backend, c.qjl, c.sink_tokens,
                                           c.recent_tokens, c.norm_correction, c.key_outliers, c.key_outlier_bits,
                                           c.key_block, c.value_block)

    def _scope(self):
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def _on_stream(self):
        if self.device.type == "cuda":
            self._pool.set_stream(torch.cuda.current_stream(self.device).cuda_stream)

    def _rows(self, t: Tensor, name: str, layout: str, batch: int) -> Tensor:
        return cache_rows(t, name, layout, self.device, batch, "len(seqs) =" if batch != 1 else "one sequence's")

    # Pages and sequences: the library's, one for one.
    def allocate_page(self) -> int:
        return self._pool.allocate_page()

    def free_page(self, page: int) -> None:
        self._pool.free_page(page)

    def free_pages(self) -> int:
        return self._pool.free_pages()

    def add_sequence(self) -> int:
        return self._pool.add_sequence()

    def map_pages(self, seq: int, pages: Sequence[int]) -> None:
        self._pool.map_pages(seq, [int(p) for p in pages])

    def fork(self, seq: int) -> int:
        with self._scope():
            return self._pool.fork(seq)

    def copy_page(self, seq: int, index: int, fresh: int) -> None:
        with self._scope():
            self._pool.copy_page(seq, index, fresh)

    def remove_sequence(self, seq: int) -> None:
        self._pool.remove_sequence(seq)

    def pages_of(self, seq: int) -> list[int]:
        return list(self._pool.pages_of(seq))

    def length(self, layer: int, seq: int) -> int:
        return self._pool.length(layer, seq)

    def append(self, layer: int, seq: int, k: Tensor, v: Tensor, layout: str = "bshd") -> None:
        """Encodes k, v [1, T, Hkv, D] as sequence `seq`'s next T tokens of `layer` (its pages must cover them)."""
        k, v = self._rows(k, "k", layout, 1), self._rows(v, "v", layout, 1)  # one sequence's rows
        with self._scope():
            self._on_stream()
            self._pool.append(layer, seq, view(k, "k"), view(v, "v"))

    def calibrate(self, layer: int, k: Tensor, layout: str = "bshd") -> None:
        """With outlier channels: each kv head's outlier channels of `layer` from keys k [1, T, Hkv, D], before any
        sequence appends to that layer; without, nothing to do."""
        if not self.config.key_outliers:
            return
        k = self._rows(k, "k", layout, 1)
        with self._scope():
            self._on_stream()
            self._pool.calibrate(layer, view(k, "k"))

    def attend(self, layer: int, seqs: Sequence[int], q: Tensor, *, window: int = 0, scale: Optional[float] = None,
               layout: str = "bshd", out: Optional[Tensor] = None, exact: bool = False, softcap: float = 0.0,
               sinks: Optional[Tensor] = None) -> Tensor:
        """Attention of q [B, n, H, D], row b for sequence seqs[b], its n rows ending at that sequence's length; as
        TurboQuantCache.attend otherwise (f32 result in q's layout, `window`, `exact`, `softcap`, `sinks`)."""
        if not isinstance(window, int) or window < 0:
            raise error("window", f"must be an integer >= 0, got {window!r}")
        if not isinstance(exact, bool):
            raise error("exact", f"must be a bool, got {exact!r}")
        _check_softcap(softcap)
        seqs = [int(s) for s in seqs]
        q = self._rows(q, "q", layout, len(seqs))
        sinks = _prepare_sinks(sinks, q.shape[2], q.device)
        if scale is not None:  # the estimator is linear in q
            q = q * (float(scale) * math.sqrt(self.head_dim))
        if out is None:
            out = torch.empty(q.shape if layout == "bshd" else (q.shape[0], q.shape[2], q.shape[1], q.shape[3]),
                              dtype=torch.float32, device=self.device)
        if out.dtype != torch.float32:
            raise error("out", f"must be float32, is {out.dtype}")
        o = self._rows(out, "out", layout, len(seqs))
        with self._scope():
            self._on_stream()
            self._pool.attend(layer, seqs, view(q, "q"), view(o, "out"), window, exact, float(softcap),
                              _pointer(sinks))
        return out

    def memory_bytes(self) -> int:
        return self._pool.memory_bytes()

    def key_words(self, layer: int) -> np.ndarray:
        return np.frombuffer(self._pool.key_words(layer), dtype=np.uint32)

    def value_words(self, layer: int) -> np.ndarray:
        return np.frombuffer(self._pool.value_words(layer), dtype=np.uint32)

