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


def _workspace_for(x: Tensor):
    """An allocator for a call's workspace on x's device (None on the CPU, where none is used): the bytes come
    from torch's caching allocator on the current stream, kept alive by the returned list until the call is made."""
    if not x.is_cuda:
        return None, []
    keep = []

    def allocate(nbytes: int) -> int:
        keep.append(torch.empty(nbytes, dtype=torch.uint8, device=x.device))
        return keep[-1].data_ptr()
    return allocate, keep


@torch.library.custom_op("flashtq::attention_forward", mutates_args=())
def _forward(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: Optional[float], causal: bool,
             causal_offset: Optional[int], window: int, dropout_p: float, seed: int, softcap: float,
             sinks: Optional[Tensor], cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
             max_seqlen_q: int, max_seqlen_k: int, bhsd: bool, backend: str) -> tuple[Tensor, Tensor]:
    out = _new_out(q, bhsd)
    B, Sq, H, _ = q.shape
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)  # a ragged batch's [H, Tq] when B = 1
    allocate, _keep = _workspace_for(q)
    with _device_scope(q):
        _ext.forward(backend_for(q, backend or None), view(q, "q"), view(k, "k"), view(v, "v"), view(out, "out"),
                     lse.data_ptr(), scale, causal, causal_offset, window, *_mask_args(mask), dropout_p, seed,
                     softcap, _pointer(sinks), *_ragged_args(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                     0, 0, 0, stream_of(q), False, allocate)
    return out, lse


@_forward.register_fake
def _(q, k, v, mask, scale, causal, causal_offset, window, dropout_p, seed, softcap, sinks, cu_seqlens_q, cu_seqlens_k,
      max_seqlen_q, max_seqlen_k, bhsd, backend):
    B, Sq, H, _ = q.shape
    return _new_out(q, bhsd), q.new_empty((B, H, Sq), dtype=torch.float32)


@torch.library.custom_op("flashtq::attention_backward", mutates_args=())
def _backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, lse: Tensor, mask: Optional[Tensor],
              scale: Optional[float], causal: bool, causal_offset: Optional[int], window: int, dropout_p: float,
              seed: int, softcap: float, sinks: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
              cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
              backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = _new_dsinks(q, sinks)
    allocate, _keep = _workspace_for(q)
    with _device_scope(q):
        _ext.backward(backend_for(q, backend or None), view(q, "q"), view(k, "k"), view(v, "v"), view(out, "out"),
                      view(dout, "dout"), lse.data_ptr(), view(dq, "dq"), view(dk, "dk"), view(dv, "dv"), scale,
                      causal, causal_offset, window, *_mask_args(mask), dropout_p, seed, softcap, _pointer(sinks),
                      _pointer(dsinks if sinks is not None else None),
                      *_ragged_args(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), stream_of(q), allocate)
    return dq, dk, dv, dsinks


@_backward.register_fake
def _(q, k, v, out, dout, lse, mask, scale, causal, causal_offset, window, dropout_p, seed, softcap, sinks,
      cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, backend):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), _new_dsinks(q, sinks)


