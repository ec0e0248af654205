"""torch.nn.Transformer weights <-> the Flax NNTransformer tree.

`load_nn_transformer_state` / `to_nn_transformer_state` move weights between a torch.nn
state_dict (numpy arrays) and the Flax tree: packed `in_proj_weight` split into query/key/value
and joined back, strict about keys and shapes (the one tree check). `from_torch` does it all for
a torch module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from flax_transformer.interop.nn_transformer import (
    NN_MODULES,
    NNTransformer,
    NNTransformerDecoder,
    NNTransformerEncoder,
)
from flax_transformer.spec.naming import (
    convert_layout,
    flatten_params,
    flax_path_to_torch_key,
    is_transposed,
    unflatten_params,
)
from flax_transformer.spec.tree_check import ConversionError, check_tree
from flax_transformer.spec.validate import check_weights

__all__ = [
    "ConversionError",
    "from_torch",
    "load_nn_transformer_state",
    "to_nn_transformer_state",
]

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
        torch_shape = tuple(shape[::-1]) if is_transposed(path) else tuple(shape)
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
    layout = nn_state_layout(expected_param_shapes(module))
    found = {key: tuple(np.shape(value)) for key, value in state.items()}
    expected = {key: shape for key, (shape, _) in layout.items()}
    where = f"torch.nn state -> {type(module).__name__} params"
    check_tree(found, expected, where)
    check_weights({key: state[key] for key in expected}, where, allow_nonfinite=True)
    flat = {}
    for key, (_, parts) in layout.items():
        array = np.asarray(state[key])
        for path, slot in parts:
            piece = array if slot is None else np.split(array, 3, axis=0)[slot]
            flat[path] = np.array(convert_layout(path, piece))
    return {"params": unflatten_params(flat)}


def to_nn_transformer_state(
    params: Mapping[str, Any], module, *, prefix: str = ""
) -> dict[str, np.ndarray]:
    """Flax params of `module` -> the torch.nn state_dict (numpy arrays), strictly checked,
    each key prefixed by `prefix`. Load it with torch_reference.load_numpy_state(m, state)."""
    found = flatten_params(params)
    shapes = expected_param_shapes(module)
    check_tree(
        {path: tuple(np.shape(leaf)) for path, leaf in found.items()},
        shapes,
        f"{type(module).__name__} params -> torch.nn state",
        what="param",
        name="/".join,
    )
    state = {}
    for key, (_, parts) in nn_state_layout(shapes).items():
        pieces = [(slot, convert_layout(path, np.asarray(found[path]))) for path, slot in parts]
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
