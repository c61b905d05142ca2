"""flashtq.attention: exact attention on torch tensors (and numpy arrays), differentiable, compilable.

Two torch.library custom ops carry the work, flashtq::attention_forward and flashtq::attention_backward,
each with a fake implementation (shapes and strides only) so that torch.compile(fullgraph=True) traces
through them; autograd connects them. The semantics, defaults and errors are the library's (SPEC §1).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from flashtq import _flashtq as _ext
from flashtq._errors import error
from flashtq._tensors import backend_for, stream_of, view

_LAYOUTS = ("bshd", "bhsd")


def _mask_args(mask: Optional[Tensor]) -> tuple[int, tuple[int, int, int, int], int]:
    """(pointer, strides, elements) of an f32 [B, H, Sq, Sk] mask view; zero strides broadcast."""
    if mask is None:
        return 0, (0, 0, 0, 0), 0
    extent = 1 + sum((n - 1) * s for n, s in zip(mask.shape, mask.stride()) if n > 0)
    return mask.data_ptr(), tuple(mask.stride()), extent


def _device_scope(t: Tensor):
    return torch.cuda.device(t.device) if t.device.type == "cuda" else _NoScope()


class _NoScope:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _new_out(q: Tensor, bhsd: bool) -> Tensor:
    """out, viewed as [B, Sq, H, D]; its memory is contiguous in the caller's layout."""
    B, S, H, D = q.shape
    if bhsd:
        return q.new_empty((B, H, S, D)).transpose(1, 2)
    return q.new_empty((B, S, H, D))


@torch.library.custom_op("flashtq::attention_forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: Optional[float], causal: bool,
             causal_offset: Optional[int], window: int, dropout_p: float, seed: int, softcap: float,
             sinks: Optional[Tensor], bhsd: bool, backend: str) -> tuple[Tensor, Tensor]:
    out = _new_out(q, bhsd)
    B, Sq, H, _ = q.shape
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    with _device_scope(q):
        _ext.forward(backend_for(q, backend or None), view(q, "q"), view(k, "k"), view(v, "v"), view(out, "out"),
                     lse.data_ptr(), scale, causal, causal_offset, window, *_mask_args(mask), dropout_p, seed,
                     softcap, _pointer(sinks), stream_of(q))
    return out, lse


@_forward.register_fake
def _(q, k, v, mask, scale, causal, causal_offset, window, dropout_p, seed, softcap, sinks, bhsd, backend):
    B, Sq, H, _ = q.shape
    return _new_out(q, bhsd), q.new_empty((B, H, Sq), dtype=torch.float32)


@torch.library.custom_op("flashtq::attention_backward", mutates_args=())
def _backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor, mask: Optional[Tensor],
              scale: Optional[float], causal: bool, causal_offset: Optional[int], window: int, dropout_p: float,
              seed: int, softcap: float, sinks: Optional[Tensor],
              backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = _new_dsinks(q, sinks)
    with _device_scope(q):
        _ext.backward(backend_for(q, backend or None), view(q, "q"), view(k, "k"), view(v, "v"), view(out, "out"),
                      view(dout, "dout"), lse.data_ptr(), view(dq, "dq"), view(dk, "dk"), view(dv, "dv"), scale,
                      causal, causal_offset, window, *_mask_args(mask), dropout_p, seed, softcap, _pointer(sinks),
                      _pointer(dsinks if sinks is not None else None), stream_of(q))
    return dq, dk, dv, dsinks


@_backward.register_fake
def _(q, k, v, out, dout, lse, mask, scale, causal, causal_offset, window, dropout_p, seed, softcap, sinks, backend):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), _new_dsinks(q, sinks)


