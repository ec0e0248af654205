"""The same Transformer as plain PyTorch nn.Modules, built from the same TransformerConfig.

Module and parameter names mirror the Flax tree (docs/architecture.md's table), so
`state_dict()` keys are the canonical torch keys. Mask convention as in Flax: boolean, True =
may attend, broadcastable to (batch, heads, q_len, k_len); a fully masked query row yields zeros.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from flax_transformer.spec.config import TransformerConfig, sliding_layer
from flax_transformer.spec.relative import relative_bucket_table
from flax_transformer.spec.sinusoid import sinusoidal_table
from flax_transformer.spec.validate import check_weights

from . import encoder_heads as heads
from .attention import (  # noqa: F401 (the twin's names, as before the split)
    MultiHeadAttention,
    RMSNorm,
    scaled_dot_product_attention,
    set_fused_attention,
)

TORCH_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def make_padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(batch, len) -> (batch, 1, 1, len), True on real tokens."""
    return (tokens != pad_id)[:, None, None, :]


def make_causal_mask(length: int, device=None) -> torch.Tensor:
    """(1, 1, length, length) lower-triangular, True = may attend."""
    return torch.tril(torch.ones(length, length, dtype=torch.bool, device=device))[None, None]


def make_segment_mask(q_segments: torch.Tensor, k_segments: torch.Tensor) -> torch.Tensor:
    """Packed rows: (batch, q_len), (batch, k_len) segment ids (0 = padding) -> (batch, 1,
    q_len, k_len), True where query and key belong to the same example (never padding)."""
    same = q_segments[:, :, None] == k_segments[:, None, :]
    real = (q_segments != 0)[:, :, None] & (k_segments != 0)[:, None, :]
    return (same & real)[:, None]


# spec.config.ACTIVATIONS as torch modules; "gelu" is exact (erf), "gelu_tanh" GPT-2's gelu_new.
ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "silu": nn.SiLU,
}


class FeedForward(nn.Module):
    """The position-wise feed-forward: linear1 (d_model -> d_ff), activation, dropout, linear2
    (d_ff -> d_model); with config.gated_ffn the activation is multiplied by linear3 (d_model
    -> d_ff) before the dropout."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.linear1 = nn.Linear(config.d_model, config.d_ff, bias=config.use_bias)
        self.linear2 = nn.Linear(config.d_ff, config.d_model, bias=config.use_bias)
        self.linear3 = (
            nn.Linear(config.d_model, config.d_ff, bias=config.use_bias)
            if config.gated_ffn
            else None
        )
        self.activation = ACTIVATIONS[config.activation]()
        rate = config.activation_dropout_rate
        self.dropout = nn.Dropout(config.dropout_rate if rate is None else rate)

    def forward(self, x):
        """x (..., d_model) -> (..., d_model)."""
        hidden = self.activation(self.linear1(x))
        if self.linear3 is not None:
            hidden = hidden * self.linear3(x)
        return self.linear2(self.dropout(hidden))


class PositionalEncoding(nn.Module):
    """Sinusoidal (a buffer, not a param) or learned (`weight`), added from `offset` (or per
    token from `positions` (batch, len)); position p reads row p + config.position_offset."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.position_offset = config.position_offset
        rows = config.max_len + config.position_offset
        if config.positional == "learned":
            self.weight = nn.Parameter(torch.randn(rows, config.d_model) * 0.02)
        else:
            constant = sinusoidal_table(rows, config.d_model, config.sinusoid_layout)
            self.register_buffer("table", torch.from_numpy(constant), persistent=False)

    def forward(self, x, offset: int = 0, positions=None):
        """x (batch, len, d_model) -> x plus the positions' rows, same shape; rows from `offset`
        on, or per token from `positions` (batch, len)."""
        table = self.weight if hasattr(self, "weight") else self.table
        if positions is not None:
            return x + table[positions + self.position_offset].to(x.dtype)
        start = offset + self.position_offset
        return x + table[start : start + x.shape[1]].to(x.dtype)[None]


def _layer_norm(config: TransformerConfig) -> nn.Module:
    if config.norm_type == "rms":
        return RMSNorm(config.d_model, config.layer_norm_eps, config.norm_weight_offset)
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps, bias=config.use_bias)


