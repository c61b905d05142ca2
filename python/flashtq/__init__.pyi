# Type stubs of flashtq's public functions (the implementation: ops.py, cache.py, backends.py).
from pathlib import Path
from typing import Literal, Optional, Union, overload

import numpy as np
import torch

from flashtq._flashtq import FlashTQError as FlashTQError
from flashtq.backends import BackendInfo

__version__: str

_Array = Union[torch.Tensor, np.ndarray]

@overload
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = ..., causal_offset: Optional[int] = ...,
              window: int = ..., mask: Optional[_Array] = ..., dropout_p: float = ..., seed: int = ...,
              scale: Optional[float] = ..., softcap: float = ..., sinks: Optional[_Array] = ...,
              return_lse: Literal[False] = ..., layout: Literal["bshd", "bhsd"] = ...,
              backend: Optional[str] = ...) -> torch.Tensor: ...
@overload
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = ..., causal_offset: Optional[int] = ...,
              window: int = ..., mask: Optional[_Array] = ..., dropout_p: float = ..., seed: int = ...,
              scale: Optional[float] = ..., softcap: float = ..., sinks: Optional[_Array] = ...,
              return_lse: Literal[True], layout: Literal["bshd", "bhsd"] = ...,
              backend: Optional[str] = ...) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, causal: bool = ..., causal_offset: Optional[int] = ...,
              window: int = ..., mask: Optional[_Array] = ..., dropout_p: float = ..., seed: int = ...,
              scale: Optional[float] = ..., softcap: float = ..., sinks: Optional[_Array] = ...,
              return_lse: bool = ..., layout: Literal["bshd", "bhsd"] = ...,
              backend: Optional[str] = ...) -> Union[np.ndarray, tuple[np.ndarray, np.ndarray]]: ...

def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, *, max_seqlen_q: int = ..., max_seqlen_k: int = ..., causal: bool = ...,
                     causal_offset: Optional[int] = ..., window: int = ..., dropout_p: float = ..., seed: int = ...,
                     scale: Optional[float] = ..., softcap: float = ..., sinks: Optional[torch.Tensor] = ...,
                     return_lse: bool = ..., backend: Optional[str] = ...) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]: ...
def attention_paged(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, page_table: torch.Tensor,
                    seq_lens_k: torch.Tensor, *, causal: bool = ..., window: int = ..., scale: Optional[float] = ...,
                    softcap: float = ..., sinks: Optional[torch.Tensor] = ..., return_lse: bool = ...,
                    backend: Optional[str] = ...) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]: ...
def paged_kv_append(k_pages: torch.Tensor, v_pages: torch.Tensor, page_table: torch.Tensor, seq_lens_k: torch.Tensor,
                    k: torch.Tensor, v: torch.Tensor, *, backend: Optional[str] = ...) -> None: ...
def backends() -> list[BackendInfo]: ...
def set_threads(backend: str, threads: int) -> None: ...

class CacheConfig:
    key_bits: int
    value_bits: int
    seed: int
    qjl: bool
    def __init__(self, key_bits: int = 2, value_bits: int = 2, seed: int = 0, qjl: bool = True) -> None: ...
    @property
    def name(self) -> str: ...

def cache_configs() -> dict[str, CacheConfig]: ...

class TurboQuantCache:
    config: CacheConfig
    backend: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    capacity: int
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int,
                 config: Union[str, CacheConfig, dict, None] = "seed", device: Union[str, torch.device] = "cpu",
                 batch_size: int = 1) -> None: ...
    @property
    def batch_size(self) -> int: ...
    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, start_pos: Optional[int] = None,
               layout: Literal["bshd", "bhsd"] = "bshd") -> None: ...
    def calibrate(self, layer: int, k: torch.Tensor, layout: Literal["bshd", "bhsd"] = "bshd") -> None: ...
    def attend(self, layer: int, q: torch.Tensor, start_pos: Optional[int] = None, *, window: int = 0,
               scale: Optional[float] = None, layout: Literal["bshd", "bhsd"] = "bshd",
               out: Optional[torch.Tensor] = None, exact: bool = False, softcap: float = 0.0,
               sinks: Optional[torch.Tensor] = None) -> torch.Tensor: ...
    def length(self, layer: int, seq: int = 0) -> int: ...
    def bytes_per_token(self) -> int: ...
    def memory_bytes(self) -> int: ...
    def compression_vs_bf16(self) -> float: ...
    def key_words(self, layer: int, seq: int = 0) -> np.ndarray: ...
    def value_words(self, layer: int, seq: int = 0) -> np.ndarray: ...
    def save(self, path: Union[str, Path]) -> None: ...
    @classmethod
    def load(cls, path: Union[str, Path], device: Union[str, torch.device] = "cpu") -> "TurboQuantCache": ...