def _pointer(t: Optional[Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _ragged_args(cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
                 max_seqlen_k: int) -> tuple[int, int, int, int, int]:
    """(batch, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) for the extension; batch 0 = not ragged."""
    if cu_seqlens_q is None:
        return 0, 0, 0, 0, 0
    return cu_seqlens_q.numel() - 1, cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), max_seqlen_q, max_seqlen_k


def _new_dsinks(q: Tensor, sinks: Optional[Tensor]) -> Tensor:
    """The sinks' gradient, f32 [H]; an empty tensor without sinks (a custom op returns tensors only)."""
    return q.new_empty((q.shape[2] if sinks is not None else 0,), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    (q, k, v, mask, scale, causal, causal_offset, window, dropout_p, seed, softcap, sinks, cu_seqlens_q, cu_seqlens_k,
     max_seqlen_q, max_seqlen_k, bhsd, backend) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, mask, sinks, cu_seqlens_q, cu_seqlens_k)
    ctx.params = (scale, causal, causal_offset, window, dropout_p, seed, softcap)
    ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
    ctx.backend = backend
    ctx.set_materialize_grads(False)  # an unused lse gets no gradient, and costs nothing


def _autograd_backward(ctx, dout, dlse):
    q, k, v, out, lse, mask, sinks, cu_q, cu_k = ctx.saved_tensors
    ragged = (cu_q, cu_k, *ctx.max_seqlens)
    if dout is None:
        dout = torch.zeros_like(out)
    elif dout.stride(-1) != 1 or 0 in dout.stride():
        dout = dout.contiguous()  # the library needs D contiguous; autograd hands out expanded views at times
    dq, dk, dv, dsinks = _backward(q, k, v, out, dout, lse, mask, *ctx.params, sinks, *ragged, ctx.backend)
    if dlse is not None:
        dq_l, dk_l, dsinks_l = _lse_gradients(q, k, v, lse, mask, sinks, ragged, dlse, ctx.params, ctx.backend)
        dq = (dq.float() + dq_l.float()).to(dq.dtype)
        dk = (dk.float() + dk_l.float()).to(dk.dtype)
        dsinks = dsinks + dsinks_l
    return (dq, dk, dv, None, None, None, None, None, None, None, None,
            dsinks if sinks is not None else None, None, None, None, None, None, None)


def _lse_gradients(q, k, v, lse, mask, sinks, ragged, dlse, params, backend):
    """What a loss on lse adds. d lse_i / d s_ij = P_ij (softmax without dropout, the sink in its denominator), so
    the gradient is the backward's dS_ij = P_ij (dP_ij - D_i) (softcap slope included) with dP = 0 and
    D_i = -dlse_i: the backward of values 0, out_i = -dlse_i e_0 and dout_i = e_0, whose D_i = <dout_i, out_i>.
    Its dsinks, -sum P_sink D_i, is then d loss / d sinks too."""
    e0 = torch.zeros_like(q)
    e0[..., 0] = 1
    out = torch.zeros_like(q)
    out[..., 0] = -dlse.transpose(1, 2)
    no_dropout = params[:4] + (0.0, 0) + params[6:]
    dq, dk, _, dsinks = _backward(q, k, torch.zeros_like(v), out, e0, lse, mask, *no_dropout, sinks, *ragged, backend)
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


def _check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise error("seed", f"must be an integer in [0, 2^32), got {seed!r}")


def _check_softcap(softcap) -> None:
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise error("softcap", f"must be a number (0 = no softcap), got {softcap!r}")


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
    _check_seed(seed)
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
    _check_softcap(softcap)
    sinks = _prepare_sinks(sinks, H, q.device)
    out, lse = torch.ops.flashtq.attention_forward(q, k, v, mask, None if scale is None else float(scale), bool(causal),
                                                   causal_offset, window, float(dropout_p), seed, float(softcap), sinks,
                                                   None, None, 0, 0, bhsd, backend or "")
    if bhsd:
        out = out.transpose(1, 2)
    if numpy_in:
        out, lse = out.numpy(), lse.numpy()
    return (out, lse) if return_lse else out


def _host_int32(t, name: str, shape: tuple) -> Tensor:
    """An int32 host tensor of the given shape (offsets, tables and lengths are read on the host)."""
    t = _as_tensor(t, name)
    if t.device.type != "cpu" or t.dtype != torch.int32 or tuple(t.shape) != shape:
        raise error(name, f"must be an int32 cpu tensor of shape {list(shape)}, got {t.dtype} {tuple(t.shape)} on "
                          f"{t.device}")
    return t.contiguous()


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q: int = 0, max_seqlen_k: int = 0,
                     causal: bool = False, causal_offset: Optional[int] = None, window: int = 0, dropout_p: float = 0.0,
                     seed: int = 0, scale: Optional[float] = None, softcap: float = 0.0, sinks=None,
                     return_lse: bool = False, backend: Optional[str] = None):
    """A ragged batch (SPEC §1.6), as flash_attn_varlen_func takes it: q [Tq, H, D], k/v [Tk, Hkv, D] with the
    sequences packed along dimension 0, cu_seqlens_q / cu_seqlens_k int32 cpu tensors of B + 1 offsets. Every rule of
    flashtq.attention holds within each sequence; returns out [Tq, H, D] and lse [H, Tq] with return_lse=True.
    Differentiable; every backend (cuda: one launch per sequence of the kernel its shape gets)."""
    q, k, v = _as_tensor(q, "q"), _as_tensor(k, "k"), _as_tensor(v, "v")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise error(name, f"must be 3-D [T, heads, D] (the sequences packed), got shape {tuple(t.shape)}")
    cu_q = _as_tensor(cu_seqlens_q, "cu_seqlens_q")
    cu_q = _host_int32(cu_q, "cu_seqlens_q", (max(cu_q.numel(), 2),))
    cu_k = _host_int32(cu_seqlens_k, "cu_seqlens_k", tuple(cu_q.shape))
    for name, x in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k), ("window", window)):
        if not isinstance(x, int) or isinstance(x, bool):
            raise error(name, f"must be an integer, got {x!r}")
    _check_seed(seed)
    _check_softcap(softcap)
    H = q.shape[1]
    sinks = _prepare_sinks(sinks, H, q.device)
    out, lse = torch.ops.flashtq.attention_forward(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), None,
                                                   None if scale is None else float(scale), bool(causal), causal_offset,
                                                   window, float(dropout_p), seed, float(softcap), sinks, cu_q, cu_k,
                                                   max_seqlen_q, max_seqlen_k, False, backend or "")
    return (out[0], lse[0]) if return_lse else out[0]


