"""flashtq.TurboQuantCache: the library's packed KV cache (SPEC §2) for every layer of a model.

One C++ TqKvCache per sequence of the batch, so each sequence keeps its own length; on cpu its words
are in host memory, on cuda in the GPU's (the library's device cache, on torch's current stream). Keys and values
are encoded when appended and never kept dense; attention reads the packed words.
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np
import torch
from torch import Tensor

from flashtq import _flashtq as _ext
from flashtq._errors import error
from flashtq._tensors import view
from flashtq.ops import _check_softcap, _pointer, _prepare_sinks


_NAME = re.compile(r"^(k|m)([1-4])(?:o(\d+)x([1-4]))?v([2-4])(n)?(?:s(\d+))?(?:w(\d+))?(?:kg(\d+))?(?:vg(\d+))?$")


@dataclass(frozen=True)
class TurboQuantConfig:
    """One cache's configuration: keys key_bits (Lloyd-Max codes) plus one QJL bit unless qjl is False
    ("MSE-only" keys: codes of up to 4 bits, no sketch), values value_bits; the first sink_tokens and the last
    recent_tokens timesteps of a sequence also kept exact (bf16) and attended exactly; norm_correction stores
    n / |c[idx]| so decoded rows keep their length (keys without QJL and values; docs/spec.md §2.6); key_outliers
    channels of each kv head (chosen by calibrate(), on a prompt's keys) coded with key_outlier_bits bits, apart
    from the rest (keys without QJL); key_block / value_block timesteps sharing a mean that the codes leave out
    (block means: at most recent_tokens; keys without QJL).

    Names: "seed" (keys 2+1 bits, values 2 bits), k<b>v<c> / m<b>v<c> (with / without QJL), m<b>o<N>x<B>v<c>
    (N outlier channels of B bits), optionally followed by n (norm correction), s<S> (sink tokens) and w<W>
    (recent tokens), kg<G> and vg<G> (key and value block means), e.g. "m4v3ns4w32", "m3o16x4v3ns4w32" or
    "m3v3ns4w64kg64vg64"; and the presets of presets()."""
    key_bits: int = 2
    value_bits: int = 2
    seed: int = 0  # the rotations' signs come from (seed, layer)
    qjl: bool = True
    sink_tokens: int = 0
    recent_tokens: int = 0
    norm_correction: bool = False
    key_outliers: int = 0
    key_outlier_bits: int = 0
    key_block: int = 0
    value_block: int = 0

    @property
    def name(self) -> str:
        """The configuration spelt out (k|m<b>v<c>[n][s<S>][w<W>], or "seed"), which parse_config reads back."""
        outliers = f"o{self.key_outliers}x{self.key_outlier_bits}" if self.key_outliers else ""
        base = "seed" if (self.key_bits, self.value_bits, self.qjl) == (2, 2, True) else \
            f"{'k' if self.qjl else 'm'}{self.key_bits}{outliers}v{self.value_bits}"
        if self.sink_tokens or self.recent_tokens or self.norm_correction or self.key_block or self.value_block:
            base = f"{'k2v2' if base == 'seed' else base}" + ("n" if self.norm_correction else "") + \
                (f"s{self.sink_tokens}" if self.sink_tokens else "") + (f"w{self.recent_tokens}" if self.recent_tokens else "") + \
                (f"kg{self.key_block}" if self.key_block else "") + (f"vg{self.value_block}" if self.value_block else "")
        return base if self.seed == 0 else f"{base} (seed {self.seed})"

    @classmethod
    def preset(cls, name: str, head_dim: int = 128) -> "TurboQuantConfig":
        """A named configuration for a model of `head_dim`: a preset (presets(); its key width may depend on head_dim)
        or a name as the class's docstring spells it."""
        return resolve_config(name, head_dim)


CacheConfig = TurboQuantConfig  # the name of earlier releases


# Presets, chosen by measured perplexity on real models (docs/quality.md): the library's list (flashtq::tq_presets),
# the default first.
DEFAULT_PRESET = _ext.tq_presets()[0]["name"]


def presets(head_dim: int = 128) -> dict[str, TurboQuantConfig]:
    """The named presets at `head_dim` (docs/quality.md measures each; docs/turboquant_layout.md lists their sizes)."""
    return {p["name"]: TurboQuantConfig(**_ext.tq_preset_layout(p["name"], head_dim)) for p in _ext.tq_presets()}


def cache_configs() -> dict[str, TurboQuantConfig]:
    """Every bit-width combination the library offers, by name, without exact tokens: k<b>v<c> for keys of b = 1-3
    bits plus the QJL bit and values of c = 2-4 bits; m<b>v<c> for keys of b = 1-4 bits without QJL ("MSE-only":
    m3v2 costs what the seed costs). The seed kernel's configuration (keys 2+1 bits, values 2 bits) is "seed"."""
    configs = {}
    for kb in (1, 2, 3):
        for vb in (2, 3, 4):
            configs["seed" if (kb, vb) == (2, 2) else f"k{kb}v{vb}"] = TurboQuantConfig(kb, vb)
    for kb in (1, 2, 3, 4):
        for vb in (2, 3, 4):
            configs[f"m{kb}v{vb}"] = TurboQuantConfig(kb, vb, qjl=False)
    return configs


def parse_config(name: str, head_dim: int = 128) -> Optional[TurboQuantConfig]:
    """The configuration a name spells (a preset at `head_dim`, a cache_configs() name, or k|m<b>v<c>[n][s<S>][w<W>]);
    None if none."""
    if any(p["name"] == name for p in _ext.tq_presets()):
        return TurboQuantConfig(**_ext.tq_preset_layout(name, head_dim))
    if name in cache_configs():
        return cache_configs()[name]
    m = _NAME.match(name)
    if not m or (m.group(1) == "k" and int(m.group(2)) > 3):
        return None
    return TurboQuantConfig(int(m.group(2)), int(m.group(5)), qjl=m.group(1) == "k", norm_correction=bool(m.group(6)),
                            sink_tokens=int(m.group(7) or 0), recent_tokens=int(m.group(8) or 0),
                            key_outliers=int(m.group(3) or 0), key_outlier_bits=int(m.group(4) or 0),
                            key_block=int(m.group(9) or 0), value_block=int(m.group(10) or 0))


def resolve_config(config: Union[str, TurboQuantConfig, dict, None], head_dim: int = 128) -> TurboQuantConfig:
    """The configuration `config` names for a model of `head_dim` (None: the default preset)."""
    if config is None:
        config = DEFAULT_PRESET
    if isinstance(config, TurboQuantConfig):
        return config
    if isinstance(config, dict):
        return TurboQuantConfig(**config)
    if isinstance(config, str):
        got = parse_config(config, head_dim)
        if got is None:
            names = ", ".join(p["name"] for p in _ext.tq_presets())
            raise error("config", f"unknown name {config!r} (presets: {names}; or k|m<b>v<c>[n][s<S>][w<W>], "
                                  "e.g. m4v3ns4w32)")
        return got
    raise error("config", f"must be a name, a TurboQuantConfig or a dict, got {type(config).__name__}")


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


def cache_rows(t: Tensor, name: str, layout: str, device: torch.device, batch: int, batch_is: str) -> Tensor:
    """t as [B, S, H, D] (a view), checked against a cache's device and the batch it expects (`batch_is` says which)."""
    if not isinstance(t, Tensor):
        raise error(name, f"must be a torch.Tensor, got {type(t).__name__}")
    if layout not in ("bshd", "bhsd"):
        raise error("layout", f"must be 'bshd' or 'bhsd', got {layout!r}")
    if t.dim() != 4:
        raise error(name, f"must be 4-D ({layout}), got shape {tuple(t.shape)}")
    if t.device != device:
        raise error(name, f"must be on {device} like the cache, is on {t.device}")
    if t.shape[0] != batch:
        raise error(name, f"batch {t.shape[0]} does not match {batch_is} {batch}")
    return t.transpose(1, 2) if layout == "bhsd" else t


class TurboQuantCache:
    """Packed keys and values of `num_layers` layers for `batch_size` sequences of up to `capacity` tokens."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int,
                 config: Union[str, TurboQuantConfig, dict, None] = None, device: Union[str, torch.device] = "cpu",
                 batch_size: int = 1):
        if not isinstance(head_dim, int) or head_dim < 1:
            raise error("head_dim", f"must be an integer >= 1, got {head_dim!r}")
        self.config = resolve_config(config, head_dim)
        self.backend, self.device = backend_for_device(device)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise error("batch_size", f"must be an integer >= 1, got {batch_size!r}")
        self.num_layers, self.num_kv_heads, self.head_dim, self.capacity = num_layers, num_kv_heads, head_dim, capacity
        with self._scope():
            self._seqs = [_ext.TqKvCache(num_layers, num_kv_heads, head_dim, capacity, self.config.key_bits,
                                         self.config.value_bits, self.config.seed, self.backend, self.config.qjl,
                                         self.config.sink_tokens, self.config.recent_tokens,
                                         self.config.norm_correction, self.config.key_outliers,
                                         self.config.key_outlier_bits, self.config.key_block, self.config.value_block)
                          for _ in range(batch_size)]

    @classmethod
    def _wrap(cls, seqs: list, backend: str, device: torch.device) -> "TurboQuantCache":
        c = seqs[0].config()
        self = cls.__new__(cls)
        self.config = TurboQuantConfig(c["key_bits"], c["value_bits"], c["seed"], c["qjl"], c["sink_tokens"],
                                       c["recent_tokens"], c["norm_correction"], c["key_outliers"],
                                       c["key_outlier_bits"], c["key_block"], c["value_block"])
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
        return cache_rows(t, name, layout, self.device, self.batch_size, "the cache's batch_size")

    def append(self, layer: int, k: Tensor, v: Tensor, start_pos: Optional[int] = None, layout: str = "bshd") -> None:
        """Encodes k, v [B, T, Hkv, D] into timesteps start_pos.. of every sequence (default: its current length)."""
        k, v = self._rows(k, "k", layout), self._rows(v, "v", layout)
        with self._scope():
            self._on_stream()
            for b, seq in enumerate(self._seqs):
                pos = seq.length(layer) if start_pos is None else start_pos
                seq.append(layer, view(k[b:b + 1], "k"), view(v[b:b + 1], "v"), pos)

    def calibrate(self, layer: int, k: Tensor, layout: str = "bshd") -> None:
        """With outlier channels: chooses each kv head's outlier channels of `layer` from keys k [B, T, Hkv, D]
        (sequence b from k[b]: a prompt's own keys), before that layer's first append; without, nothing to do."""
        if not self.config.key_outliers:
            return
        k = self._rows(k, "k", layout)
        with self._scope():
            self._on_stream()
            for b, seq in enumerate(self._seqs):
                seq.calibrate(layer, view(k[b:b + 1], "k"))

    def attend(self, layer: int, q: Tensor, start_pos: Optional[int] = None, *, window: int = 0,
               scale: Optional[float] = None, layout: str = "bshd", out: Optional[Tensor] = None,
               exact: bool = False, softcap: float = 0.0, sinks: Optional[Tensor] = None) -> Tensor:
        """Attention of q [B, n, H, D] at positions start_pos.. (default: the last n appended) over the packed
        words; row j sees timesteps [max(0, p - window + 1), p] with p = start_pos + j (window 0 = all).
        Returns f32 in q's layout (or writes `out`, f32, shaped like q). `exact`: f32 arithmetic (within 1e-5 of
        the oracle) instead of the backend's bf16-class fast paths (within 1e-2; docs/spec.md §3). `softcap` and
        `sinks` (f32 [H] on the cache's device, one logit per query head) as in flashtq.attention (SPEC §1.8-§1.9)."""
        if not isinstance(window, int) or window < 0:  # the library checks the sign, not that it is an integer
            raise error("window", f"must be an integer >= 0, got {window!r}")
        if not isinstance(exact, bool):
            raise error("exact", f"must be a bool, got {exact!r}")
        _check_softcap(softcap)
        q = self._rows(q, "q", layout)
        n = q.shape[1]
        sinks = _prepare_sinks(sinks, q.shape[2], q.device)
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
                seq.attend(layer, view(q[b:b + 1], "q"), pos, view(o[b:b + 1], "out"), window, exact, float(softcap),
                           _pointer(sinks))
        return out

    def length(self, layer: int, seq: int = 0) -> int:
        return self._seqs[seq].length(layer)

    def bytes_per_token(self) -> int:
        """Packed bytes one token costs in one sequence, all layers and kv heads."""
        return self._seqs[0].bytes_per_token()

    def memory_bytes(self) -> int:
        return sum(s.memory_bytes() for s in self._seqs)

    def exact_bytes(self) -> int:
        """The exact tokens' fixed bytes in one sequence, all layers and kv heads (0 without exact tokens)."""
        return self._seqs[0].exact_bytes()

    def compression_vs_bf16(self, length: Optional[int] = None) -> float:
        """Against a bf16 cache: per token of the packed part, or for a sequence of `length` tokens (exact ones counted)."""
        return self._seqs[0].compression_vs_bf16() if length is None else self._seqs[0].compression_vs_bf16_at(length)

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
