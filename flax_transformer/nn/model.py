"""Encoder / decoder stacks and the three models: Transformer (seq2seq), TransformerLM and the
bare TransformerEncoder.

Parameter names follow the canonical table in docs/architecture.md (Flax path
a/layers_3/b/kernel <-> torch key a.layers.3.b.weight), so conversion is one rule.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.nn.attention import combine_masks, make_causal_mask, make_padding_mask
from flax_transformer.nn.blocks import DecoderBlock, EncoderBlock
from flax_transformer.nn.dropout import Dropout
from flax_transformer.nn.encoder_heads import EncoderHead, Pooler, skip_padding_positions
from flax_transformer.nn.layers import (
    RELATIVE_BIAS,
    Dense,
    LogitsBias,
    PositionalEncoding,
    RelativePositionBias,
    layer_norm,
    with_axes,
)
from flax_transformer.nn.token_ids import as_token_array, check_same_batch, check_token_ids
from flax_transformer.spec.config import TransformerConfig, check_config_for_kind, sliding_layer
from flax_transformer.spec.kinds import ENCODER, LM, SEQ2SEQ


def check_tokens(name: str, tokens: jax.Array, max_len: int, vocab: int | None = None) -> None:
    """Shape checks that run at trace time, so bad input fails here and not deep inside XLA;
    outside jit (concrete values) the ids are checked against `vocab` too (token_ids.py)."""
    if tokens.ndim != 2:
        raise ValueError(f"{name} must be (batch, length) token ids, got shape {tokens.shape}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")
    try:
        too_long = tokens.shape[1] > max_len
    except jax.errors.InconclusiveDimensionOperation:
        # A symbolic length (jax.export) with no upper bound: past max_len the position
        # table would be read out of range, so the bound must be declared.
        raise ValueError(
            f"{name} has the symbolic length {tokens.shape[1]}, which may exceed the model's "
            f"max_len {max_len}: declare it, jax.export.symbolic_shape(..., constraints="
            f"['{tokens.shape[1]} <= {max_len}'])"
        ) from None
    if too_long:
        raise ValueError(
            f"{name} has length {tokens.shape[1]}, longer than the model's max_len {max_len}"
        )
    if vocab is not None:
        check_token_ids(name, tokens, vocab)


def check_mask(name: str, mask: jax.Array | None, target: tuple[int, ...]) -> None:
    """A mask must broadcast to `target` = (batch, heads, q_len, k_len)."""
    if mask is None:
        return
    try:  # jnp's, not np's: it accepts symbolic sizes (jax.export with symbolic shapes)
        jnp.broadcast_shapes(mask.shape, target)
    except ValueError:
        raise ValueError(
            f"{name} of shape {mask.shape} does not broadcast to (batch, heads, q_len, k_len) "
            f"= {target}"
        ) from None


def check_positions(name: str, positions, shape: tuple[int, ...]) -> None:
    """Per-token positions, when given, are (batch, len) like the tokens they place."""
    if positions is not None and tuple(np.shape(positions)) != tuple(shape):
        raise ValueError(
            f"{name} must be (batch, len) = {tuple(shape)}, got {tuple(np.shape(positions))}"
        )


def relative_positions(config: TransformerConfig, length: int, offset, positions, decode: bool):
    """Key minus query positions (batch | 1, q_len, k_len) for the relative position bias, or
    None without one. Queries sit at offset.. (the decode cache's index), or at `positions`
    (batch, len) (packed rows); in decode mode the keys are every cache slot from 0 (max_len
    of them; the attention cuts them to the cache's length)."""
    if not config.relative_attention_buckets:
        return None
    if positions is not None:
        if decode:
            raise ValueError(
                "per-token positions are not supported in decode mode with a relative position "
                "bias (relative_attention_buckets): the cache slots are the positions"
            )
        return positions[:, None, :] - positions[:, :, None]
    query = offset + jnp.arange(length)
    key = jnp.arange(config.max_len if decode else length)
    return (key[None, :] - query[:, None])[None]


def stack_bias(module: nn.Module, relative, bidirectional: bool):
    """The stack's shared relative position bias (`relative_bias`), or None (no bias, or one per
    layer: config.relative_attention_per_layer)."""
    cfg = module.config
    if relative is None or cfg.relative_attention_per_layer:
        return None
    return RelativePositionBias(cfg, bidirectional, name=RELATIVE_BIAS)(relative)


def layer_window(config: TransformerConfig, layer: int) -> int | None:
    """Layer `layer`'s sliding window: config.sliding_window where spec.config.sliding_layer
    says it slides, else None (full attention)."""
    return config.sliding_window if sliding_layer(config, layer) else None


def rotary_positions(config: TransformerConfig, length: int, offset, positions):
    """The tokens' positions for rotary embeddings (batch | 1, length): `positions`, else
    offset.. (the decode cache's index); None unless config.positional is "rotary"."""
    if config.positional != "rotary":
        return None
    if positions is not None:
        return positions
    return (offset + jnp.arange(length))[None]


class Encoder(nn.Module):
    """A stack of EncoderBlocks named layers_{i}, then `norm` when config.final_norm; with a
    relative position bias, `relative_bias` (shared by the layers) or one per layer.
    `bidirectional=False`: the decoder-only LM's stack (a causal relative bias)."""

    config: TransformerConfig
    num_layers: int | None = None  # defaults to config.num_encoder_layers
    bidirectional: bool = True

    @nn.compact
    def __call__(
        self,
        x,
        mask=None,
        *,
        deterministic: bool = True,
        decode: bool = False,
        relative=None,
        positions=None,
    ):
        """`positions` (batch | 1, len): the tokens' positions for rotary embeddings."""
        cfg = self.config
        num_layers = cfg.num_encoder_layers if self.num_layers is None else self.num_layers
        block = nn.remat(EncoderBlock, static_argnums=(3, 4)) if cfg.remat else EncoderBlock
        bias = stack_bias(self, relative, self.bidirectional)
        for i in range(num_layers):
            layer = block(cfg, self.bidirectional, layer_window(cfg, i), name=f"layers_{i}")
            x = layer(x, mask, deterministic, decode, relative, bias, positions)
        if cfg.final_norm:
            x = layer_norm(cfg, "norm")(x)
        return x


class Decoder(nn.Module):
    """A stack of DecoderBlocks named layers_{i}, then `norm` when config.final_norm; with a
    relative position bias (causal), `relative_bias` (shared by the layers) or one per layer."""

    config: TransformerConfig

    @nn.compact
    def __call__(
        self,
        x,
        encoded,
        self_mask=None,
        cross_mask=None,
        *,
        deterministic: bool = True,
        decode: bool = False,
        relative=None,
    ):
        cfg = self.config
        block = nn.remat(DecoderBlock, static_argnums=(5, 6)) if cfg.remat else DecoderBlock
        bias = stack_bias(self, relative, bidirectional=False)
        for i in range(cfg.num_decoder_layers):
            x = block(cfg, name=f"layers_{i}")(
                x, encoded, self_mask, cross_mask, deterministic, decode, relative, bias
            )
        if cfg.final_norm:
            x = layer_norm(cfg, "norm")(x)
        return x


class DecodePosition(nn.Module):
    """In decode mode, counts the tokens seen so far, so positions continue from the cache."""

    @nn.compact
    def __call__(self, length: int, decode: bool) -> jax.Array | int:
        if not decode:
            return 0
        initialized = self.has_variable("cache", "index")
        index = self.variable("cache", "index", lambda: jnp.array(0, jnp.int32))
        if not initialized:
            return 0
        offset = index.value
        index.value = offset + length
        return offset


class _EmbeddingsMixin:
    """Token embedding -> optional sqrt(d_model) scale -> positions -> optional LayerNorm
    (config.embed_norm) -> dropout."""

    def _embed(
        self,
        embed: nn.Embed,
        tokens,
        offset,
        deterministic: bool,
        tag: str,
        positions=None,
        token_types=None,
    ):
        cfg = self.config
        x = embed(tokens)  # (batch, len, d_model)
        if cfg.scale_embeddings:
            x = x * jnp.asarray(np.sqrt(cfg.d_model), x.dtype)
        if token_types is not None:  # config.type_vocab_size (the bare encoder's type_embed)
            x = x + self.type_embed(token_types)
        side = tag[:3]  # "src" / "tgt"
        if cfg.positional not in ("none", "rotary"):  # rotary: turned in the attention
            x = self._positions[side](x, offset, positions)
        if cfg.embed_norm:
            x = getattr(self, f"{side}_embed_norm")(x)
        x = self.embed_dropout(x, deterministic=deterministic)
        self.sow("intermediates", tag, x)
        return x

    def _setup_positions(
        self, cfg: TransformerConfig, with_source: bool, with_target: bool = True
    ) -> None:
        # Learned positions own the param `pos_embed.weight` (or one table per stack,
        # src_pos_embed / tgt_pos_embed); sinusoidal ones hold no params; "none" adds nothing.
        if cfg.positional != "learned":
            positions = PositionalEncoding(cfg)
            self._positions = {"src": positions, "tgt": positions}
        elif with_source and cfg.separate_positions:
            self.src_pos_embed = PositionalEncoding(cfg)
            tables = {"src": self.src_pos_embed}
            if with_target:
                self.tgt_pos_embed = PositionalEncoding(cfg)
                tables["tgt"] = self.tgt_pos_embed
            self._positions = tables
        else:
            self.pos_embed = PositionalEncoding(cfg)
            self._positions = {"src": self.pos_embed, "tgt": self.pos_embed}
        self.embed_dropout = Dropout(cfg.dropout_rate)
        if with_target:  # a bare encoder neither decodes nor has logits
            self.decode_position = DecodePosition()
            if cfg.final_logits_bias:
                self.logits_bias = LogitsBias(cfg)

    def _output_logits(self, embed: nn.Embed, x, decode: bool = False):
        if self.config.scale_decoder_output:
            x = x * jnp.asarray(self.config.d_model**-0.5, x.dtype)
        one_row = decode and x.shape[0] * x.shape[1] == 1
        # A table held as int8 or packed (nn.int8_products, nn.f32_products) goes through attend.
        plain = isinstance(embed.embedding, (np.ndarray, jax.Array))
        if self.config.tie_output and one_row and plain:
            logits = _tied_logits_one_row(embed, x)
        elif self.config.tie_output:
            logits = embed.attend(x)  # x @ embedding.T, (batch, len, vocab)
        else:
            logits = self.lm_head(x)
        if self.config.final_logits_bias:
            logits = self.logits_bias(logits)
        cap = self.config.final_logit_softcap
        return logits if cap is None else jnp.tanh(logits / cap) * cap


def _tied_logits_one_row(embed: nn.Embed, x):
    """embed.attend(x) for one row, x (1, 1, d_model) -> (1, 1, vocab), computed as embedding @
    x: a matrix-vector product over the table as it is stored. Written as x @ embedding.T,
    XLA:CPU makes it a vector-matrix product that transposes the whole table (119 MB at
    opus-mt size) on every decoding step. (Several rows go through attend: as fast here.)"""
    query, table = nn.dtypes.promote_dtype(x, embed.embedding, dtype=embed.dtype)
    return (table @ query.reshape(-1)).reshape(query.shape[:-1] + (table.shape[0],))


def _embed_module(cfg: TransformerConfig, vocab: int) -> nn.Embed:
    return nn.Embed(
        vocab,
        cfg.d_model,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        embedding_init=with_axes(
            nn.initializers.normal(stddev=cfg.d_model**-0.5), ("vocab", "embed")
        ),
    )


def _lm_head(cfg: TransformerConfig) -> Dense:
    return Dense(
        cfg.tgt_vocab_size,
        use_bias=cfg.lm_head_bias,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        axes=("embed", "vocab"),
    )


def _embed_norm(cfg: TransformerConfig) -> nn.Module:
    """The norm on the embeddings (config.embed_norm), named by the attribute holding it."""
    return layer_norm(cfg)


def default_target_mask(tokens, config: TransformerConfig):
    """The decoder's mask when none is given: causal, and with config.mask_target_padding the
    pad_id keys hidden too. transformers' decoders are causal only (Marian starts decoding with
    its pad id, which must stay visible)."""
    causal = make_causal_mask(tokens.shape[1])
    if not config.mask_target_padding:
        return causal
    return combine_masks(causal, make_padding_mask(tokens, config.pad_id))


def checked_source(cfg: TransformerConfig, src, src_mask, positions):
    """The source's key mask (default: the tokens that are not pad_id), after checking the
    tokens, the mask and the positions against `cfg` (what every encoder entry point checks)."""
    check_tokens("src", src, cfg.max_len, cfg.src_vocab_size)
    if src_mask is None:
        src_mask = make_padding_mask(src, cfg.pad_id)
    check_mask("src_mask", src_mask, (src.shape[0], cfg.num_heads, src.shape[1], src.shape[1]))
    check_positions("positions", positions, src.shape)
    return src_mask


class Transformer(_EmbeddingsMixin, nn.Module):
    """Encoder-decoder Transformer. `__call__(src, tgt) -> logits (batch, tgt_len, tgt_vocab)`.

    Masks default to padding (from pad_id) for the source and padding + causal for the target.
    `encode` and `decode` are usable through `apply(..., method=...)`.
    """

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        # (no decoder layers: an output that never reads the source)
        check_config_for_kind(cfg, SEQ2SEQ, building=True)
        if cfg.share_embeddings:
            self.shared_embed = _embed_module(cfg, cfg.src_vocab_size)
            self.src_embed_table = self.tgt_embed_table = self.shared_embed
        else:
            self.src_embed = _embed_module(cfg, cfg.src_vocab_size)
            self.tgt_embed = _embed_module(cfg, cfg.tgt_vocab_size)
            self.src_embed_table, self.tgt_embed_table = self.src_embed, self.tgt_embed
        self._setup_positions(cfg, with_source=True)
        if cfg.embed_norm:
            self.src_embed_norm, self.tgt_embed_norm = _embed_norm(cfg), _embed_norm(cfg)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        if not cfg.tie_output:
            self.lm_head = _lm_head(cfg)

    def __call__(
        self,
        src,
        tgt,
        *,
        src_mask=None,
        tgt_mask=None,
        cross_mask=None,
        src_positions=None,
        tgt_positions=None,
        deterministic: bool = True,
    ):
        """Logits (batch, tgt_len, tgt_vocab). Masks default to source padding and causal target;
        cross_mask (the decoder's view of the source) defaults to src_mask. Packed rows
        (training/packing.py) give all three from segment ids, and src_positions /
        tgt_positions (batch, len) restart at 0 for each example."""
        src, tgt = as_token_array("src", src), as_token_array("tgt", tgt)  # lists accepted
        if np.ndim(src) == 2 and np.ndim(tgt) == 2:  # other ranks: check_tokens names them
            check_same_batch(src=src, tgt=tgt)
            check_tokens("tgt", tgt, self.config.max_len, self.config.tgt_vocab_size)  # before work
        if src_mask is None:
            check_tokens("src", src, self.config.max_len, self.config.src_vocab_size)
            src_mask = make_padding_mask(src, self.config.pad_id)
        encoded = self.encode(
            src, src_mask=src_mask, positions=src_positions, deterministic=deterministic
        )
        return self.decode(
            encoded, tgt, src_mask=src_mask if cross_mask is None else cross_mask,
            tgt_mask=tgt_mask, positions=tgt_positions, deterministic=deterministic,
        )  # fmt: skip

    def encode(self, src, *, src_mask=None, positions=None, deterministic: bool = True):
        """(batch, src_len) tokens -> (batch, src_len, d_model). src_mask: key mask, True = real;
        positions (batch, src_len): each token's position (default 0, 1, ...)."""
        cfg = self.config
        src = as_token_array("src", src)
        src_mask = checked_source(cfg, src, src_mask, positions)
        x = self._embed(self.src_embed_table, src, 0, deterministic, "src_embedded", positions)
        relative = relative_positions(cfg, src.shape[1], 0, positions, decode=False)
        return self.encoder(x, src_mask, deterministic=deterministic, relative=relative)

    def decode(
        self,
        encoded,
        tgt,
        *,
        src_mask=None,
        tgt_mask=None,
        positions=None,
        deterministic: bool = True,
        decode: bool = False,
    ):
        """Target tokens (batch, tgt_len) and encoder output -> logits (batch, tgt_len, vocab).

        src_mask is the source key mask (batch, 1, 1, src_len), True on real tokens; None
        attends to every source position. With decode=True the keys/values are cached (see
        MultiHeadAttention); `encoded` is needed on the first call only, tgt_mask then covers
        the cache positions (batch, 1, tgt_len, max_len) and defaults to causal-over-cache.
        """
        cfg = self.config
        tgt = as_token_array("tgt", tgt)
        check_tokens("tgt", tgt, cfg.max_len, cfg.tgt_vocab_size)
        batch, tgt_len = tgt.shape
        if not decode and tgt_mask is None:
            tgt_mask = default_target_mask(tgt, cfg)
        if not decode:
            check_mask("tgt_mask", tgt_mask, (batch, cfg.num_heads, tgt_len, tgt_len))
        if encoded is not None:
            check_same_batch(encoded=encoded, tgt=tgt)
            src_len = encoded.shape[1]
            check_mask("src_mask", src_mask, (batch, cfg.num_heads, tgt_len, src_len))
            if (
                src_mask is not None
                and src_mask.ndim == 4
                and src_mask.shape[2] not in (1, tgt_len)
            ):
                raise ValueError(
                    f"src_mask of shape {src_mask.shape} cannot serve as the cross-attention "
                    f"mask: its query axis must be 1 or tgt_len ({tgt_len})"
                )
        check_positions("positions", positions, tgt.shape)
        offset = self.decode_position(tgt_len, decode)
        x = self._embed(self.tgt_embed_table, tgt, offset, deterministic, "tgt_embedded", positions)
        relative = relative_positions(cfg, tgt_len, offset, positions, decode)
        x = self.decoder(
            x, encoded, tgt_mask, src_mask, deterministic=deterministic, decode=decode,
            relative=relative,
        )  # fmt: skip
        return self._output_logits(self.tgt_embed_table, x, decode)


class TransformerLM(_EmbeddingsMixin, nn.Module):
    """Decoder-only language model: causal self-attention, no cross-attention.

    Params: tgt_embed, decoder.layers_{i}.{self_attn,norm1,ffn,norm2}, decoder.norm (when
    final_norm), lm_head (unless tie_output), pos_embed (when learned). Encoder fields of the
    config are ignored.
    """

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        check_config_for_kind(cfg, LM, building=True)
        self.tgt_embed = _embed_module(cfg, cfg.tgt_vocab_size)
        self._setup_positions(cfg, with_source=False)
        if cfg.embed_norm:
            self.tgt_embed_norm = _embed_norm(cfg)
        self.decoder = Encoder(cfg, num_layers=cfg.num_decoder_layers, bidirectional=False)
        if not cfg.tie_output:
            self.lm_head = _lm_head(cfg)

    def __call__(
        self,
        tokens,
        *,
        mask=None,
        positions=None,
        deterministic: bool = True,
        decode: bool = False,
    ):
        """(batch, len) tokens -> logits (batch, len, vocab). mask defaults to causal (+ padding,
        see default_target_mask); in decode mode it covers the cache positions and defaults to
        causal-over-cache. positions (batch, len): each token's position (left-padded prompts,
        as transformers' position_ids); default: 0.. (continuing from the cache)."""
        cfg = self.config
        tokens = as_token_array("tokens", tokens)  # a list of rows accepted, as numpy would
        check_tokens("tokens", tokens, cfg.max_len, cfg.tgt_vocab_size)
        batch, length = tokens.shape
        if not decode and mask is None:
            mask = default_target_mask(tokens, cfg)
        if not decode:
            check_mask("mask", mask, (batch, cfg.num_heads, length, length))
        check_positions("positions", positions, tokens.shape)
        offset = self.decode_position(length, decode)
        x = self._embed(self.tgt_embed, tokens, offset, deterministic, "tgt_embedded", positions)
        relative = relative_positions(cfg, length, offset, positions, decode)
        x = self.decoder(
            x, mask, deterministic=deterministic, decode=decode, relative=relative,
            positions=rotary_positions(cfg, length, offset, positions),
        )  # fmt: skip
        return self._output_logits(self.tgt_embed, x, decode)


class TransformerEncoder(_EmbeddingsMixin, nn.Module):
    """A bare encoder (model kind "encoder": a T5 encoder used as a text encoder, a BERT):
    `__call__(src) -> the last hidden states (batch, src_len, d_model)`, after the final norm,
    or config.head's output on them (encoder_heads.py).

    Params as the seq2seq Transformer's source side: shared_embed (config.share_embeddings) or
    src_embed, the position table(s) and src_embed_norm the config asks for, encoder; then
    type_embed (config.type_vocab_size), pooler (config.pooler) and head (config.head). The
    decoder fields of the config are ignored.
    """

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        check_config_for_kind(cfg, ENCODER, building=True)
        if cfg.share_embeddings:
            self.shared_embed = _embed_module(cfg, cfg.src_vocab_size)
            self.src_embed_table = self.shared_embed
        else:
            self.src_embed = _embed_module(cfg, cfg.src_vocab_size)
            self.src_embed_table = self.src_embed
        if cfg.type_vocab_size:
            self.type_embed = _embed_module(cfg, cfg.type_vocab_size)
        self._setup_positions(cfg, with_source=True, with_target=False)
        if cfg.embed_norm:
            self.src_embed_norm = _embed_norm(cfg)
        self.encoder = Encoder(cfg)
        if cfg.pooler:
            self.pooler = Pooler(cfg)
        if cfg.head != "none":
            self.head = EncoderHead(cfg)

    def __call__(
        self,
        src,
        *,
        src_mask=None,
        positions=None,
        token_types=None,
        deterministic: bool = True,
    ):
        """(batch, src_len) tokens -> (batch, src_len, d_model), or config.head's output.
        src_mask: key mask (batch, 1, 1, src_len), True = real (default: the tokens that are
        not pad_id); positions (batch, src_len): each token's position (default 0, 1, ...,
        or config.positions_skip_padding's); token_types (batch, src_len) (default 0)."""
        hidden, pooled = self.features(
            src,
            src_mask=src_mask,
            positions=positions,
            token_types=token_types,
            deterministic=deterministic,
        )
        if self.config.head == "none":
            return hidden
        return self.head(hidden, pooled, self.src_embed_table, deterministic=deterministic)

    def features(
        self,
        src,
        *,
        src_mask=None,
        positions=None,
        token_types=None,
        deterministic: bool = True,
    ):
        """(the last hidden states (batch, src_len, d_model), the pooler output (batch,
        d_model) or None without config.pooler); arguments as __call__."""
        cfg = self.config
        src = as_token_array("src", src)
        src_mask = checked_source(cfg, src, src_mask, positions)
        check_positions("token_types", token_types, src.shape)
        if positions is None and cfg.positions_skip_padding:
            positions = skip_padding_positions(src, cfg.pad_id)
        if cfg.type_vocab_size and token_types is None:
            token_types = jnp.zeros(src.shape, jnp.int32)
        elif not cfg.type_vocab_size and token_types is not None:
            raise ValueError("token_types given to a model without them (type_vocab_size 0)")
        x = self._embed(
            self.src_embed_table, src, 0, deterministic, "src_embedded", positions, token_types
        )
        relative = relative_positions(cfg, src.shape[1], 0, positions, decode=False)
        hidden = self.encoder(x, src_mask, deterministic=deterministic, relative=relative)
        return hidden, (self.pooler(hidden) if cfg.pooler else None)