def _page_tables(page_table, seq_lens_k, B: int, like):
    """The page table [B, max_pages] and lengths [B] (int32) where the backend of `like`'s device reads them: on the
    device for CUDA tensors (moved there if given on the CPU; SPEC §1.7's device tables), on the CPU otherwise.
    Returns (table, lengths, on_device)."""
    table = _as_tensor(page_table, "page_table")
    if not like.is_cuda:
        table = _host_int32(table, "page_table", (B, table.shape[-1] if table.dim() == 2 else 0))
        return table, _host_int32(seq_lens_k, "seq_lens_k", (B,)), False
    lengths = _as_tensor(seq_lens_k, "seq_lens_k")
    for name, t in (("page_table", table), ("seq_lens_k", lengths)):
        if t.dtype != torch.int32:
            raise error(name, f"must be int32, got {t.dtype}")
    table, lengths = table.to(like.device).contiguous(), lengths.to(like.device).contiguous()
    if table.dim() != 2 or table.shape[0] != B:
        raise error("page_table", f"must be [B = {B}, max_pages], got shape {tuple(table.shape)}")
    if tuple(lengths.shape) != (B,):
        raise error("seq_lens_k", f"must be [B = {B}], got shape {tuple(lengths.shape)}")
    return table, lengths, True


def attention_paged(q, k_pages, v_pages, page_table, seq_lens_k, *, causal: bool = False, window: int = 0,
                    scale: Optional[float] = None, softcap: float = 0.0, sinks=None, return_lse: bool = False,
                    backend: Optional[str] = None):
    """Attention over keys and values in pages (SPEC §1.7), forward only: q [B, Sq, H, D]; k_pages / v_pages
    [num_pages, page_size, Hkv, D]; page_table int32 [B, max_pages]; seq_lens_k int32 [B]. Key j of sequence b is
    row j % page_size of page page_table[b, j // page_size]; causal alignment is bottom-right per sequence. CPU
    tensors: the table is checked whole. CUDA tensors: the table and lengths are read on the device (moved there if
    given on the CPU), unchecked and clamped (SPEC §1.7); cuda serves decode shapes (a few query rows per kv head)."""
    q, k_pages, v_pages = _as_tensor(q, "q"), _as_tensor(k_pages, "k_pages"), _as_tensor(v_pages, "v_pages")
    for name, t in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages)):
        if t.dim() != 4:
            raise error(name, f"must be 4-D, got shape {tuple(t.shape)}")
    B, Sq, H, _ = q.shape
    table, lengths, on_device = _page_tables(page_table, seq_lens_k, B, q)
    _check_softcap(softcap)
    sinks = _prepare_sinks(sinks, H, q.device)
    out = q.new_empty(q.shape)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    allocate, _keep = _workspace_for(q)
    with _device_scope(q):
        _ext.forward(backend_for(q, backend or None), view(q, "q"), view(k_pages, "k_pages"), view(v_pages, "v_pages"),
                     view(out, "out"), lse.data_ptr(), None if scale is None else float(scale), bool(causal), None,
                     window, 0, (0, 0, 0, 0), 0, 0.0, 0, float(softcap), _pointer(sinks), 0, 0, 0, 0, 0,
                     table.data_ptr(), table.shape[1], lengths.data_ptr(), stream_of(q), on_device, allocate)
    return (out, lse) if return_lse else out


def paged_kv_append(k_pages, v_pages, page_table, seq_lens_k, k, v, *, backend: Optional[str] = None) -> None:
    """Writes row t of k / v [B, T, Hkv, D] for sequence b at position seq_lens_k[b] + t of its pages (SPEC §1.7),
    in place; the caller then adds T to seq_lens_k. CPU tensors: refused before any write when a row's page does not
    exist. CUDA tensors: the table and lengths are read on the device (moved there if given on the CPU), clamped as
    attention_paged clamps them, and a row past the table's reach is not written."""
    k_pages, v_pages, k, v = (_as_tensor(x, n) for x, n in ((k_pages, "k_pages"), (v_pages, "v_pages"), (k, "k"),
                                                              (v, "v")))
    table, lengths, on_device = _page_tables(page_table, seq_lens_k, k.shape[0], k_pages)
    with _device_scope(k_pages):
        _ext.paged_kv_append(backend_for(k_pages, backend or None), view(k_pages, "k_pages"), view(v_pages, "v_pages"),
                             table.data_ptr(), table.shape[1], lengths.data_ptr(), view(k, "k"), view(v, "v"),
                             stream_of(k_pages), on_device)
