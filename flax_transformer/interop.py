"""torch.nn.Transformer in Flax: the same constructor, call, mask conventions and weights.

- `NNTransformer` computes what `torch.nn.Transformer(..., batch_first=True)` computes (dropout
  off at inference), `NNTransformerEncoder` / `NNTransformerDecoder` what the standalone
  `nn.TransformerEncoder` / `nn.TransformerDecoder` stacks compute. They are the project's
  Encoder/Decoder stacks (a TransformerConfig built from the constructor arguments); only the
  masks and the weight names are translated here.
- Masks follow torch.nn: boolean True = blocked, float masks are added to the scores, key
  padding masks are True on padding. They become one project mask per attention.
- `load_nn_transformer_state` / `to_nn_transformer_state` move weights between a torch.nn
  state_dict (numpy arrays) and the Flax tree: packed `in_proj_weight` split into query/key/value
  and joined back, strict about keys and shapes. `from_torch` does it all for a torch module.

Fully padded sequences (every key blocked for a query): the attention of that row is zero, so
the sublayer contributes only its output bias. PyTorch's regular path (>= 2.5) does the same;
its fast path instead writes zeros into the encoder output at padded positions (before the
final norm). Both agree on every position a later layer can see; see the README.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from .config import TransformerConfig
from .convert import (
    ConversionError,
    _report,
    flatten_params,
    flax_path_to_torch_key,
    unflatten_params,
)
from .model import Decoder, Encoder

__all__ = [
    "ConversionError",
    "NNTransformer",
    "NNTransformerDecoder",
    "NNTransformerEncoder",
    "from_torch",
    "generate_square_subsequent_mask",
    "load_nn_transformer_state",
    "to_nn_transformer_state",
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

# ----------------------------------------------------------------------------- weights

_QKV = ("query", "key", "value")


def nn_key(path: tuple[str, ...]) -> tuple[str, int | None]:
    """Flax path -> (torch.nn key, slot): slot is 0/1/2 for the query/key/value third of a
    packed in_proj, None otherwise.
    ('decoder', 'layers_0', 'cross_attn', 'key', 'kernel') -> ('decoder.layers.0.multihead_attn
    .in_proj_weight', 1); ('encoder', 'layers_1', 'ffn', 'linear1', 'bias') -> ('encoder.layers
    .1.linear1.bias', None)."""
    key = flax_path_to_torch_key(path)
    key = re.sub(r"\.cross_attn\.", ".multihead_attn.", "." + key)[1:]
    key = re.sub(r"(^|\.)ffn\.(linear[12])\.", r"\1\2.", key)
    key = re.sub(r"_attn\.out\.(weight|bias)$", r"_attn.out_proj.\1", key)
    packed = re.search(r"_attn\.(query|key|value)\.(weight|bias)$", key)
    if packed is None:
        return key, None
    key = key[: packed.start()] + f"_attn.in_proj_{packed.group(2)}"
    return key, _QKV.index(packed.group(1))


def _check_module(module) -> None:
    if not isinstance(module, NN_MODULES):
        raise TypeError(
            f"module must be one of {[m.__name__ for m in NN_MODULES]}, got {type(module)}"
        )


def expected_param_shapes(module) -> dict[tuple[str, ...], tuple[int, ...]]:
    """{flax path: shape} of an NNTransformer / NNTransformerEncoder / NNTransformerDecoder."""
    _check_module(module)
    x = jnp.zeros((1, 1, module.d_model), jnp.dtype(module.dtype))
    args = (x,) if isinstance(module, NNTransformerEncoder) else (x, x)
    abstract = jax.eval_shape(lambda: module.init(jax.random.key(0), *args))
    return {path: tuple(a.shape) for path, a in flatten_params(abstract).items()}


def nn_state_layout(
    shapes: Mapping[tuple[str, ...], tuple[int, ...]],
) -> dict[str, tuple[tuple[int, ...], list[tuple[tuple[str, ...], int | None]]]]:
    """{torch.nn key: (torch shape, [(flax path, slot), ...])} for the Flax {path: shape}."""
    layout: dict[str, Any] = {}
    for path, shape in shapes.items():
        key, slot = nn_key(path)
        torch_shape = tuple(shape[::-1]) if path[-1] == "kernel" else tuple(shape)
        if slot is not None:  # q, k, v stacked along the output axis
            torch_shape = (3 * torch_shape[0],) + torch_shape[1:]
        entry = layout.setdefault(key, (torch_shape, []))
        entry[1].append((path, slot))
    return layout


def load_nn_transformer_state(
    state: Mapping[str, Any], module, *, prefix: str = ""
) -> dict[str, Any]:
    """torch.nn.Transformer / TransformerEncoder / TransformerDecoder state_dict (numpy arrays,
    e.g. torch_reference.state_dict_to_numpy(m)) -> Flax params {'params': ...} for `module`.

    Strict: every missing, unexpected or mis-shaped key is reported in one ConversionError.
    dtypes are kept. `prefix` ("transformer."): the torch module sits inside a bigger model's
    state_dict; only the keys under it are read.
    """
    if prefix:
        state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    problems, flat = [], {}
    layout = nn_state_layout(expected_param_shapes(module))
    for key, (shape, parts) in layout.items():
        if key not in state:
            problems.append(f"missing key {key!r} (expected shape {shape})")
            continue
        array = np.asarray(state[key])
        if tuple(array.shape) != shape:
            problems.append(
                f"shape mismatch for {key!r}: expected {shape}, found {tuple(array.shape)}"
            )
            continue
        for path, slot in parts:
            piece = array if slot is None else np.split(array, 3, axis=0)[slot]
            flat[path] = piece.T.copy() if path[-1] == "kernel" else piece.copy()
    for key in sorted(set(state) - set(layout)):
        problems.append(f"unexpected key {key!r} (shape {tuple(np.shape(state[key]))})")
    _report(problems, f"torch.nn state -> {type(module).__name__} params")
    return {"params": unflatten_params(flat)}


def to_nn_transformer_state(
    params: Mapping[str, Any], module, *, prefix: str = ""
) -> dict[str, np.ndarray]:
    """Flax params of `module` -> the torch.nn state_dict (numpy arrays), strictly checked,
    each key prefixed by `prefix`. Load it with torch_reference.load_numpy_state(m, state)."""
    found = flatten_params(params)
    shapes = expected_param_shapes(module)
    problems = []
    for path, shape in shapes.items():
        name = "/".join(path)
        if path not in found:
            problems.append(f"missing param {name!r} (expected shape {shape})")
        elif tuple(np.shape(found[path])) != shape:
            problems.append(
                f"shape mismatch for {name!r}: expected {shape}, found {np.shape(found[path])}"
            )
    for path in sorted(set(found) - set(shapes)):
        problems.append(f"unexpected param {'/'.join(path)!r} (shape {np.shape(found[path])})")
    _report(problems, f"{type(module).__name__} params -> torch.nn state")
    state = {}
    for key, (_, parts) in nn_state_layout(shapes).items():
        pieces = [
            (slot, np.asarray(found[path]).T if path[-1] == "kernel" else np.asarray(found[path]))
            for path, slot in parts
        ]
        if len(pieces) == 1 and pieces[0][0] is None:
            state[prefix + key] = pieces[0][1].copy()
        else:
            state[prefix + key] = np.concatenate([p for _, p in sorted(pieces)], axis=0)
    return state


# ----------------------------------------------------------------------------- from torch


def _layer_settings(layer, kind: str) -> dict[str, Any]:
    """Constructor arguments of a torch.nn.Transformer{Encoder,Decoder}Layer, checked."""
    from torch import nn as tnn
    from torch.nn import functional as F

    expected = tnn.TransformerEncoderLayer if kind == "encoder" else tnn.TransformerDecoderLayer
    if not isinstance(layer, expected):
        raise ValueError(f"{kind} layers must be {expected.__name__}, got {type(layer).__name__}")
    attention = layer.self_attn
    if (
        not attention._qkv_same_embed_dim
        or attention.bias_k is not None
        or (attention.add_zero_attn)
    ):
        raise ValueError("kdim/vdim, add_bias_kv and add_zero_attn are not supported")
    act = layer.activation
    if act is F.relu or isinstance(act, tnn.ReLU):
        activation = "relu"
    elif act is F.gelu or (isinstance(act, tnn.GELU) and act.approximate == "none"):
        activation = "gelu"
    else:
        raise ValueError(f"activation must be relu or exact gelu, got {act!r}")
    norms = [m for name, m in layer.named_children() if re.fullmatch(r"norm\d", name)]
    if len({n.eps for n in norms}) != 1:
        raise ValueError("the layer's LayerNorms have different eps; one eps is supported")
    return dict(
        d_model=attention.embed_dim,
        nhead=attention.num_heads,
        dim_feedforward=layer.linear1.out_features,
        dropout=layer.dropout.p,
        activation=activation,
        layer_norm_eps=norms[0].eps,
        batch_first=attention.batch_first,
        norm_first=layer.norm_first,
        bias=layer.linear1.bias is not None,
    )


def _stack_settings(stack, kind: str) -> dict[str, Any]:
    if len(stack.layers) == 0:
        raise ValueError(f"the {kind} has no layers")
    settings = [_layer_settings(layer, kind) for layer in stack.layers]
    if any(s != settings[0] for s in settings):
        raise ValueError(f"the {kind} layers have different settings")
    norm = stack.norm
    if norm is not None and (
        tuple(norm.normalized_shape) != (settings[0]["d_model"],)
        or norm.eps != settings[0]["layer_norm_eps"]
        or (norm.bias is not None) != settings[0]["bias"]
    ):
        raise ValueError(f"the {kind}'s final norm must be LayerNorm(d_model) like its layers'")
    return dict(settings[0], num_layers=len(stack.layers), final_norm=norm is not None)


def from_torch(torch_module) -> tuple[nn.Module, dict[str, Any]]:
    """(Flax module, params) computing what a torch.nn.Transformer, TransformerEncoder or
    TransformerDecoder computes, with its weights."""
    from torch import nn as tnn

    from torch_reference.model import state_dict_to_numpy

    dtypes = {str(p.dtype).removeprefix("torch.") for p in torch_module.parameters()}
    if len(dtypes) != 1:
        raise ValueError(f"the module's parameters must share one dtype, got {sorted(dtypes)}")
    dtype = dtypes.pop()
    precision = dict(dtype=dtype, param_dtype=dtype)
    if isinstance(torch_module, tnn.Transformer):
        encoder = _stack_settings(torch_module.encoder, "encoder")
        decoder = _stack_settings(torch_module.decoder, "decoder")
        shared = {k: v for k, v in encoder.items() if k not in ("num_layers", "final_norm")}
        if any(decoder[k] != v for k, v in shared.items()) or not (
            encoder["final_norm"] and decoder["final_norm"]
        ):
            raise ValueError("encoder and decoder settings differ: not a plain nn.Transformer")
        module = NNTransformer(
            num_encoder_layers=encoder["num_layers"],
            num_decoder_layers=decoder["num_layers"],
            **shared,
            **precision,
        )
    elif isinstance(torch_module, tnn.TransformerEncoder):
        module = NNTransformerEncoder(**_stack_settings(torch_module, "encoder"), **precision)
    elif isinstance(torch_module, tnn.TransformerDecoder):
        module = NNTransformerDecoder(**_stack_settings(torch_module, "decoder"), **precision)
    else:
        raise TypeError(
            "from_torch takes a torch.nn.Transformer, TransformerEncoder or TransformerDecoder, "
            f"got {type(torch_module).__name__}"
        )
    return module, load_nn_transformer_state(state_dict_to_numpy(torch_module), module)


# ----------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """Build a torch.nn.Transformer, move it to Flax, and print the output differences (JSON)
    on random inputs with a causal target mask and source padding, on PyTorch's regular path
    and its fast path."""
    import argparse
    import json
    import sys

    import torch

    parser = argparse.ArgumentParser(
        prog="python -m flax_transformer.interop",
        description="Check that NNTransformer reproduces torch.nn.Transformer (default sizes: "
        "torch's defaults).",
    )
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--nhead", type=int, default=8)
    parser.add_argument("--num-encoder-layers", type=int, default=6)
    parser.add_argument("--num-decoder-layers", type=int, default=6)
    parser.add_argument("--dim-feedforward", type=int, default=2048)
    parser.add_argument("--activation", choices=("relu", "gelu"), default="relu")
    parser.add_argument("--norm-first", action="store_true")
    parser.add_argument("--no-bias", action="store_true")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--tgt-len", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    try:
        torch_model = torch.nn.Transformer(
            d_model=args.d_model,
            nhead=args.nhead,
            num_encoder_layers=args.num_encoder_layers,
            num_decoder_layers=args.num_decoder_layers,
            dim_feedforward=args.dim_feedforward,
            activation=args.activation,
            norm_first=args.norm_first,
            bias=not args.no_bias,
            batch_first=True,
            dtype=getattr(torch, args.dtype),
        ).eval()
    except (AssertionError, ValueError, RuntimeError) as err:
        print(f"error: invalid nn.Transformer settings: {err}", file=sys.stderr)
        return 1
    with jax.enable_x64(args.dtype == "float64"):
        report = _compare_with_torch(torch_model, args)
    print(json.dumps(report, indent=2))
    return 0


def _compare_with_torch(torch_model, args) -> dict[str, Any]:
    import torch

    from .numerics import error_stats

    module, params = from_torch(torch_model)
    rng = np.random.default_rng(args.seed)
    src = rng.standard_normal((args.batch, args.src_len, args.d_model)).astype(args.dtype)
    tgt = rng.standard_normal((args.batch, args.tgt_len, args.d_model)).astype(args.dtype)
    lengths = rng.integers(1, args.src_len + 1, size=args.batch)
    padding = np.arange(args.src_len)[None, :] >= lengths[:, None]
    tgt_mask = np.asarray(generate_square_subsequent_mask(args.tgt_len, args.dtype))
    masks = dict(tgt_mask=tgt_mask, src_key_padding_mask=padding, memory_key_padding_mask=padding)
    with jax.default_matmul_precision("highest"):
        actual = np.asarray(jax.jit(module.apply)(params, src, tgt, **masks))
    report: dict[str, Any] = {"settings": vars(args)}
    previous = torch.backends.mha.get_fastpath_enabled()
    tensors = {k: torch.from_numpy(v) for k, v in masks.items()}
    try:
        for name, fast in (("regular_path", False), ("fast_path", True)):
            torch.backends.mha.set_fastpath_enabled(fast)
            with torch.no_grad():
                expected = torch_model(torch.from_numpy(src), torch.from_numpy(tgt), **tensors)
            max_abs, rel = error_stats(actual, expected.numpy())
            report[name] = {"max_abs_error": max_abs, "relative_error": rel}
    finally:
        torch.backends.mha.set_fastpath_enabled(previous)
    return report


if __name__ == "__main__":
    raise SystemExit(main())
