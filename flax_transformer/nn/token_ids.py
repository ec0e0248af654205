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
