"""The twin's attention: scaled dot-product attention, multi-head attention (grouped-query,
rotary positions, per-head q/k norms, sliding windows) and the RMS norm it shares with the
blocks. Mask convention as in Flax: boolean, True = may attend."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from flax_transformer.spec import rotary
from flax_transformer.spec.config import TransformerConfig


def scaled_dot_product_attention(
    query, key, value, mask=None, dropout_p: float = 0.0, bias=None, scale: bool = True,
    scale_dim: float | None = None, softcap: float | None = None,
):  # fmt: skip
    """query (batch, heads, q_len, head_dim), key/value (batch, kv_heads, k_len, head_dim)
    (kv_heads dividing heads: key / value head j serves query heads j * G .. j * G + G - 1);
    `bias` (broadcastable to (batch, heads, q_len, k_len)) added to the logits, which are
    divided by sqrt(head_dim) only when `scale` (times scale_dim ** -0.5 instead when given),
    then soft-capped to softcap * tanh(logits / softcap) when `softcap`.

    Returns output (batch, heads, q_len, head_dim) and weights (batch, heads, q_len, k_len).
    """
    head_dim = query.shape[-1]
    group = query.shape[1] // key.shape[1]
    if group > 1:  # transformers' repeat_kv
        key = key.repeat_interleave(group, dim=1)
        value = value.repeat_interleave(group, dim=1)
    scores = query @ key.transpose(-2, -1)
    if scale and scale_dim is not None:
        scores = scores * scale_dim**-0.5
    elif scale:
        scores = scores / math.sqrt(head_dim)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    attended = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    return attended @ value, weights


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps), no mean, no bias; the mean square in at least float32, then
    cast to the weight's dtype and multiplied by `weight` (transformers' T5LayerNorm). With
    `weight_offset` the product is by 1 + weight (initialised to 0), taken before the cast
    (transformers' GemmaRMSNorm)."""

    def __init__(self, features: int, eps: float, weight_offset: bool = False):
        super().__init__()
        start = torch.zeros if weight_offset else torch.ones
        self.weight = nn.Parameter(start(features))
        self.eps = eps
        self.weight_offset = weight_offset

    def forward(self, x):
        """x (..., features) -> same shape."""
        stats = x if x.dtype == torch.float64 else x.float()
        variance = stats.pow(2).mean(-1, keepdim=True)
        normed = stats * torch.rsqrt(variance + self.eps)
        if self.weight_offset:
            return (normed * (1.0 + self.weight.to(stats.dtype))).to(self.weight.dtype)
        return self.weight * normed.to(self.weight.dtype)


