"""Shared builders for the parity tests: torch module -> converted Flax params, inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

import torch_reference
from flax_transformer import TransformerConfig
from flax_transformer.interop.convert import torch_state_to_params
from flax_transformer.spec.naming import flatten_params

# d_model != d_ff != vocab sizes, so a wrong transpose is a shape error, not a silent pass.
SMALL = dict(
    src_vocab_size=37,
    tgt_vocab_size=41,
    d_model=24,
    num_heads=3,
    num_encoder_layers=2,
    num_decoder_layers=2,
    d_ff=40,
    max_len=32,
    dropout_rate=0.0,
)


def small_config(dtype: str = "float64", **changes) -> TransformerConfig:
    return TransformerConfig(**{**SMALL, "dtype": dtype, "param_dtype": dtype, **changes})


def torch_dtype(config: TransformerConfig) -> torch.dtype:
    return torch_reference.model.TORCH_DTYPES[config.dtype]


def convert_module(torch_module: torch.nn.Module, flax_module, *init_args) -> dict:
    """Flax params for `flax_module` holding `torch_module`'s weights (strict, by the rule)."""
    abstract = jax.eval_shape(lambda: flax_module.init(jax.random.key(0), *init_args))
    expected = {p: tuple(a.shape) for p, a in flatten_params(abstract).items()}
    state = torch_reference.state_dict_to_numpy(torch_module)
    return torch_state_to_params(state, expected, type(flax_module).__name__)


def random_tokens(
    rng: np.random.Generator, batch: int, length: int, vocab: int, lengths=None, pad_id: int = 0
) -> np.ndarray:
    """(batch, length) ids in [1, vocab); positions past lengths[b] are pad_id."""
    tokens = rng.integers(1, vocab, size=(batch, length))
    if lengths is not None:
        for row, n in enumerate(lengths):
            tokens[row, n:] = pad_id
    return tokens


def random_floats(rng: np.random.Generator, shape, dtype: str) -> tuple[jnp.ndarray, torch.Tensor]:
    array = rng.standard_normal(shape).astype(dtype)
    return jnp.asarray(array), torch.from_numpy(array)


def to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().numpy()
    return np.asarray(x)
