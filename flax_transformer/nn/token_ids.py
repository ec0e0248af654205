"""Token-id checks on concrete values, for calls outside `jax.jit`.

Inside `jit` the ids are tracers with no values, so nothing here runs; there an id outside
`[0, vocab)` is not an error: the embedding lookup (`jnp.take`, mode "fill") gives a negative id
the row counted from the end and an id >= vocab a row of NaN. Check ids where they are made
(the tokenizer, the data loader, `generate`'s inputs), as this project's entry points do.
"""

from __future__ import annotations

import jax
import numpy as np

from flax_transformer.spec.validate import token_id_problem


def is_concrete(value) -> bool:
    """True for numpy arrays and committed jax arrays; False for tracers (under jit, grad...)."""
    return not isinstance(value, jax.core.Tracer)


def check_token_ids(name: str, tokens, vocab_size: int) -> None:
    """ValueError naming the first id outside [0, vocab_size) and where it is; a no-op on
    traced values."""
    if not is_concrete(tokens):
        return
    problem = token_id_problem(name, tokens, vocab_size)
    if problem:
        raise ValueError(problem)


def as_token_array(name: str, tokens):
    """`tokens` as an array (a list of equal-length rows is accepted): a ValueError naming
    `name` for ragged rows, which numpy would report as "inhomogeneous shape"."""
    if hasattr(tokens, "shape") and hasattr(tokens, "dtype"):
        return tokens  # numpy or jax: kept where it is (no copy to the host)
    try:
        return np.asarray(tokens)
    except ValueError:
        raise ValueError(
            f"{name} must be a (batch, length) array of token ids; its rows have different "
            "lengths (right-pad them with the pad id)"
        ) from None


def token_array_problem(name: str, tokens) -> str | None:
    """What is wrong with `tokens` as a batch of token-id rows, naming `name`, its shape and
    dtype: not 2-D, not integers, an empty batch or empty rows. None when it is fine."""
    shape, dtype = tuple(np.shape(tokens)), getattr(tokens, "dtype", None)
    if len(shape) != 2:
        return (
            f"{name} must be a (batch, length) array of token ids, got a {len(shape)}-D array "
            f"of shape {shape}"
        )
    if dtype is None or not np.issubdtype(np.dtype(dtype), np.integer):
        return (
            f"{name} must hold integer token ids, got dtype {dtype} (shape {shape}); token ids "
            "come from a tokenizer, as int32"
        )
    if shape[0] == 0:
        return f"{name} is an empty batch (shape {shape}): give at least one row"
    if shape[1] == 0:
        return f"{name} has rows of length 0 (shape {shape}): each row needs at least one token"
    return None


def check_token_array(name: str, tokens):
    """`tokens` (as an array) if `token_array_problem` finds nothing, else its ValueError."""
    tokens = as_token_array(name, tokens)
    problem = token_array_problem(name, tokens)
    if problem:
        raise ValueError(problem)
    return tokens


def check_same_batch(**arrays) -> None:
    """Arguments that must agree on the batch size (axis 0): a ValueError naming both shapes."""
    (first, a), *rest = arrays.items()
    for name, b in rest:
        if np.shape(a)[0] != np.shape(b)[0]:
            raise ValueError(
                f"{first} of shape {tuple(np.shape(a))} and {name} of shape "
                f"{tuple(np.shape(b))} disagree on the batch size ({np.shape(a)[0]} vs "
                f"{np.shape(b)[0]})"
            )
