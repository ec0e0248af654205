"""Both models as `flax.nnx` modules, through `flax.nnx.bridge.ToNNX`: one implementation of
the math (the linen modules in flax_transformer.nn), so an NNX model and a linen model with the
same weights compute the same numbers.

    from flax import nnx
from flax.core import meta
    from flax_transformer import nnx as ftnnx

    model = ftnnx.Transformer(config, rngs=nnx.Rngs(0))        # or ftnnx.TransformerLM
    ftnnx.load_params(model, params)                            # a linen tree, e.g. converted
    logits = model(src, tgt_in)                                 # (batch, tgt_len, tgt_vocab)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    metrics = ftnnx.make_train_step()(model, optimizer, batch)  # nnx.jit, updates in place
    params = ftnnx.linen_params(model)                          # back to the linen tree

The NNX module's Param paths are the linen paths (`encoder/layers_0/self_attn/query/kernel`),
so `nnx.state(model, nnx.Param)` is the linen params tree and converters, checkpoints and
`decoding.generate` work on `linen_params(model)`. See docs/nnx.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import optax
from flax import nnx
from flax.core import meta
from flax.nnx.bridge import variables as bridge_variables

from flax_transformer.data.packing import batch_model_kwargs
from flax_transformer.interop.convert import check_flax_params
from flax_transformer.nn.kinds import init_variables, model_for
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.kinds import ENCODER, LM, SEQ2SEQ, check_kind, model_inputs
from flax_transformer.spec.naming import flatten_params, unflatten_params
from flax_transformer.training.steps import batch_loss


class _Bridged(nnx.bridge.ToNNX):
    """A linen model of `kind` as an NNX module whose attributes are its linen params.

    Calls go to the linen module's `apply` (ToNNX), with the same signature: e.g.
    `model(src, tgt_in, deterministic=False)` for training with dropout, which draws from the
    module's own `rngs` (the "dropout" stream, else "params"). Methods of the linen class are
    reachable too: `model.encode(src)`, `model.decode(encoded, tgt_in, src_mask=...)`.
    """

    kind: str  # set by the subclasses

    def __init__(
        self,
        config: TransformerConfig,
        *,
        rngs: nnx.Rngs,
        params: Mapping[str, Any] | None = None,
    ):
        if not isinstance(rngs, nnx.Rngs):
            kind = type(rngs).__name__
            raise TypeError(f"rngs must be an nnx.Rngs, e.g. nnx.Rngs(0), got {kind}")
        super().__init__(model_for(config, self.kind), rngs=rngs)
        if params is None:
            # The linen init, jitted (ToNNX.lazy_init would run every init op eagerly, which
            # is seconds even for the tiny model), from the `params` stream. Unboxed: logical
            # axis boxes (nn.layers.boxed_param_axes) would make NNX ask for a mesh.
            variables = init_variables(self.to_nnx__module, rngs.params())
            params = meta.unbox(variables["params"])
        else:
            params = _checked_params(params, config, self.kind)
        # What ToNNX does after its lazy init: one attribute per top-level linen name, nested
        # dicts of nnx.Param.
        attrs = bridge_variables.linen_vars_to_nnx_attrs({"params": params})
        for name, value in attrs.items():
            setattr(self, name, value)

    @property
    def config(self) -> TransformerConfig:
        return self.to_nnx__module.config

    @property
    def linen(self):
        """The wrapped linen module (for `decoding.generate`, `training.steps`, ...)."""
        return self.to_nnx__module


class Transformer(_Bridged):
    """The encoder-decoder model: `model(src, tgt_in) -> logits (batch, tgt_len, tgt_vocab)`."""

    kind = SEQ2SEQ


class TransformerLM(_Bridged):
    """The decoder-only model: `model(tokens) -> logits (batch, len, tgt_vocab)`."""

    kind = LM


class TransformerEncoder(_Bridged):
    """The bare encoder: `model(src) -> the last hidden states (batch, src_len, d_model)`."""

    kind = ENCODER


CLASSES = {SEQ2SEQ: Transformer, LM: TransformerLM, ENCODER: TransformerEncoder}


def model_for_nnx(
    config: TransformerConfig,
    kind: str,
    *,
    rngs: nnx.Rngs,
    params: Mapping[str, Any] | None = None,
) -> _Bridged:
    """The NNX model of `kind` ("seq2seq", "lm" or "encoder"); `params` (a linen tree) replace the
    random init."""
    return CLASSES[check_kind(kind)](config, rngs=rngs, params=params)


def _checked_params(params: Mapping[str, Any], config: TransformerConfig, kind: str):
    """A linen tree (with or without the {"params": ...} level) as jax arrays, after a strict
    check against the config (one ConversionError listing every missing / extra / mis-shaped
    leaf). dtypes are kept, as the converters keep them."""
    check_flax_params(params, config, kind)
    flat = flatten_params(params)
    return unflatten_params({path: jnp.asarray(leaf) for path, leaf in flat.items()})


def load_params(model: _Bridged, params: Mapping[str, Any]) -> None:
    """Replace the model's weights in place by a linen params tree (e.g. from
    `interop.convert.load_flax_params` or `torch_state_to_flax`)."""
    params = _checked_params(params, model.config, model.kind)
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    nnx.update(model, state)


def linen_params(model: nnx.Module) -> dict[str, Any]:
    """The model's weights as the linen params tree (no {"params": ...} level), the tree that
    `TrainState.params`, the converters and `decoding.generate` take."""
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


# ----------------------------------------------------------------------------- training
def loss_fn(model: _Bridged, batch, *, label_smoothing: float = 0.0, deterministic: bool = True):
    """(mean loss over real target tokens, aux {"loss_sum", "token_count", "correct"}): the
    linen `training.steps.loss_fn`, with the NNX model in place of (params, module)."""
    packed = batch_model_kwargs(batch, model.kind, model.config)  # (a packed batch's masks)
    logits = model(*model_inputs(batch, model.kind), deterministic=deterministic, **packed)
    return batch_loss(logits, batch, model.config.pad_id, label_smoothing)


def make_train_step(label_smoothing: float = 0.0):
    """step(model, optimizer, batch) -> metrics, jitted with nnx.jit; model and optimizer
    (`nnx.Optimizer(model, tx, wrt=nnx.Param)`) are updated in place.

    metrics: loss_sum, token_count, correct (sums over the batch), grad_norm (before clipping),
    as the linen step's. Dropout (when the config has it) draws from the model's rngs.
    """

    def compute_loss(model, batch):
        return loss_fn(model, batch, label_smoothing=label_smoothing, deterministic=False)

    @nnx.jit
    def train_step(model: _Bridged, optimizer: nnx.Optimizer, batch):
        grad_fn = nnx.grad(compute_loss, argnums=nnx.DiffState(0, nnx.Param), has_aux=True)
        grads, aux = grad_fn(model, batch)
        optimizer.update(model, grads)
        return dict(aux, grad_norm=optax.tree.norm(grads))

    return train_step


__all__ = [
    "Transformer",
    "TransformerLM",
    "model_for_nnx",
    "load_params",
    "linen_params",
    "loss_fn",
    "make_train_step",
]