class RelativePositionBias(nn.Module):
    """The relative position bias: relative positions (batch | 1, q_len, k_len), key minus
    query -> (batch | 1, heads, q_len, k_len), one learned `weight` (buckets, heads) row per
    bucket (flax_transformer/spec/relative.py)."""

    def __init__(self, config: TransformerConfig, bidirectional: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(config.relative_attention_buckets, config.num_heads))
        distance = config.relative_attention_max_distance
        table = relative_bucket_table(config.relative_attention_buckets, distance, bidirectional)
        self.register_buffer("buckets", torch.from_numpy(table).long(), persistent=False)
        self.max_distance = distance

    def forward(self, relative):
        """relative positions -> the bias, heads on axis 1."""
        index = relative.clamp(-self.max_distance, self.max_distance) + self.max_distance
        return self.weight[self.buckets[index]].permute(0, 3, 1, 2)


def relative_positions(config: TransformerConfig, length: int, positions=None):
    """Key minus query positions (batch | 1, length, length), from `positions` (batch, length)
    or 0..length-1; None without a relative position bias."""
    if not config.relative_attention_buckets:
        return None
    if positions is None:
        positions = torch.arange(length)[None]
    return positions[:, None, :] - positions[:, :, None]


class _RelativeBiasMixin:
    """A stack's or block's own relative position bias (`relative_bias`), when it has one."""

    def _init_relative(self, config: TransformerConfig, bidirectional: bool, per_layer: bool):
        has = bool(config.relative_attention_buckets) and (
            config.relative_attention_per_layer == per_layer
        )
        self.relative_bias = RelativePositionBias(config, bidirectional) if has else None

    def _bias(self, relative, bias):
        if self.relative_bias is None or relative is None:
            return bias
        return self.relative_bias(relative)


class _ResidualMixin:
    def _residual(self, norm, x, sublayer, out_norm=None):
        if self.norm_first:
            out = sublayer(norm(x))
            return x + self.dropout(out if out_norm is None else out_norm(out))
        return norm(x + self.dropout(sublayer(x)))


class EncoderBlock(_ResidualMixin, _RelativeBiasMixin, nn.Module):
    """Self-attention then feed-forward, each with dropout and a residual; post-LN (the paper) or
    pre-LN (config.norm_first); its own relative_bias with config.relative_attention_per_layer."""

    def __init__(self, config: TransformerConfig, bidirectional: bool = True, sliding_window=None):
        super().__init__()
        self._init_relative(config, bidirectional, per_layer=True)
        self.norm_first = config.norm_first
        self.self_attn = MultiHeadAttention(config, sliding_window)
        self.norm1 = _layer_norm(config)
        self.ffn = FeedForward(config)
        self.norm2 = _layer_norm(config)
        self.dropout = nn.Dropout(config.dropout_rate)
        out_norms = config.sublayer_output_norm and config.norm_first
        self.attn_out_norm = _layer_norm(config) if out_norms else None
        self.ffn_out_norm = _layer_norm(config) if out_norms else None

    def forward(self, x, mask=None, relative=None, bias=None, positions=None):
        """x (batch, len, d_model), mask broadcastable to (batch, heads, len, len), relative
        positions and the stack's relative bias, rotary `positions` -> (batch, len, d_model)."""
        bias = self._bias(relative, bias)
        x = self._residual(
            self.norm1,
            x,
            lambda h: self.self_attn(h, mask=mask, bias=bias, positions=positions),
            self.attn_out_norm,
        )
        return self._residual(self.norm2, x, self.ffn, self.ffn_out_norm)


