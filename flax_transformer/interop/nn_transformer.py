"""torch.nn.Transformer in Flax: the same constructor, call, mask conventions and weights.

- `NNTransformer` computes what `torch.nn.Transformer(..., batch_first=True)` computes (dropout
  off at inference), `NNTransformerEncoder` / `NNTransformerDecoder` what the standalone
  `nn.TransformerEncoder` / `nn.TransformerDecoder` stacks compute. They are the project's
  Encoder/Decoder stacks (a TransformerConfig built from the constructor arguments); only the
  masks and the weight names are translated here.
- Masks follow torch.nn: boolean True = blocked, float masks are added to the scores, key
  padding masks are True on padding. They become one project mask per attention.
- The weights move in `nn_transformer_weights` (both re-exported by
  `flax_transformer.interop`); `python -m flax_transformer.interop` checks the port against
  torch (the command is cli/nn_transformer_check.py).

Fully padded sequences (every key blocked for a query): the attention of that row is zero, so
the sublayer contributes only its output bias. PyTorch's regular path (>= 2.5) does the same;
its fast path instead writes zeros into the encoder output at padded positions (before the
final norm). Both agree on every position a later layer can see; see the README.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from flax_transformer.nn.model import Decoder, Encoder
from flax_transformer.spec.config import TransformerConfig

__all__ = [
    "NNTransformer",
    "NNTransformerDecoder",
    "NNTransformerEncoder",
    "generate_square_subsequent_mask",
    "torch_attention_mask",
]

# ----------------------------------------------------------------------------- masks


def generate_square_subsequent_mask(size: int, dtype=jnp.float32) -> jax.Array:
    """torch.nn.Transformer.generate_square_subsequent_mask: 0 on and below the diagonal, -inf
    above it (a float mask, added to the scores)."""
    blocked = jnp.triu(jnp.ones((size, size), dtype=bool), k=1)
    return jnp.where(blocked, -jnp.inf, 0.0).astype(dtype)


def _check_mask_dtype(name: str, mask: jax.Array) -> None:
    if mask.dtype != jnp.bool_ and not jnp.issubdtype(mask.dtype, jnp.floating):
        raise ValueError(f"{name} must be boolean or floating point, got dtype {mask.dtype}")


def torch_attention_mask(
    attn_mask,
    key_padding_mask,
    *,
    batch: int,
    num_heads: int,
    q_len: int,
    k_len: int,
    dtype=jnp.float32,
    names: tuple[str, str] = ("attn_mask", "key_padding_mask"),
) -> jax.Array | None:
    """torch.nn's two masks of one attention -> this project's single mask.

    attn_mask: (q_len, k_len) or (batch * num_heads, q_len, k_len); key_padding_mask:
    (batch, k_len). Boolean masks are True where attention is blocked, float masks are added
    to the scores. Returns None (no mask), a boolean mask True = attend when every given mask is
    boolean, or else a float mask of `dtype` to add to the scores, -inf where a boolean mask
    blocked; either broadcasts to (batch, heads, q_len, k_len).
    """
    parts = []  # each (mask, is_bool) in (batch|1, heads|1, q_len, k_len) layout
    if attn_mask is not None:
        attn_mask = jnp.asarray(attn_mask)
        _check_mask_dtype(names[0], attn_mask)
        if attn_mask.shape == (q_len, k_len):
            parts.append(attn_mask[None, None])
        elif attn_mask.shape == (batch * num_heads, q_len, k_len):
            parts.append(attn_mask.reshape(batch, num_heads, q_len, k_len))
        else:
            raise ValueError(
                f"{names[0]} of shape {attn_mask.shape} must be (L, S) = {(q_len, k_len)} or "
                f"(N * nhead, L, S) = {(batch * num_heads, q_len, k_len)}"
            )
    if key_padding_mask is not None:
        key_padding_mask = jnp.asarray(key_padding_mask)
        _check_mask_dtype(names[1], key_padding_mask)
        if key_padding_mask.shape != (batch, k_len):
            raise ValueError(
                f"{names[1]} of shape {key_padding_mask.shape} must be (N, S) = {(batch, k_len)}"
            )
        parts.append(key_padding_mask[:, None, None, :])
    if not parts:
        return None
    if all(part.dtype == jnp.bool_ for part in parts):
        allowed = ~parts[0]
        for part in parts[1:]:
            allowed = allowed & ~part
        return allowed
    bias = jnp.zeros((), dtype)
    for part in parts:
        if part.dtype == jnp.bool_:
            part = jnp.where(part, -jnp.inf, 0.0)
        bias = bias + part.astype(dtype)
    return bias


def _check_is_causal(is_causal, mask, mask_name: str, hint_name: str) -> None:
    """torch's is_causal is a hint about the mask; the mask itself is what we apply."""
    if is_causal and mask is None:
        raise ValueError(
            f"{hint_name}=True needs {mask_name} (as torch.nn does): pass "
            f"generate_square_subsequent_mask(length) as {mask_name}"
        )


