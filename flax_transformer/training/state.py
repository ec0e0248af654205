"""The train state: everything one optimizer step changes, and how a run starts."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from flax_transformer.nn.kinds import init_variables


@flax.struct.dataclass
class TrainState:
    """Everything a step changes. `rng` is a raw uint32 key; dropout uses fold_in(rng, step)."""

    step: jax.Array  # int32 scalar: optimizer updates done so far
    params: Any  # the Flax tree without the {"params": ...} level
    opt_state: Any
    rng: jax.Array


def init_params(model, seed_or_key):
    """Fresh params (inner tree) from a small dummy batch; shapes do not depend on lengths."""
    key = jax.random.PRNGKey(seed_or_key) if isinstance(seed_or_key, int) else seed_or_key
    return init_variables(model, key)["params"]


def create_train_state(model, optimizer, seed: int, params=None) -> TrainState:
    """State at step 0: params from `seed` (unless given), dropout base key from `seed` too."""
    init_key, dropout_key = jax.random.split(jax.random.PRNGKey(seed))
    if params is None:
        params = init_params(model, init_key)
    return TrainState(
        step=jnp.array(0, jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=dropout_key,
    )