class DecoderBlock(_ResidualMixin, _RelativeBiasMixin, nn.Module):
    """Masked self-attention, cross-attention on the encoder output, then feed-forward, each with
    dropout and a residual; post-LN or pre-LN (config.norm_first)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self._init_relative(config, bidirectional=False, per_layer=True)
        self.norm_first = config.norm_first
        self.self_attn = MultiHeadAttention(config)
        self.norm1 = _layer_norm(config)
        self.cross_attn = MultiHeadAttention(config)
        self.norm2 = _layer_norm(config)
        self.ffn = FeedForward(config)
        self.norm3 = _layer_norm(config)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, x, encoded, self_mask=None, cross_mask=None, relative=None, bias=None):
        """x (batch, tgt_len, d_model), encoded (batch, src_len, d_model), self_mask (..,
        tgt_len, tgt_len), cross_mask (.., tgt_len, src_len) -> (batch, tgt_len, d_model)."""
        bias = self._bias(relative, bias)
        x = self._residual(self.norm1, x, lambda h: self.self_attn(h, mask=self_mask, bias=bias))
        x = self._residual(self.norm2, x, lambda h: self.cross_attn(h, encoded, mask=cross_mask))
        return self._residual(self.norm3, x, self.ffn)


def _layer_window(config: TransformerConfig, layer: int) -> int | None:
    """Layer `layer`'s sliding window (spec.config.sliding_layer), else None."""
    return config.sliding_window if sliding_layer(config, layer) else None


class Encoder(_RelativeBiasMixin, nn.Module):
    """A stack of EncoderBlocks (config.num_encoder_layers unless `num_layers`), with a final
    LayerNorm when config.final_norm; TransformerLM's decoder is one too (bidirectional=False:
    a causal relative bias)."""

    def __init__(
        self, config: TransformerConfig, num_layers: int | None = None, bidirectional: bool = True
    ):
        super().__init__()
        self._init_relative(config, bidirectional, per_layer=False)
        num_layers = config.num_encoder_layers if num_layers is None else num_layers
        self.layers = nn.ModuleList(
            EncoderBlock(config, bidirectional, _layer_window(config, i)) for i in range(num_layers)
        )
        self.norm = _layer_norm(config) if config.final_norm else None

    def forward(self, x, mask=None, relative=None, positions=None):
        """x (batch, len, d_model), mask broadcastable to (batch, heads, len, len), relative
        positions (batch | 1, len, len), rotary `positions` -> (batch, len, d_model)."""
        bias = self._bias(relative, None)
        for layer in self.layers:
            x = layer(x, mask, relative, bias, positions)
        return x if self.norm is None else self.norm(x)


class Decoder(_RelativeBiasMixin, nn.Module):
    """A stack of config.num_decoder_layers DecoderBlocks, with a final LayerNorm when
    config.final_norm."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self._init_relative(config, bidirectional=False, per_layer=False)
        self.layers = nn.ModuleList(DecoderBlock(config) for _ in range(config.num_decoder_layers))
        self.norm = _layer_norm(config) if config.final_norm else None

    def forward(self, x, encoded, self_mask=None, cross_mask=None, relative=None):
        """x (batch, tgt_len, d_model), encoded (batch, src_len, d_model), self_mask, cross_mask,
        relative positions -> (batch, tgt_len, d_model)."""
        bias = self._bias(relative, None)
        for layer in self.layers:
            x = layer(x, encoded, self_mask, cross_mask, relative, bias)
        return x if self.norm is None else self.norm(x)


class LogitsBias(nn.Module):
    """A bias added to the logits after the output layer (config.final_logits_bias)."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, logits):
        """logits (..., vocab) -> logits + bias, same shape."""
        return logits + self.bias