# ----------------------------------------------------------------------------- layout


class _Layout:
    """Brings (N, L, E) / (L, N, E) / unbatched (L, E) inputs to (N, L, E) and back."""

    def __init__(self, name: str, x, batch_first: bool, d_model: int):
        x = jnp.asarray(x)
        if x.ndim not in (2, 3):
            raise ValueError(f"{name} must be (N, L, E) or unbatched (L, E), got {x.shape}")
        if x.shape[-1] != d_model:
            raise ValueError(
                f"the feature size of {name} ({x.shape[-1]}) must equal d_model ({d_model})"
            )
        self.unbatched = x.ndim == 2
        self.batch_first = batch_first
        if self.unbatched:
            x = x[None]
        elif not batch_first:
            x = jnp.swapaxes(x, 0, 1)
        self.x = x  # (batch, length, d_model)

    def key_padding(self, mask):
        """Unbatched inputs take a (S,) key padding mask."""
        if mask is not None and self.unbatched:
            return jnp.asarray(mask)[None]
        return mask

    def back(self, y):
        if self.unbatched:
            return y[0]
        return y if self.batch_first else jnp.swapaxes(y, 0, 1)


# ----------------------------------------------------------------------------- modules


class _NNStack(nn.Module):
    """Fields shared by the two stacks: TransformerEncoderLayer / TransformerDecoderLayer's
    constructor arguments, the layer count and whether a final LayerNorm follows."""

    num_layers: int = 6
    d_model: int = 512
    nhead: int = 8
    dim_feedforward: int = 2048
    dropout: float = 0.1
    activation: str = "relu"
    layer_norm_eps: float = 1e-5
    batch_first: bool = True
    norm_first: bool = False
    bias: bool = True
    final_norm: bool = False  # torch's `norm` argument: LayerNorm(d_model) or None
    dtype: str = "float32"
    param_dtype: str = "float32"

    @property
    def config(self) -> TransformerConfig:
        """The project's TransformerConfig for these torch.nn constructor arguments."""
        if not isinstance(self.activation, str):
            raise ValueError(
                "activation must be 'relu' or 'gelu' (a name, not a callable), "
                f"got {self.activation!r}"
            )
        is_encoder = isinstance(self, NNTransformerEncoder)
        return TransformerConfig(
            d_model=self.d_model,
            num_heads=self.nhead,
            num_encoder_layers=self.num_layers if is_encoder else 0,
            num_decoder_layers=0 if is_encoder else self.num_layers,
            d_ff=self.dim_feedforward,
            dropout_rate=self.dropout,
            attention_dropout_rate=self.dropout,  # nn.MultiheadAttention's dropout: same rate
            activation=self.activation,
            layer_norm_eps=self.layer_norm_eps,
            norm_first=self.norm_first,
            use_bias=self.bias,
            final_norm=self.final_norm,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
        )


class NNTransformerEncoder(_NNStack):
    """torch.nn.TransformerEncoder(TransformerEncoderLayer(d_model, nhead, ...), num_layers,
    norm=LayerNorm(d_model) if final_norm else None).

    Call: (src, mask=None, src_key_padding_mask=None, is_causal=None) with torch's masks.
    Params: layers_{i}/{self_attn,norm1,ffn,norm2}, norm (when final_norm).
    """

    def setup(self):
        self.stack = Encoder(self.config)
        nn.share_scope(self, self.stack)  # the stack's params sit at this module's level

    def __call__(
        self,
        src,
        mask=None,
        src_key_padding_mask=None,
        is_causal: bool | None = None,
        *,
        deterministic: bool = True,
    ):
        _check_is_causal(is_causal, mask, "mask", "is_causal")
        src = _Layout("src", src, self.batch_first, self.d_model)
        batch, length = src.x.shape[:2]
        attention_mask = torch_attention_mask(
            mask,
            src.key_padding(src_key_padding_mask),
            batch=batch,
            num_heads=self.nhead,
            q_len=length,
            k_len=length,
            dtype=src.x.dtype,
            names=("mask", "src_key_padding_mask"),
        )
        return src.back(self.stack(src.x, attention_mask, deterministic=deterministic))


