"""Long-context retrieval: a pass key planted at several depths of corpus text, then asked for."""
from __future__ import annotations

import random
from typing import Optional

import torch
from transformers import DynamicCache

from flashtq.eval.perplexity import make_cache

QUESTION = "\n\nWhat is the pass key? The pass key is"


def needle(key: str) -> str:
    return f"\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"


def prompt_ids(tokenizer, filler_ids: list[int], ctx: int, depth: float, key: str, prefix: list[int] = ()) -> torch.Tensor:
    """ctx tokens: prefix, filler text with the needle at `depth` (0 = start, 1 = end), then the question."""
    n_ids = tokenizer(needle(key), add_special_tokens=False).input_ids
    q_ids = tokenizer(QUESTION, add_special_tokens=False).input_ids
    room = ctx - len(n_ids) - len(q_ids) - len(prefix)
    body = filler_ids[:room]
    at = int(len(body) * depth)
    return torch.tensor(list(prefix) + body[:at] + n_ids + body[at:] + q_ids).unsqueeze(0)


@torch.no_grad()
def answer(model, tokenizer, ids: torch.Tensor, config: Optional[str], new_tokens: int = 8) -> str:
    ids = ids.to(model.device)
    length = ids.shape[1] + new_tokens
    cache = DynamicCache() if config is None else make_cache(model, config, length)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                         past_key_values=cache, pad_token_id=tokenizer.eos_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def pass_keys(count: int, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    return [str(rng.randrange(10000, 99999)) for _ in range(count)]
