"""flashtq: exact FlashAttention and attention over a TurboQuant-compressed KV cache."""
from flashtq._flashtq import FlashTQError, __version__
