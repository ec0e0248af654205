"""PyTorch twin of flax_transformer: same architecture, same names, same mask convention."""

from .model import (
    Decoder,
    DecoderBlock,
    Encoder,
    EncoderBlock,
    FeedForward,
    MultiHeadAttention,
    PositionalEncoding,
    Transformer,
    TransformerLM,
    load_numpy_state,
    make_causal_mask,
    make_padding_mask,
    numpy_to_tensor,
    scaled_dot_product_attention,
    state_dict_to_numpy,
    tensor_to_numpy,
)

__all__ = [
    "Decoder",
    "DecoderBlock",
    "Encoder",
    "EncoderBlock",
    "FeedForward",
    "MultiHeadAttention",
    "PositionalEncoding",
    "Transformer",
    "TransformerLM",
    "load_numpy_state",
    "make_causal_mask",
    "make_padding_mask",
    "numpy_to_tensor",
    "scaled_dot_product_attention",
    "state_dict_to_numpy",
    "tensor_to_numpy",
]
