"""Hugging Face transformers integration (transformers==5.17.0).

Importing this module registers attn_implementation="flashtq" (attention function and mask function).
With a regular cache (or none) it is exact attention through flashtq.attention; with
flashtq.hf.TurboQuantCache as past_key_values, every layer appends its new keys and values to the packed
cache and attends over the packed words.
"""
from flashtq.hf.attention import flashtq_attention_forward, flashtq_mask, register
from flashtq.hf.cache import TurboQuantCache, TurboQuantLayer, calibration_keys

register()

__all__ = ["TurboQuantCache", "TurboQuantLayer", "calibration_keys", "flashtq_attention_forward", "flashtq_mask", "register"]
