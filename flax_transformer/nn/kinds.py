"""The one registry of model kinds: which linen module each kind is, and its shape-only init."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from flax_transformer.nn.model import Transformer, TransformerEncoder, TransformerLM
from flax_transformer.spec.config import TransformerConfig
from flax_transformer.spec.kinds import ENCODER, INPUT_NAMES, LM, SEQ2SEQ, check_kind

MODULES = {SEQ2SEQ: Transformer, LM: TransformerLM, ENCODER: TransformerEncoder}


def model_for(config: TransformerConfig, kind: str):
    """The linen module of `kind` built from `config`."""
    return MODULES[check_kind(kind)](config)


def kind_of(model) -> str:
    """'seq2seq', 'lm' or 'encoder' for a model instance (subclasses included); TypeError for
    any other."""
    for kind, cls in MODULES.items():
        if isinstance(model, cls):
            return kind
    raise TypeError(f"not a model of a known kind {tuple(MODULES)}: {type(model).__name__}")


def is_lm(model) -> bool:
    """Whether `model` is a TransformerLM (decoder-only), subclasses included; TypeError for a
    model of no known kind."""
    return kind_of(model) == LM


def dummy_inputs(kind: str) -> tuple[jax.Array, ...]:
    """(1, 1) int32 token arrays for init: parameter shapes do not depend on lengths."""
    return tuple(jnp.ones((1, 1), jnp.int32) for _ in INPUT_NAMES[check_kind(kind)])


def init_variables(model, key: jax.Array, **kwargs) -> dict[str, Any]:
    """model.init on dummy inputs (kwargs go to the model call, e.g. decode=True).

    Jitted: one compilation is cheaper on CPU than dispatching every init op eagerly. A fresh
    jit per call on purpose: a cached trace would ignore Python context such as
    `nn.layers.boxed_param_axes()`.
    """
    init = functools.partial(model.init, **kwargs)
    return jax.jit(init)(key, *dummy_inputs(kind_of(model)))


def abstract_variables(model, **kwargs) -> dict[str, Any]:
    """The ShapeDtypeStruct tree init would make, without allocating it (jax.eval_shape)."""
    return jax.eval_shape(lambda: init_variables(model, jax.random.key(0), **kwargs))