class NNTransformerDecoder(_NNStack):
    """torch.nn.TransformerDecoder(TransformerDecoderLayer(d_model, nhead, ...), num_layers,
    norm=LayerNorm(d_model) if final_norm else None).

    Call: (tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False).
    Params: layers_{i}/{self_attn,norm1,cross_attn,norm2,ffn,norm3}, norm (when final_norm).
    """

    def setup(self):
        self.stack = Decoder(self.config)
        nn.share_scope(self, self.stack)

    def __call__(
        self,
        tgt,
        memory,
        tgt_mask=None,
        memory_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
        *,
        deterministic: bool = True,
    ):
        _check_is_causal(tgt_is_causal, tgt_mask, "tgt_mask", "tgt_is_causal")
        _check_is_causal(memory_is_causal, memory_mask, "memory_mask", "memory_is_causal")
        tgt = _Layout("tgt", tgt, self.batch_first, self.d_model)
        memory = _Layout("memory", memory, self.batch_first, self.d_model)
        if tgt.unbatched != memory.unbatched or tgt.x.shape[0] != memory.x.shape[0]:
            raise ValueError(
                "tgt and memory must have the same batch size (both batched or both unbatched)"
            )
        batch, tgt_len = tgt.x.shape[:2]
        src_len = memory.x.shape[1]
        common = dict(batch=batch, num_heads=self.nhead, q_len=tgt_len, dtype=tgt.x.dtype)
        self_mask = torch_attention_mask(
            tgt_mask,
            tgt.key_padding(tgt_key_padding_mask),
            k_len=tgt_len,
            names=("tgt_mask", "tgt_key_padding_mask"),
            **common,
        )
        cross_mask = torch_attention_mask(
            memory_mask,
            memory.key_padding(memory_key_padding_mask),
            k_len=src_len,
            names=("memory_mask", "memory_key_padding_mask"),
            **common,
        )
        out = self.stack(tgt.x, memory.x, self_mask, cross_mask, deterministic=deterministic)
        return tgt.back(out)


class NNTransformer(nn.Module):
    """torch.nn.Transformer in Flax: same constructor arguments, defaults and call.

    `apply({"params": p}, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
    src_key_padding_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None)`,
    src (N, S, E), tgt (N, T, E) -> (N, T, E) (batch_first=True, as the field's default; with
    batch_first=False (S, N, E) as torch's default). Dropout runs only with
    deterministic=False (rng "dropout"). Params: encoder/{layers_i, norm}, decoder/{layers_i,
    norm}, the final norms that nn.Transformer always has.
    """

    d_model: int = 512
    nhead: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    dim_feedforward: int = 2048
    dropout: float = 0.1
    activation: str = "relu"
    layer_norm_eps: float = 1e-5
    batch_first: bool = True
    norm_first: bool = False
    bias: bool = True
    dtype: str = "float32"
    param_dtype: str = "float32"

    generate_square_subsequent_mask = staticmethod(generate_square_subsequent_mask)

    def setup(self):
        common = dict(
            d_model=self.d_model,
            nhead=self.nhead,
            dim_feedforward=self.dim_feedforward,
            dropout=self.dropout,
            activation=self.activation,
            layer_norm_eps=self.layer_norm_eps,
            batch_first=self.batch_first,
            norm_first=self.norm_first,
            bias=self.bias,
            final_norm=True,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
        )
        self.encoder = NNTransformerEncoder(num_layers=self.num_encoder_layers, **common)
        self.decoder = NNTransformerDecoder(num_layers=self.num_decoder_layers, **common)

    def __call__(
        self,
        src,
        tgt,
        src_mask=None,
        tgt_mask=None,
        memory_mask=None,
        src_key_padding_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        src_is_causal: bool | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
        *,
        deterministic: bool = True,
    ):
        src, tgt = jnp.asarray(src), jnp.asarray(tgt)
        batch_axis = 0 if self.batch_first else 1
        if src.ndim != tgt.ndim:
            raise ValueError(f"src {src.shape} and tgt {tgt.shape} must both be batched or not")
        if src.ndim == 3 and src.shape[batch_axis] != tgt.shape[batch_axis]:
            raise ValueError(
                f"the batch number of src and tgt must be equal: {src.shape} vs {tgt.shape}"
            )
        memory = self.encoder(
            src, src_mask, src_key_padding_mask, src_is_causal, deterministic=deterministic
        )
        return self.decoder(
            tgt,
            memory,
            tgt_mask,
            memory_mask,
            tgt_key_padding_mask,
            memory_key_padding_mask,
            tgt_is_causal,
            memory_is_causal,
            deterministic=deterministic,
        )


NN_MODULES = (NNTransformer, NNTransformerEncoder, NNTransformerDecoder)
