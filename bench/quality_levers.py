"""Which quality levers of SPEC §2.6 pay, measured on the real models before any is built into the library.

A simulation, not the library: keys and values a model writes are encoded and decoded with TurboQuant's
arithmetic (randomized Hadamard rotation, the Lloyd-Max codebook of SPEC §2, f16 norms; keys MSE-only) plus the
levers named in a configuration, and attention is exact over the result. A lever that pays here is then built
into the library and measured again by `python -m flashtq.eval` (docs/quality.md).

Configuration names, '+'-separated: k<b>v<c> (bits of key and value codes), nc (norm correction), kg<G> / vg<G>
(key / value block means over G timesteps, f16), kp<G> (causal key block means: each block takes the
mean of the block before it, so a row can be encoded as it arrives), s<S> (first S timesteps exact), w<W> (each query sees its last W
timesteps exact, as a decode step would with a recent window of W), ko<N>[x<E>] (N outlier key channels, chosen
per (layer, kv head) by RMS, at E more bits (default 1), their own rotation and norm; the other channels split into
power-of-two parts in order of RMS, each with its own rotation and norm, as the library would store them), ks<G>
(key block scales: after the block mean, each channel divided by its RMS over the block of G timesteps, f16,
multiplied back after decoding; KIVI's per-channel ranges inside TurboQuant), kc<T>
(outliers chosen from the window's first T timesteps only, as a calibration on the prompt would; default the whole
window), sm (channel smoothing: per-channel scales balancing queries and keys, equal within RoPE pairs);
kk<b>g<G> (keys coded as KIVI codes them, per channel over groups of G timesteps at b bits with an f16 scale and
zero point, the values as TurboQuant codes them: which half of KIVI's advantage is its keys); k16 / v16 exact keys /
values; kivi<b> is the outside baseline of `flashtq.eval.baselines` (keys per channel over groups of 32 timesteps, values
per token over groups of 32 channels), in the same run so that the levers stand beside it.

    python bench/quality_levers.py --model smollm2 --ctx 2048 --windows 3 --configs k4v3,k4v3+kg32
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from flashtq import corpora, models
from flashtq.eval import baselines, perplexity
from flashtq.eval.stats import relative_change_ci

_CODEBOOKS: dict = {}


def codebook(bits: int, dim: int) -> torch.Tensor:
    """Lloyd-Max centroids for one coordinate of a random unit vector in R^dim (SPEC §2), on a fine grid."""
    key = (bits, dim)
    if key not in _CODEBOOKS:
        x = np.linspace(-1, 1, 400001)[1:-1]
        w = np.exp((dim - 3) / 2 * np.log1p(-x * x))
        c = np.quantile(np.random.default_rng(0).standard_normal(4096) / math.sqrt(dim), np.linspace(0.05, 0.95, 2**bits))
        for _ in range(400):
            b = (c[1:] + c[:-1]) / 2
            idx = np.searchsorted(b, x)
            c = np.bincount(idx, weights=w * x, minlength=2**bits) / np.bincount(idx, weights=w, minlength=2**bits)
        _CODEBOOKS[key] = torch.tensor(c, dtype=torch.float32)
    return _CODEBOOKS[key]


def hadamard(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def tq(x: torch.Tensor, bits: int, signs: torch.Tensor, norm_correct: bool) -> torch.Tensor:
    """x [..., D] through TurboQuant MSE encode and decode (f16 norm)."""
    d = x.shape[-1]
    h = hadamard(d).to(x)
    n = x.norm(dim=-1, keepdim=True)
    u = x / n.clamp_min(1e-12)
    r = (u * signs) @ h.T
    cb = codebook(bits, d).to(x)
    idx = torch.bucketize(r, (cb[1:] + cb[:-1]) / 2, right=True)
    c = cb[idx]
    if norm_correct:
        n = n / c.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    n = n.half().float()
    return torch.where(n > 1e-12, (c @ h) * signs * n, torch.zeros_like(x))


def block_mean(x: torch.Tensor, g: int) -> torch.Tensor:
    """Per-block mean over g consecutive timesteps of x [B, H, S, D] (a trailing partial block over its own rows), f16."""
    B, H, S, D = x.shape
    full = S // g * g
    parts = []
    if full:
        parts.append(x[:, :, :full].reshape(B, H, S // g, g, D).mean(3, keepdim=True).expand(B, H, S // g, g, D)
                     .reshape(B, H, full, D))
    if full < S:
        parts.append(x[:, :, full:].mean(2, keepdim=True).expand(B, H, S - full, D))
    return torch.cat(parts, 2).half().float()


def previous_block_mean(x: torch.Tensor, g: int) -> torch.Tensor:
    """Causal block means: each block of g timesteps of x [B, H, S, D] takes the mean of the block before it (the
    first block none), so a row can be encoded when it arrives; f16."""
    mean = block_mean(x, g)
    out = torch.zeros_like(mean)
    out[:, :, g:] = mean[:, :, : mean.shape[2] - g]
    full = x.shape[2] // g * g
    if full < x.shape[2] and full >= g:  # the trailing partial block follows the last full one
        out[:, :, full:] = mean[:, :, full - 1: full]
    return out


def outlier_parts(d: int, outliers: int) -> list[int]:
    """Part sizes: the outliers, then the rest of d as powers of two, largest first (each part a Hadamard size)."""
    rest, parts = d - outliers, [outliers]
    while rest:
        parts.append(1 << (rest.bit_length() - 1))
        rest -= parts[-1]
    return parts


class Lever:
    def __init__(self, name: str):
        self.name = name
        self.kb = self.vb = 16
        self.nc = self.sm = False
        self.kp = 0
        self.kg = self.vg = self.ks = self.sinks = self.recent = self.ko = self.kc = 0
        self.ko_extra = 1
        self.kivi = 0
        self.kk_bits = self.kk_group = 0
        self.kx = self.vx = None  # layers whose keys (values) get one more bit: "g" = full-attention ones, or "0.17"
        for part in filter(None, name.split("+")):
            if m := re.fullmatch(r"k(\d+)v(\d+)", part):
                self.kb, self.vb = int(m[1]), int(m[2])
            elif m := re.fullmatch(r"kivi(\d)", part):
                self.kivi = int(m[1])
            elif m := re.fullmatch(r"kk(\d)g(\d+)", part):
                self.kk_bits, self.kk_group = int(m[1]), int(m[2])
            elif part == "nc":
                self.nc = True
            elif part == "sm":
                self.sm = True
            elif m := re.fullmatch(r"ko(\d+)x(\d)", part):
                self.ko, self.ko_extra = int(m[1]), int(m[2])
            elif m := re.fullmatch(r"(kx|vx)([\d.]+|g)", part):
                setattr(self, m[1], m[2])
            elif m := re.fullmatch(r"(kg|kp|ks|vg|s|w|ko|kc)(\d+)", part):
                setattr(self, {"kg": "kg", "kp": "kp", "ks": "ks", "vg": "vg", "s": "sinks", "w": "recent",
                               "ko": "ko", "kc": "kc"}[m[1]],
                        int(m[2]))
            else:
                raise SystemExit(f"unknown lever {part!r} in {name!r}")

    def bytes_per_token(self, d: int, ctx: int) -> float:
        if self.kivi:
            return baselines.bytes_per_token_per_head(f"kivi{self.kivi}", d)
        parts = len(outlier_parts(d, self.ko)) if self.ko else 1
        group = self.kg or self.kp
        keys = d * self.kb / 8 + 4 + self.ko * self.ko_extra / 8 + 2 * (parts - 1) + (2 * d / group if group else 0) \
            + (2 * d / self.ks if self.ks else 0)
        if self.kk_bits:
            keys = d * self.kk_bits / 8 + 4 * d / self.kk_group
        if self.kb == 16:
            keys = 2 * d
        values = d * self.vb / 8 + 4 + (2 * d / self.vg if self.vg else 0) if self.vb < 16 else 2 * d
        exact = min(self.sinks + self.recent, ctx) / ctx
        return (1 - exact) * (keys + values) + exact * 4 * d

    def encode(self, x: torch.Tensor, bits: int, group: int, signs: torch.Tensor, outliers: int,
               causal: bool = False, scale_group: int = 0) -> torch.Tensor:
        mean = (previous_block_mean if causal else block_mean)(x, group) if group else torch.zeros_like(x)
        r = x - mean
        if scale_group:
            scale = block_mean(r * r, scale_group).sqrt().clamp_min(1e-4).half().float()
            return self.encode(r / scale, bits, 0, signs, outliers) * scale + mean
        if not outliers:
            return tq(r, bits, signs, self.nc) + mean
        d = x.shape[-1]
        calib = r[:, :, : self.kc] if self.kc else r
        order = calib.pow(2).mean(2).argsort(-1, descending=True)  # [B, H, D]: channels by RMS
        out = torch.empty_like(r)
        for b in range(x.shape[0]):
            for h in range(x.shape[1]):
                start = 0
                for i, size in enumerate(outlier_parts(d, outliers)):
                    sel = order[b, h, start:start + size]
                    start += size
                    out[b, h][:, sel] = tq(r[b, h][:, sel], bits + (self.ko_extra if i == 0 else 0),
                                           signs[:size], self.nc)
        return out + mean


def smoothing(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Per (kv head, channel) scales s [1, Hkv, 1, D]: q∘s and k/s get equal RMS; equal within each RoPE pair (i, i + D/2)."""
    B, H, S, D = q.shape
    hkv = k.shape[1]
    qr = q.reshape(B, hkv, H // hkv, S, D).pow(2).mean((0, 2, 3)).sqrt()
    kr = k.pow(2).mean((0, 2)).sqrt()
    s = (kr / qr.clamp_min(1e-6)).clamp_min(1e-6).sqrt()
    s = (s[:, : D // 2] * s[:, D // 2:]).sqrt().repeat(1, 2)
    return s[None, :, None, :]


def make_attention(lever: Lever):
    gen = torch.Generator().manual_seed(1234)
    signs_by_layer: dict = {}

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                  softcap=None, is_causal=None, **kwargs):
        layer = getattr(module, "layer_idx", 0)
        d = key.shape[-1]
        if layer not in signs_by_layer:
            signs_by_layer[layer] = torch.where(torch.rand(d, generator=gen) < 0.5, -1.0, 1.0)
        signs = signs_by_layer[layer].to(key)
        q, k, v = query.float(), key.float(), value.float()
        def boosted(rule):
            return rule == "g" and not sliding_window or rule not in (None, "g") and str(layer) in rule.split(".")

        kb = lever.kb + boosted(lever.kx)
        vb = lever.vb + boosted(lever.vx)
        if lever.kivi:
            kq, vq = baselines.keys_per_channel(k, lever.kivi), baselines.values_per_token(v, lever.kivi)
        elif lever.kk_bits:
            kq = baselines.keys_per_channel(k, lever.kk_bits, lever.kk_group)
        elif lever.sm:
            s = smoothing(q, k)
            kq = lever.encode(k / s, kb, lever.kg, signs, lever.ko) * s
        else:
            kq = (lever.encode(k, kb, lever.kg or lever.kp, signs, lever.ko, bool(lever.kp), lever.ks)
                  if lever.kb < 16 else k)
        if not lever.kivi:
            vq = lever.encode(v, vb, lever.vg, signs, 0) if lever.vb < 16 else v
        B, H, S, D = q.shape
        hkv = k.shape[1]
        rep = H // hkv
        k, kq, v, vq = (t.repeat_interleave(rep, 1) for t in (k, kq, v, vq))
        i = torch.arange(S, device=q.device)[:, None]
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        visible = j <= i
        if sliding_window:
            visible &= j > i - sliding_window
        exact = (j < lever.sinks) | (j > i - lever.recent)
        se = q @ k.transpose(-1, -2) * scaling
        sq = q @ kq.transpose(-1, -2) * scaling
        s = torch.where(exact, se, sq).masked_fill(~visible, float("-inf"))
        p = s.softmax(-1)
        out = (p * exact) @ v + (p * ~exact) @ vq
        return out.transpose(1, 2).to(query.dtype), None

    return attention


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2")
    p.add_argument("--corpus", default="devil")
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--configs", required=True)
    p.add_argument("--output", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--model-path", default=None, help="a GGUF file instead of the packaged one")
    p.add_argument("--corpus-path", default=None,
                   help="the corpus file instead of the packaged one (a .txt file: the text itself), as the "
                        "evaluation takes it")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    model, tok = models.load(args.model, args.model_path, attn_implementation="eager")
    model = model.to(args.device)
    text = corpora.held_out(corpora.load_text(args.corpus, args.corpus_path))
    ids = tok(text, add_special_tokens=False).input_ids
    wins = perplexity.windows(ids, args.ctx, args.windows, models.prefix_ids(args.model, tok))
    text_config = model.config.get_text_config()
    d = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads

    def nll(name):
        AttentionInterface.register("lever", make_attention(Lever(name)))
        AttentionMaskInterface.register("lever", lambda *a, **k: None)
        model.config._attn_implementation = "lever"
        for m in model.modules():
            if hasattr(m, "config") and hasattr(m.config, "_attn_implementation"):
                m.config._attn_implementation = "lever"
        out = []
        for w in wins:
            w = w.to(args.device)
            logits = model(w, use_cache=False).logits
            out.append(float(F.cross_entropy(logits[0, :-1].float(), w[0, 1:], reduction="mean")))
        return out

    t0 = time.time()
    exact = nll("")
    rows = []
    print(f"{args.model} {args.corpus} ctx {args.ctx} x {len(wins)}: exact ppl {math.exp(np.mean(exact)):.3f}", flush=True)
    for name in args.configs.split(","):
        got = nll(name)
        rel, lo, hi = relative_change_ci([a - b for a, b in zip(got, exact)])
        lv = Lever(name)
        bpt = lv.bytes_per_token(d, args.ctx)
        rows.append({"name": name, "rel": rel, "lo": lo, "hi": hi, "bytes_per_token_per_head": bpt,
                     "vs_bf16": 4 * d / bpt})
        print(f"{name:28} {4 * d / bpt:5.2f}x {100 * rel:+7.2f} % [{100 * lo:+.2f}, {100 * hi:+.2f}]  "
              f"({time.time() - t0:.0f} s)", flush=True)
    if args.output:
        json.dump({"model": args.model, "corpus": args.corpus, "ctx": args.ctx, "windows": len(wins), "rows": rows,
                   "command": " ".join(sys.argv)}, open(args.output, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