def rotary_tables(config: TransformerConfig, positions: torch.Tensor, dtype) -> tuple:
    """(cos, sin) (batch | 1, len, head_dim) for `positions` (batch | 1, len), as
    flax_transformer.nn.rotary computes them (angles in at least float32)."""
    angle_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    if config.rope_scaling == "dynamic":
        seq_len = int(positions.max()) + 1
        inv_freq = rotary.dynamic_frequencies(config, seq_len, np)
    elif config.rope_scaling == "longrope":
        inv_freq = rotary.longrope_frequencies(config, int(positions.max()) + 1, np)
    else:
        inv_freq = rotary.inverse_frequencies(config)
    inv_freq = torch.from_numpy(np.asarray(inv_freq, np.float64)).to(angle_dtype)
    angles = positions.to(angle_dtype)[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    factor = rotary.attention_factor(config)
    return (angles.cos() * factor).to(dtype), (angles.sin() * factor).to(dtype)


def rotate(x, cos, sin):
    """x (batch, heads, len, head_dim) turned by (cos, sin) (batch | 1, len, rotary_dim) on
    its first rotary_dim dims; the rest pass through."""
    width = cos.shape[-1]
    if width < x.shape[-1]:
        return torch.cat([rotate(x[..., :width], cos, sin), x[..., width:]], dim=-1)
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + turned * sin[:, None]


def window_mask(length: int, window: int, device=None) -> torch.Tensor:
    """(1, 1, length, length): key k within the `window` slots ending at query q (k > q - w)."""
    index = torch.arange(length, device=device)
    return (index[None, :] > index[:, None] - window)[None, None]


class MultiHeadAttention(nn.Module):
    """Multi-head attention with query, key, value (config.kv_heads heads) and out Linear
    layers; `query_norm` / `key_norm` with config.qk_norm; rotary positions and a sliding
    window as the Flax twin. The last attention weights are kept in `last_weights` (None on
    the fused path)."""

    def __init__(self, config: TransformerConfig, sliding_window: int | None = None):
        super().__init__()
        d, inner = config.d_model, config.attention_dim
        kv_inner = config.kv_heads * config.head_dim
        self.config = config
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.attention_dropout = config.attention_dropout_rate
        self.scale = config.scale_attention_logits
        self.sliding_window = sliding_window
        qkv_bias = config.use_bias if config.qkv_bias is None else config.qkv_bias
        self.query = nn.Linear(d, inner, bias=qkv_bias)
        self.key = nn.Linear(d, kv_inner, bias=qkv_bias)
        self.value = nn.Linear(d, kv_inner, bias=qkv_bias)
        self.out = nn.Linear(inner, d, bias=config.use_bias)
        if config.qk_norm:
            offset = config.norm_weight_offset
            self.query_norm = RMSNorm(config.head_dim, config.layer_norm_eps, offset)
            self.key_norm = RMSNorm(config.head_dim, config.layer_norm_eps, offset)
        self.last_weights: torch.Tensor | None = None  # for inspection (and forward hooks)
        # "fused": PyTorch's fused kernel (F.scaled_dot_product_attention), which gives no
        # weights; "reference" and "auto" keep the explicit path, so the weights stay readable.
        self.attention_impl = config.attention_impl

    def forward(self, inputs_q, inputs_kv=None, mask=None, bias=None, positions=None):
        """inputs_q (batch, q_len, d_model), inputs_kv (batch, k_len, d_model; default inputs_q:
        self-attention), boolean mask broadcastable to (batch, heads, q_len, k_len), True = may
        attend, `bias` added to the logits (a relative position bias), `positions` (batch | 1,
        q_len) for rotary positions (default 0..q_len - 1) -> (batch, q_len, d_model)."""
        is_self = inputs_kv is None
        inputs_kv = inputs_q if inputs_kv is None else inputs_kv
        batch, q_len, _ = inputs_q.shape

        def split(x):  # (batch, len, heads * head_dim) -> (batch, heads, len, head_dim)
            return x.view(batch, x.shape[1], -1, self.head_dim).transpose(1, 2)

        query, key = split(self.query(inputs_q)), split(self.key(inputs_kv))
        value = split(self.value(inputs_kv))
        if self.config.qk_norm:
            query, key = self.query_norm(query), self.key_norm(key)
        if is_self and self.config.positional == "rotary":
            if positions is None:
                positions = torch.arange(q_len, device=inputs_q.device)[None]
            rope = rotary.layer_rope(self.config, self.sliding_window is not None)
            cos, sin = rotary_tables(rope, positions, query.dtype)
            query, key = rotate(query, cos, sin), rotate(key, cos, sin)
        if is_self and self.sliding_window is not None:
            window = window_mask(q_len, self.sliding_window, inputs_q.device)
            mask = window if mask is None else mask & window
        dropout_p = self.attention_dropout if self.training else 0.0
        cfg = self.config  # the fused kernel has no soft-capping, only 1 / sqrt(head_dim)
        plain = cfg.attention_logit_softcap is None and cfg.attention_scale_dim is None
        if self.attention_impl == "fused" and bias is None and plain:
            factor = None if self.scale else 1.0
            output = F.scaled_dot_product_attention(
                query, key, value, mask, dropout_p, scale=factor,
                enable_gqa=key.shape[1] != query.shape[1],
            )  # fmt: skip
            if mask is not None:  # the fused kernel gives NaN for fully masked rows: define 0
                output = output.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
            self.last_weights = None
        else:
            output, weights = scaled_dot_product_attention(
                query, key, value, mask, dropout_p, bias, self.scale,
                cfg.attention_scale_dim, cfg.attention_logit_softcap,
            )  # fmt: skip
            self.last_weights = weights.detach()
        output = output.transpose(1, 2).reshape(batch, q_len, -1)  # concat heads
        return self.out(output)


def set_fused_attention(model: nn.Module, enabled: bool) -> nn.Module:
    """Switch every attention layer of a built `model` to PyTorch's fused kernel (or to the
    explicit path). New code sets TransformerConfig.attention_impl instead; this stays for
    callers that switch a model after building it."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.attention_impl = "fused" if enabled else "reference"
    return model
