"""Encoder and decoder blocks in both LayerNorm placements.

Post-LN (the paper, norm_first=False):  x = norm(x + dropout(sublayer(x)))
Pre-LN  (norm_first=True):              x = x + dropout(sublayer(norm(x)))
"""

from __future__ import annotations

import jax
from flax import linen as nn

from flax_transformer.nn.attention import MultiHeadAttention
from flax_transformer.nn.dropout import Dropout
from flax_transformer.nn.layers import RELATIVE_BIAS, FeedForward, RelativePositionBias, layer_norm
from flax_transformer.spec.config import TransformerConfig


def self_attention_bias(module: nn.Module, relative, bias, bidirectional: bool):
    """The block's relative position bias: its own (`relative_bias`, from the relative
    positions) when config.relative_attention_per_layer, else the stack's `bias` (or None)."""
    cfg = module.config
    if cfg.relative_attention_per_layer and relative is not None:
        return RelativePositionBias(cfg, bidirectional, name=RELATIVE_BIAS)(relative)
    return bias


def residual(
    config: TransformerConfig, norm: nn.Module, x, sublayer, deterministic: bool, out_norm=None
):
    """Apply `sublayer` with dropout, residual add and `norm` in the config's placement;
    `out_norm` (pre-LN with config.sublayer_output_norm) on the sublayer's output, before the
    dropout and the add."""
    dropout = Dropout(config.dropout_rate)
    if config.norm_first:
        out = sublayer(norm(x))
        if out_norm is not None:
            out = out_norm(out)
        return x + dropout(out, deterministic=deterministic)
    return norm(x + dropout(sublayer(x), deterministic=deterministic))


class EncoderBlock(nn.Module):
    """Self-attention, then the feed-forward network. Params: self_attn, norm1, ffn, norm2
    (and relative_bias with config.relative_attention_per_layer).

    The decoder-only TransformerLM uses this block too, with a causal mask (and a causal
    relative position bias: bidirectional=False). `relative` (batch | 1, q_len, k_len) are the
    relative positions, `bias` the stack's relative position bias (None: none), `positions`
    (batch | 1, len) the tokens' positions for rotary embeddings; `sliding_window` the
    self-attention's window (None: none).
    """

    config: TransformerConfig
    bidirectional: bool = True
    sliding_window: int | None = None

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        mask: jax.Array | None = None,
        deterministic: bool = True,
        decode: bool = False,
        relative: jax.Array | None = None,
        bias: jax.Array | None = None,
        positions: jax.Array | None = None,
    ) -> jax.Array:
        cfg = self.config
        bias = self_attention_bias(self, relative, bias, self.bidirectional)
        self_attn = MultiHeadAttention(cfg, sliding_window=self.sliding_window, name="self_attn")
        ffn = FeedForward(cfg, name="ffn")
        x = residual(
            cfg,
            layer_norm(cfg, "norm1"),
            x,
            lambda h: self_attn(
                h,
                mask=mask,
                deterministic=deterministic,
                decode=decode,
                bias=bias,
                positions=positions,
            ),
            deterministic,
            out_norm=self._out_norm("attn_out_norm"),
        )
        return residual(
            cfg,
            layer_norm(cfg, "norm2"),
            x,
            lambda h: ffn(h, deterministic=deterministic),
            deterministic,
            out_norm=self._out_norm("ffn_out_norm"),
        )

    def _out_norm(self, name: str):
        """A sublayer's output norm (config.sublayer_output_norm), or None."""
        cfg = self.config
        return layer_norm(cfg, name) if cfg.sublayer_output_norm and cfg.norm_first else None


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, feed-forward network.

    Params: self_attn, norm1, cross_attn, norm2, ffn, norm3 (and relative_bias with
    config.relative_attention_per_layer: the self-attention's, causal). In decode mode
    `encoded` may be None after the first call: the cross-attention keys/values come from the
    cache. `relative` and `bias` as in EncoderBlock.
    """

    config: TransformerConfig

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        encoded: jax.Array | None,
        self_mask: jax.Array | None = None,
        cross_mask: jax.Array | None = None,
        deterministic: bool = True,
        decode: bool = False,
        relative: jax.Array | None = None,
        bias: jax.Array | None = None,
    ) -> jax.Array:
        cfg = self.config
        bias = self_attention_bias(self, relative, bias, bidirectional=False)
        self_attn = MultiHeadAttention(cfg, name="self_attn")
        cross_attn = MultiHeadAttention(cfg, name="cross_attn")
        ffn = FeedForward(cfg, name="ffn")
        x = residual(
            cfg,
            layer_norm(cfg, "norm1"),
            x,
            lambda h: self_attn(
                h, mask=self_mask, deterministic=deterministic, decode=decode, bias=bias
            ),
            deterministic,
        )
        x = residual(
            cfg,
            layer_norm(cfg, "norm2"),
            x,
            lambda h: cross_attn(
                h,
                encoded,
                mask=cross_mask,
                deterministic=deterministic,
                decode=decode,
                is_cross=True,
            ),
            deterministic,
        )
        return residual(
            cfg,
            layer_norm(cfg, "norm3"),
            x,
            lambda h: ffn(h, deterministic=deterministic),
            deterministic,
        )
