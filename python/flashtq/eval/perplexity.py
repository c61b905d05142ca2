"""Perplexity over non-overlapping windows of the held-out text, exact and through each packed cache."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from flashtq.eval import baselines
from flashtq.hf import TurboQuantCache


def make_cache(model, config: str, length: int, calibration: Optional[list] = None):
    """The cache a configuration names: a packed TurboQuant cache (outlier channels chosen from `calibration`, a
    list of per-layer keys, where the configuration has them), or an outside baseline's (flashtq.eval.baselines)."""
    if baselines.is_baseline(config):
        return baselines.BaselineCache(model.config, config)
    return TurboQuantCache(model.config, config, max_length=length, device=model.device.type, calibration=calibration)


def windows(token_ids: list[int], ctx: int, count: int, prefix: list[int] = ()) -> list[torch.Tensor]:
    """The first `count` non-overlapping windows of `ctx` tokens (fewer if the text is shorter), each
    starting with `prefix` (the model's <bos>, where it needs one) followed by the next text tokens."""
    step = ctx - len(prefix)
    n = min(count, len(token_ids) // step)
    return [torch.tensor(list(prefix) + token_ids[i * step:(i + 1) * step]).unsqueeze(0) for i in range(n)]


@torch.no_grad()
def window_nll(model, ids: torch.Tensor, config: Optional[str], chunk: int = 0,
               calibration: Optional[list] = None) -> tuple[float, int]:
    """(sum of next-token NLL, tokens predicted) of one window: exact attention when config is None, else the
    window fed through a packed cache of that config in chunks of `chunk` tokens (0: one chunk), each chunk's
    keys and values appended before its queries attend. Small chunks judge a configuration as decoding does:
    with exact recent tokens (w<W>), a query of a chunk of c tokens sees at least W - c + 1 of its last
    tokens exact, as a decode step (c = 1) sees W."""
    ids = ids.to(model.device)
    if config is None:
        logits = model(ids, use_cache=False).logits
    else:
        cache = make_cache(model, config, ids.shape[1], calibration)
        step = chunk or ids.shape[1]
        logits = torch.cat([model(ids[:, i:i + step], past_key_values=cache, use_cache=True).logits
                            for i in range(0, ids.shape[1], step)], 1)
    nll = F.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="sum")
    return float(nll), ids.shape[1] - 1
