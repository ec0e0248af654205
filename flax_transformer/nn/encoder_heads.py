"""What an encoder-only model (BERT, RoBERTa, DistilBERT) puts on its last hidden states: the
pooler and the heads of config.head (spec.config.ENCODER_HEADS), and its token positions.

Params: `pooler` (dense + tanh on the first token), `head` (`classifier`, `pre_classifier`;
masked LM: `dense`, `norm`, `bias`). The torch twin is torch_reference/encoder_heads.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer.nn.dropout import Dropout
from flax_transformer.nn.layers import Dense, LayerNorm, activation_fn, with_axes
from flax_transformer.spec.config import TransformerConfig


def skip_padding_positions(tokens: jax.Array, pad_id: int) -> jax.Array:
    """config.positions_skip_padding: the k-th non-pad token of a row has position k - 1, a pad
    token -1 (RoBERTa's create_position_ids_from_input_ids, less its offset)."""
    real = (tokens != pad_id).astype(jnp.int32)
    return jnp.cumsum(real, axis=1) * real - 1


def _dense(cfg: TransformerConfig, features: int, axes, name: str) -> Dense:
    return Dense(features, dtype=cfg.dtype, param_dtype=cfg.param_dtype, axes=axes, name=name)


class Pooler(nn.Module):
    """tanh(dense(x[:, 0])): the first token's last hidden state -> (batch, d_model). Param
    `dense` (BERT's pooler.dense)."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        return jnp.tanh(_dense(cfg, cfg.d_model, ("embed", "embed_out"), "dense")(x[:, 0]))


class EncoderHead(nn.Module):
    """config.head on the last hidden states `x` (batch, len, d_model), the pooler output
    `pooled` (or None) and the token embedding `embed` (the masked LM's tied decoder):
    (batch, num_labels) for a sequence head, (batch, len, num_labels) for "token",
    (batch, len, src_vocab_size) for "masked_lm". Dropout before each classifier, as
    transformers."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, x, pooled, embed: nn.Embed, *, deterministic: bool = True):
        cfg = self.config
        head = cfg.head
        dropout = Dropout(cfg.dropout_rate)
        classifier = _dense(cfg, cfg.num_labels, ("embed", "labels"), "classifier")
        if head == "sequence_pooled":
            return classifier(dropout(pooled, deterministic=deterministic))
        if head in ("sequence_tanh", "sequence_relu"):
            h = dropout(x[:, 0], deterministic=deterministic)
            h = _dense(cfg, cfg.d_model, ("embed", "embed_out"), "pre_classifier")(h)
            h = jnp.tanh(h) if head == "sequence_tanh" else jax.nn.relu(h)
            return classifier(dropout(h, deterministic=deterministic))
        if head == "token":
            return classifier(dropout(x, deterministic=deterministic))
        if head == "masked_lm":
            h = activation_fn(cfg.activation)(
                _dense(cfg, cfg.d_model, ("embed", "embed_out"), "dense")(x)
            )
            h = LayerNorm(
                epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                name="norm",
            )(h)  # fmt: skip
            init = with_axes(nn.initializers.zeros, ("vocab",))
            bias = self.param("bias", init, (cfg.src_vocab_size,), cfg.param_dtype)
            return embed.attend(h) + bias.astype(h.dtype)
        raise ValueError(f"config.head {head!r} has no head module (one of the ENCODER_HEADS)")
