"""`python -m flashtq.eval`: TurboQuant's quality on real models (perplexity and long-context retrieval)."""
