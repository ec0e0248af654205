"""Autoregressive decoding: KV-cached greedy, sampling and beam search; the generate CLI."""