class _EmbeddingsMixin(nn.Module):
    def _init_embeddings(
        self, config: TransformerConfig, with_source: bool, with_target: bool = True
    ):
        self.config = config
        if with_source and config.share_embeddings:
            self.shared_embed = nn.Embedding(config.src_vocab_size, config.d_model)
        else:
            if with_source:
                self.src_embed = nn.Embedding(config.src_vocab_size, config.d_model)
            if with_target:
                self.tgt_embed = nn.Embedding(config.tgt_vocab_size, config.d_model)
        if config.positional in ("none", "rotary"):  # rotary: turned in the attention
            self.positions = None
        elif config.positional != "learned":
            self.positions = PositionalEncoding(config)
        elif with_source and config.separate_positions:  # one learned table per stack
            self.src_pos_embed = PositionalEncoding(config)
            if with_target:
                self.tgt_pos_embed = PositionalEncoding(config)
        else:
            self.pos_embed = PositionalEncoding(config)
        if config.embed_norm:
            if with_source:
                self.src_embed_norm = _layer_norm(config)
            if with_target:
                self.tgt_embed_norm = _layer_norm(config)
        self.embed_dropout = nn.Dropout(config.dropout_rate)
        self.lm_head = (
            None
            if config.tie_output or not with_target
            else nn.Linear(config.d_model, config.tgt_vocab_size, bias=config.lm_head_bias)
        )
        if config.final_logits_bias and with_target:
            self.logits_bias = LogitsBias(config.tgt_vocab_size)

    # Properties, not attributes: an aliased nn.Module would appear twice in state_dict().
    @property
    def src_embed_table(self) -> nn.Embedding:
        return self.shared_embed if self.config.share_embeddings else self.src_embed

    @property
    def tgt_embed_table(self) -> nn.Embedding:
        if self.config.share_embeddings and hasattr(self, "shared_embed"):
            return self.shared_embed
        return self.tgt_embed

    def _embed(self, side: str, tokens, offset: int = 0, positions=None, token_types=None):
        """`side` "src" or "tgt": its token table, (token types,) position table and norm."""
        table = self.src_embed_table if side == "src" else self.tgt_embed_table
        x = table(tokens)
        if self.config.scale_embeddings:  # sqrt(d_model) rounded to the model's dtype
            x = x * torch.tensor(math.sqrt(self.config.d_model), dtype=x.dtype)
        if token_types is not None:
            x = x + self.type_embed(token_types)
        if hasattr(self, f"{side}_pos_embed"):
            add_positions = getattr(self, f"{side}_pos_embed")
        else:
            add_positions = getattr(self, "pos_embed", None) or self.positions
        if add_positions is not None:
            x = add_positions(x, offset, positions)
        if self.config.embed_norm:
            x = getattr(self, f"{side}_embed_norm")(x)
        return self.embed_dropout(x)

    def _output_logits(self, x):
        if self.config.scale_decoder_output:
            x = x * self.config.d_model**-0.5
        if self.lm_head is None:
            logits = x @ self.tgt_embed_table.weight.T
        else:
            logits = self.lm_head(x)
        if self.config.final_logits_bias:
            logits = self.logits_bias(logits)
        cap = self.config.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _default_target_mask(self, tokens):
        """Causal, plus the pad_id keys hidden when config.mask_target_padding."""
        mask = make_causal_mask(tokens.shape[1], tokens.device)
        if self.config.mask_target_padding:
            mask = mask & make_padding_mask(tokens, self.config.pad_id)
        return mask


class Transformer(_EmbeddingsMixin):
    """forward(src, tgt, src_mask=None, tgt_mask=None) -> logits (batch, tgt_len, tgt_vocab)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self._init_embeddings(config, with_source=True)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.to(TORCH_DTYPES[config.param_dtype])

    def forward(
        self, src, tgt, src_mask=None, tgt_mask=None, cross_mask=None,
        src_positions=None, tgt_positions=None,
    ):  # fmt: skip
        """src (batch, src_len), tgt (batch, tgt_len) token ids -> logits (batch, tgt_len,
        tgt_vocab); masks default to source padding and causal (+ target padding when
        config.mask_target_padding), cross_mask to src_mask; positions (batch, len) per token
        (packed rows: training/packing.py)."""
        if src_mask is None:
            src_mask = make_padding_mask(src, self.config.pad_id)
        encoded = self.encode(src, src_mask, src_positions)
        cross = src_mask if cross_mask is None else cross_mask
        return self.decode(encoded, tgt, cross, tgt_mask, tgt_positions)

    def encode(self, src, src_mask=None, positions=None):
        """src (batch, src_len) token ids -> encoded (batch, src_len, d_model); src_mask defaults
        to the source padding mask."""
        if src_mask is None:
            src_mask = make_padding_mask(src, self.config.pad_id)
        relative = relative_positions(self.config, src.shape[1], positions)
        return self.encoder(self._embed("src", src, positions=positions), src_mask, relative)

    def decode(self, encoded, tgt, src_mask=None, tgt_mask=None, positions=None):
        """encoded (batch, src_len, d_model), tgt (batch, tgt_len) token ids -> logits (batch,
        tgt_len, tgt_vocab); src_mask is the cross-attention mask; tgt_mask defaults to causal
        (+ target padding when config.mask_target_padding)."""
        if tgt_mask is None:
            tgt_mask = self._default_target_mask(tgt)
        relative = relative_positions(self.config, tgt.shape[1], positions)
        x = self._embed("tgt", tgt, positions=positions)
        x = self.decoder(x, encoded, tgt_mask, src_mask, relative)
        return self._output_logits(x)


class TransformerLM(_EmbeddingsMixin):
    """Decoder-only: forward(tokens, mask=None) -> logits (batch, len, tgt_vocab)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self._init_embeddings(config, with_source=False)
        self.decoder = Encoder(config, num_layers=config.num_decoder_layers, bidirectional=False)
        self.to(TORCH_DTYPES[config.param_dtype])

    def forward(self, tokens, mask=None, positions=None):
        """tokens (batch, len) -> logits (batch, len, tgt_vocab); mask defaults to causal (+ padding
        when config.mask_target_padding); `positions` (batch, len) sets each token's position."""
        if mask is None:
            mask = self._default_target_mask(tokens)
        x = self._embed("tgt", tokens, positions=positions)
        relative = relative_positions(self.config, tokens.shape[1], positions)
        return self._output_logits(self.decoder(x, mask, relative, positions))


