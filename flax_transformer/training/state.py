"""The train state: everything one optimizer step changes, and how a run starts."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from flax_transformer.nn.kinds import init_variables
from flax_transformer.spec.naming import flatten_params, unflatten_params


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


def start_params(saved, config, kind: str, fresh=None, seed: int = 0):
    """A new run's parameters from a saved run's (`saved`, the inner tree; --init-from): in the
    new config's parameter dtype; with `fresh` (parameter paths, e.g. ("head/classifier",)),
    those layers, and any the saved run lacks or holds in another shape, newly initialised
    from `seed` (said in one line)."""
    from flax_transformer.nn.kinds import model_for

    dtype = jnp.dtype(config.param_dtype)
    params = jax.tree.map(lambda leaf: jnp.asarray(leaf, dtype), saved)
    if fresh is None:
        return params
    return _with_new_layers(params, model_for(config, kind), tuple(fresh), seed)


def _with_new_layers(saved, model, fresh: tuple[str, ...], seed: int):
    """The new model's params: `saved` where it has the path and shape (and the path is not
    under `fresh`), else a new initialisation from `seed`."""
    new = flatten_params(init_params(model, seed))
    old = flatten_params(saved)
    taken, started = {}, []
    for path, leaf in new.items():
        name = "/".join(path)
        kept = path in old and old[path].shape == leaf.shape
        if kept and not any(name == f or name.startswith(f + "/") for f in fresh):
            taken[path] = old[path]
        else:
            taken[path] = leaf
            started.append(name)
    dropped = sorted("/".join(p) for p in old if p not in new)
    modules = sorted({name.rsplit("/", 1)[0] for name in started})
    if modules or dropped:
        print(
            "--init-from: new " + (", ".join(modules) or "nothing")
            + (f"; left out {', '.join(dropped)}" if dropped else "")
        )  # fmt: skip
    return unflatten_params(taken)
