"""torch tensors as flashtq TensorViews (pointers, shapes and strides), and the backend a tensor runs on."""
from __future__ import annotations

import torch

from flashtq import _flashtq as _ext
from flashtq._errors import error

_DTYPES = {torch.float32: _ext.DType.f32, torch.float16: _ext.DType.f16, torch.bfloat16: _ext.DType.bf16}


def dtype_of(t: torch.Tensor, name: str):
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise error(name, f"dtype {t.dtype} is not supported (float32, float16 or bfloat16)") from None


def memory_of(t: torch.Tensor, name: str):
    if t.device.type == "cpu":
        return _ext.Memory.host
    if t.device.type == "cuda":
        return _ext.Memory.cuda
    raise error(name, f"tensors on '{t.device.type}' are not supported (cpu or cuda)")


def view(t: torch.Tensor, name: str) -> _ext.TensorView:
    """A [B, S, H, D] view of a 4-D tensor whose last dimension is contiguous (no copy)."""
    if t.dim() != 4:
        raise error(name, f"must be 4-D [B, S, H, D], got shape {tuple(t.shape)}")
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise error(name, f"the last dimension (D) must be contiguous, got strides {tuple(t.stride())}")
    return _ext.TensorView(t.data_ptr(), dtype_of(t, name), tuple(t.shape), tuple(t.stride()), memory_of(t, name))


def backend_for(t: torch.Tensor, backend: str | None) -> str:
    """The backend a tensor's device runs on: cpu tensors on 'cpu', CUDA tensors on 'cuda' (or the named one)."""
    if backend is not None:
        return backend
    return "cuda" if t.device.type == "cuda" else "cpu"


def stream_of(t: torch.Tensor) -> int:
    """torch's current CUDA stream on t's device (0 for host tensors): flashtq queues work there, no sync."""
    if t.device.type != "cuda":
        return 0
    return torch.cuda.current_stream(t.device).cuda_stream
