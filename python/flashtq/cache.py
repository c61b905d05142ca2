"""flashtq.TurboQuantCache: the library's packed KV cache (SPEC §2) for every layer of a model.

One C++ TqKvCache per sequence of the batch, so each sequence keeps its own length; on cpu its words
are in host memory, on cuda in the GPU's (the library's device cache, on torch's current stream). Keys and values
are encoded when appended and never kept dense; attention reads the packed words.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np
import torch
from torch import Tensor

from flashtq import _flashtq as _ext
from flashtq._errors import error
from flashtq._tensors import view


@dataclass(frozen=True)
class CacheConfig:
    """Bit widths of one cache: keys key_bits (Lloyd-Max codes) plus one QJL bit unless qjl is False
    ("MSE-only" keys: codes of up to 4 bits, no sketch), values value_bits."""
    key_bits: int = 2
    value_bits: int = 2
    seed: int = 0  # the rotations' signs come from (seed, layer)
    qjl: bool = True

    @property
    def name(self) -> str:
        for name, c in cache_configs().items():
            if (c.key_bits, c.value_bits, c.qjl) == (self.key_bits, self.value_bits, self.qjl):
                return name
        return f"{'k' if self.qjl else 'm'}{self.key_bits}v{self.value_bits}"


def cache_configs() -> dict[str, CacheConfig]:
    """Every configuration the library offers, by name: k<b>v<c> for keys of b = 1-3 bits plus the QJL bit and
    values of c = 2-4 bits; m<b>v<c> for keys of b = 1-4 bits without QJL ("MSE-only": m3v2 costs what the seed
    costs). The seed kernel's configuration (keys 2+1 bits, values 2 bits) is called "seed"."""
    configs = {}
    for kb in (1, 2, 3):
        for vb in (2, 3, 4):
            configs["seed" if (kb, vb) == (2, 2) else f"k{kb}v{vb}"] = CacheConfig(kb, vb)
    for kb in (1, 2, 3, 4):
        for vb in (2, 3, 4):
            configs[f"m{kb}v{vb}"] = CacheConfig(kb, vb, qjl=False)
    return configs


def resolve_config(config: Union[str, CacheConfig, dict, None]) -> CacheConfig:
    if config is None:
        return CacheConfig()
    if isinstance(config, CacheConfig):
        return config
    if isinstance(config, dict):
        return CacheConfig(**config)
    if isinstance(config, str):
        try:
            return cache_configs()[config]
        except KeyError:
            raise error("config", f"unknown name {config!r} (choices: {', '.join(cache_configs())})") from None
    raise error("config", f"must be a name, a CacheConfig or a dict, got {type(config).__name__}")


def backend_for_device(device: Union[str, torch.device]) -> tuple[str, torch.device]:
    """(backend, torch device) of a cache on `device`: "cpu" (or "reference", the oracle) keep the words in host
    memory, "cuda[:i]" in that GPU's memory (the library's cuda backend, on torch's current stream)."""
    name = str(device)
    if name in ("cpu", "reference"):
        return name, torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise error("device", f"{name!r} needs a CUDA device; torch.cuda.is_available() is False")
        if not any(b[0] == "cuda" and b[2] for b in _ext.backends()):
            raise error("device", "this build of flashtq has no usable cuda backend (built without nvcc?)")
        d = torch.device(name)
        # An index always: tensors report cuda:0, and torch.device("cuda") != torch.device("cuda:0").
        return "cuda", d if d.index is not None else torch.device("cuda", torch.cuda.current_device())
    raise error("device", f"must be 'cpu', 'reference' or 'cuda[:i]', got {name!r}")


