"""The Transformer of "Attention Is All You Need" in JAX/Flax, with a PyTorch twin."""

from .attention import (
    MultiHeadAttention,
    combine_masks,
    make_causal_mask,
    make_padding_mask,
    scaled_dot_product_attention,
)
from .config import TransformerConfig
from .model import Decoder, Encoder, Transformer, TransformerLM

__all__ = [
    "Decoder",
    "Encoder",
    "MultiHeadAttention",
    "Transformer",
    "TransformerConfig",
    "TransformerLM",
    "combine_masks",
    "make_causal_mask",
    "make_padding_mask",
    "scaled_dot_product_attention",
]