class TransformerEncoder(_EmbeddingsMixin):
    """A bare encoder (model kind "encoder"): forward(src, src_mask=None, positions=None,
    token_types=None) -> the last hidden states (batch, src_len, d_model), or config.head's
    output on them (encoder_heads.py); `features` gives (hidden states, pooler output)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self._init_embeddings(config, with_source=True, with_target=False)
        if config.type_vocab_size:
            self.type_embed = nn.Embedding(config.type_vocab_size, config.d_model)
        self.encoder = Encoder(config)
        self.pooler = heads.Pooler(config) if config.pooler else None
        if config.head != "none":
            self.head = heads.EncoderHead(config, ACTIVATIONS[config.activation]())
        self.to(TORCH_DTYPES[config.param_dtype])

    def forward(self, src, src_mask=None, positions=None, token_types=None):
        """src (batch, src_len) token ids -> (batch, src_len, d_model) or the head's logits;
        src_mask defaults to the source padding mask."""
        hidden, pooled = self.features(src, src_mask, positions, token_types)
        if self.config.head == "none":
            return hidden
        return self.head(hidden, pooled, self.src_embed_table)

    def features(self, src, src_mask=None, positions=None, token_types=None):
        """(last hidden states, pooler output or None)."""
        cfg = self.config
        if src_mask is None:
            src_mask = make_padding_mask(src, cfg.pad_id)
        if positions is None and cfg.positions_skip_padding:
            positions = heads.skip_padding_positions(src, cfg.pad_id)
        if cfg.type_vocab_size and token_types is None:
            token_types = torch.zeros_like(src)
        relative = relative_positions(cfg, src.shape[1], positions)
        x = self._embed("src", src, positions=positions, token_types=token_types)
        hidden = self.encoder(x, src_mask, relative)
        return hidden, (self.pooler(hidden) if self.pooler is not None else None)


def state_dict_to_numpy(module: nn.Module) -> dict[str, np.ndarray]:
    """state_dict as numpy arrays, bfloat16 kept (as ml_dtypes.bfloat16)."""
    return {key: tensor_to_numpy(value) for key, value in module.state_dict().items()}


def tensor_to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor as a numpy array on the CPU (detached); bfloat16 becomes ml_dtypes.bfloat16, bit
    for bit."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def numpy_to_tensor(array: np.ndarray) -> torch.Tensor:
    """A numpy array as a CPU tensor sharing its (contiguous) memory; ml_dtypes.bfloat16 becomes
    torch.bfloat16, bit for bit."""
    array = np.ascontiguousarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def load_numpy_state(module: nn.Module, state: dict[str, np.ndarray]) -> nn.Module:
    """Load numpy arrays into `module` strictly (missing or unexpected keys raise; integer
    arrays raise too: load_state_dict would cast them to float silently)."""
    check_weights(state, f"state for {type(module).__name__}", allow_nonfinite=True)
    module.load_state_dict({k: numpy_to_tensor(v) for k, v in state.items()}, strict=True)
    return module
