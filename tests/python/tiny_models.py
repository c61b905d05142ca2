"""Tiny randomly initialised transformers models built from configs (no weights anywhere)."""
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM


def llama(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


def gemma3(seed: int, sliding_window: int = 8) -> Gemma3ForCausalLM:
    """Gemma 3's features at toy size: head_dim 256 (as the 270M model), query_pre_attn_scalar scaling,
    q/k norms, sliding-window layers mixed with a global one."""
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=128,
                           sliding_window=sliding_window, max_position_embeddings=256,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    return Gemma3ForCausalLM(cfg).eval()