def _pointer(t: Optional[Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _new_dsinks(q: Tensor, sinks: Optional[Tensor]) -> Tensor:
    """The sinks' gradient, f32 [H]; an empty tensor without sinks (a custom op returns tensors only)."""
    return q.new_empty((q.shape[2] if sinks is not None else 0,), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, scale, causal, causal_offset, window, dropout_p, seed, softcap, sinks, bhsd, backend = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, mask, sinks)
    ctx.params = (scale, causal, causal_offset, window, dropout_p, seed, softcap)
    ctx.backend = backend
    ctx.set_materialize_grads(False)  # an unused lse gets no gradient, and costs nothing


def _autograd_backward(ctx, dout, dlse):
    q, k, v, out, lse, mask, sinks = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    elif dout.stride(-1) != 1 or 0 in dout.stride():
        dout = dout.contiguous()  # the library needs D contiguous; autograd hands out expanded views at times
    dq, dk, dv, dsinks = _backward(q, k, v, out, dout, lse, mask, *ctx.params, sinks, ctx.backend)
    if dlse is not None:
        dq_l, dk_l, dsinks_l = _lse_gradients(q, k, v, lse, mask, sinks, dlse, ctx.params, ctx.backend)
        dq = (dq.float() + dq_l.float()).to(dq.dtype)
        dk = (dk.float() + dk_l.float()).to(dk.dtype)
        dsinks = dsinks + dsinks_l
    return (dq, dk, dv, None, None, None, None, None, None, None, None,
            dsinks if sinks is not None else None, None, None)


def _lse_gradients(q, k, v, lse, mask, sinks, dlse, params, backend):
    """What a loss on lse adds. d lse_i / d s_ij = P_ij (softmax without dropout, the sink in its denominator), so
    the gradient is the backward's dS_ij = P_ij (dP_ij - D_i) (softcap slope included) with dP = 0 and
    D_i = -dlse_i: the backward of values 0, out_i = -dlse_i e_0 and dout_i = e_0, whose D_i = <dout_i, out_i>.
    Its dsinks, -sum P_sink D_i, is then d loss / d sinks too."""
    e0 = torch.zeros_like(q)
    e0[..., 0] = 1
    out = torch.zeros_like(q)
    out[..., 0] = -dlse.transpose(1, 2)
    no_dropout = params[:4] + (0.0, 0) + params[6:]
    dq, dk, _, dsinks = _backward(q, k, torch.zeros_like(v), out, e0, lse, mask, *no_dropout, sinks, backend)
    return dq, dk, dsinks


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def _as_tensor(x, name: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if hasattr(x, "__dlpack__"):
        return torch.from_dlpack(x)
    raise error(name, f"must be a torch.Tensor or an array with __dlpack__ (numpy), got {type(x).__name__}")


def _prepare_mask(mask, B: int, H: int, Sq: int, Sk: int, device: torch.device) -> Optional[Tensor]:
    """The mask as an f32 [B, H, Sq, Sk] view (broadcast dimensions keep stride 0): bool True = visible."""
    if mask is None:
        return None
    mask = _as_tensor(mask, "mask")
    if mask.device != device:
        raise error("mask", f"must be on {device} like q, is on {mask.device}")
    if mask.dtype == torch.bool:
        mask = torch.where(mask, 0.0, float("-inf")).to(torch.float32)
    elif mask.dtype.is_floating_point:
        mask = mask.to(torch.float32)
    else:
        raise error("mask", f"must be bool (True = visible) or floating point (added to the scores), got {mask.dtype}")
    if mask.dim() > 4:
        raise error("mask", f"must broadcast to [B, H, Sq, Sk] = {[B, H, Sq, Sk]}, got shape {tuple(mask.shape)}")
    try:
        return mask.expand(B, H, Sq, Sk)
    except RuntimeError:
        raise error("mask", f"must broadcast to [B, H, Sq, Sk] = {[B, H, Sq, Sk]}, got shape {tuple(mask.shape)}") from None


def _prepare_sinks(sinks, H: int, device: torch.device) -> Optional[Tensor]:
    """The sinks as a contiguous f32 [H] tensor on q's device (autograd follows the conversion)."""
    if sinks is None:
        return None
    sinks = _as_tensor(sinks, "sinks")
    if sinks.device != device:
        raise error("sinks", f"must be on {device} like q, is on {sinks.device}")
    if not sinks.dtype.is_floating_point or tuple(sinks.shape) != (H,):
        raise error("sinks", f"must be a floating-point tensor of shape [H] = [{H}], got {sinks.dtype} "
                             f"{tuple(sinks.shape)}")
    return sinks.to(torch.float32).contiguous()


def attention(q, k, v, *, causal: bool = False, causal_offset: Optional[int] = None, window: int = 0, mask=None,
              dropout_p: float = 0.0, seed: int = 0, scale: Optional[float] = None, softcap: float = 0.0, sinks=None,
              return_lse: bool = False, layout: str = "bshd", backend: Optional[str] = None):
    """Exact attention (SPEC §1). See docs/python.md.

    q [B, Sq, H, D], k/v [B, Sk, Hkv, D] (layout "bshd") or [B, H, S, D] (layout "bhsd", PyTorch's);
    any strides with D contiguous. causal_offset defaults to Sk - Sq (bottom-right); 0 is PyTorch's
    is_causal. mask broadcasts to [B, H, Sq, Sk] (bool True = visible, or additive float). Returns out
    in q's layout and dtype, and lse [B, H, Sq] (f32, natural log) with return_lse=True. softcap > 0 caps every
    score at softcap * tanh(score / softcap) (SPEC §1.8); sinks, f32 [H] on q's device, adds one logit per head
    to the softmax's denominator (SPEC §1.9) and gets a gradient when it requires one. numpy inputs
    give numpy outputs. backend overrides the device's default ("reference", "cpu", "cuda", ...).
    """
    numpy_in = isinstance(q, np.ndarray)
    q, k, v = _as_tensor(q, "q"), _as_tensor(k, "k"), _as_tensor(v, "v")
    if layout not in _LAYOUTS:
        raise error("layout", f"must be 'bshd' or 'bhsd', got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise error(name, f"must be 4-D ({layout}), got shape {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise error(name, f"must be on {q.device} like q, is on {t.device}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise error("seed", f"must be an integer in [0, 2^32), got {seed!r}")
    if not isinstance(window, int) or isinstance(window, bool):
        raise error("window", f"must be an integer, got {window!r}")
    if causal_offset is not None and (not isinstance(causal_offset, int) or isinstance(causal_offset, bool)):
        raise error("causal_offset", f"must be an integer or None, got {causal_offset!r}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise error("scale", f"must be a finite number or None, got {scale!r}")
    bhsd = layout == "bhsd"
    if bhsd:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    B, Sq, H, _ = q.shape
    mask = _prepare_mask(mask, B, H, Sq, k.shape[1], q.device)
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise error("softcap", f"must be a number (0 = no softcap), got {softcap!r}")
    sinks = _prepare_sinks(sinks, H, q.device)
    out, lse = torch.ops.flashtq.attention_forward(q, k, v, mask, None if scale is None else float(scale), bool(causal),
                                                   causal_offset, window, float(dropout_p), seed, float(softcap), sinks,
                                                   bhsd, backend or "")
    if bhsd:
        out = out.transpose(1, 2)
    if numpy_in:
        out, lse = out.numpy(), lse.numpy()
    return (out, lse) if return_lse else out