class TurboQuantCache:
    """Packed keys and values of `num_layers` layers for `batch_size` sequences of up to `capacity` tokens."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int,
                 config: Union[str, CacheConfig, dict, None] = "seed", device: Union[str, torch.device] = "cpu",
                 batch_size: int = 1):
        self.config = resolve_config(config)
        self.backend, self.device = backend_for_device(device)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise error("batch_size", f"must be an integer >= 1, got {batch_size!r}")
        self.num_layers, self.num_kv_heads, self.head_dim, self.capacity = num_layers, num_kv_heads, head_dim, capacity
        with self._scope():
            self._seqs = [_ext.TqKvCache(num_layers, num_kv_heads, head_dim, capacity, self.config.key_bits,
                                         self.config.value_bits, self.config.seed, self.backend, self.config.qjl)
                          for _ in range(batch_size)]

    @classmethod
    def _wrap(cls, seqs: list, backend: str, device: torch.device) -> "TurboQuantCache":
        c = seqs[0].config()
        self = cls.__new__(cls)
        self.config = CacheConfig(c["key_bits"], c["value_bits"], c["seed"], c["qjl"])
        self.backend, self.device = backend, device
        self.num_layers, self.num_kv_heads, self.head_dim, self.capacity = (c["layers"], c["n_kv_heads"], c["head_dim"],
                                                                             c["capacity"])
        self._seqs = seqs
        return self

    @property
    def batch_size(self) -> int:
        return len(self._seqs)

    def _scope(self):
        """The cache's GPU as torch's current device (its words live there); nothing on the host."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def _on_stream(self):
        """Every sequence's operations go to torch's current stream (no synchronisation)."""
        if self.device.type == "cuda":
            stream = torch.cuda.current_stream(self.device).cuda_stream
            for seq in self._seqs:
                seq.set_stream(stream)

    def _rows(self, t: Tensor, name: str, layout: str) -> Tensor:
        """t as [B, S, H, D] (a view), checked against the batch and the host."""
        if not isinstance(t, Tensor):
            raise error(name, f"must be a torch.Tensor, got {type(t).__name__}")
        if layout not in ("bshd", "bhsd"):
            raise error("layout", f"must be 'bshd' or 'bhsd', got {layout!r}")
        if t.dim() != 4:
            raise error(name, f"must be 4-D ({layout}), got shape {tuple(t.shape)}")
        if t.device != self.device:
            raise error(name, f"must be on {self.device} like the cache, is on {t.device}")
        if t.shape[0] != self.batch_size:
            raise error(name, f"batch {t.shape[0]} does not match the cache's batch_size {self.batch_size}")
        return t.transpose(1, 2) if layout == "bhsd" else t

    def append(self, layer: int, k: Tensor, v: Tensor, start_pos: Optional[int] = None, layout: str = "bshd") -> None:
        """Encodes k, v [B, T, Hkv, D] into timesteps start_pos.. of every sequence (default: its current length)."""
        k, v = self._rows(k, "k", layout), self._rows(v, "v", layout)
        with self._scope():
            self._on_stream()
            for b, seq in enumerate(self._seqs):
                pos = seq.length(layer) if start_pos is None else start_pos
                seq.append(layer, view(k[b:b + 1], "k"), view(v[b:b + 1], "v"), pos)

    def attend(self, layer: int, q: Tensor, start_pos: Optional[int] = None, *, window: int = 0,
               scale: Optional[float] = None, layout: str = "bshd", out: Optional[Tensor] = None) -> Tensor:
        """Attention of q [B, n, H, D] at positions start_pos.. (default: the last n appended) over the packed
        words; row j sees timesteps [max(0, p - window + 1), p] with p = start_pos + j (window 0 = all).
        Returns f32 in q's layout (or writes `out`, f32, shaped like q)."""
        if not isinstance(window, int) or window < 0:  # the library checks the sign, not that it is an integer
            raise error("window", f"must be an integer >= 0, got {window!r}")
        q = self._rows(q, "q", layout)
        n = q.shape[1]
        if scale is not None:
            # The estimator is linear in q, so a scale other than the library's 1/sqrt(D) scales q.
            q = q * (float(scale) * math.sqrt(self.head_dim))
        if out is None:
            out = torch.empty(q.shape if layout == "bshd" else (q.shape[0], q.shape[2], n, q.shape[3]),
                              dtype=torch.float32, device=self.device)
        if out.dtype != torch.float32:
            raise error("out", f"must be float32, is {out.dtype}")
        o = self._rows(out, "out", layout)
        with self._scope():
            self._on_stream()
            for b, seq in enumerate(self._seqs):
                pos = seq.length(layer) - n if start_pos is None else start_pos
                seq.attend(layer, view(q[b:b + 1], "q"), pos, view(o[b:b + 1], "out"), window)
        return out

    def length(self, layer: int, seq: int = 0) -> int:
        return self._seqs[seq].length(layer)

    def bytes_per_token(self) -> int:
        """Packed bytes one token costs in one sequence, all layers and kv heads."""
        return self._seqs[0].bytes_per_token()

    def memory_bytes(self) -> int:
        return sum(s.memory_bytes() for s in self._seqs)

    def compression_vs_bf16(self) -> float:
        return self._seqs[0].compression_vs_bf16()

    def key_words(self, layer: int, seq: int = 0) -> np.ndarray:
        return np.frombuffer(self._seqs[seq].key_words(layer), dtype=np.uint32)

    def value_words(self, layer: int, seq: int = 0) -> np.ndarray:
        return np.frombuffer(self._seqs[seq].value_words(layer), dtype=np.uint32)

    def save(self, path: str) -> None:
        """The library's cache file (one sequence: the format holds one)."""
        if self.batch_size != 1:
            raise error("path", f"a cache file holds one sequence; this cache has {self.batch_size}")
        self._seqs[0].save(str(path))

    @classmethod
    def load(cls, path: str, device: Union[str, torch.device] = "cpu") -> "TurboQuantCache":
        backend, dev = backend_for_device(device)
        with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
            return cls._wrap([_ext.TqKvCache.load(str(path), backend)], backend, dev)
