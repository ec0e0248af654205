"""Sharded training with jax.sharding: the batch over a `data` axis, weights over `model`.

One code path, the mesh decides: a 1x1 mesh is plain single-device training, data=N is data
parallel, model=M splits attention heads and feed-forward hidden units (Megatron style):

- attention query/key/value kernels (in, out): split on the output axis (= whole heads, since
  out = heads * head_dim is head-major), their biases likewise;
- attention `out` kernel: split on the input axis (the concatenated heads);
- ffn linear1 kernel and bias: split on the output axis (hidden units); linear2 kernel: split
  on the input axis;
- everything else (embeddings, LayerNorms, output biases, lm_head, step counters, rng keys)
  is replicated.
The same rules apply to any pytree whose leaves sit under those names, so the optimiser's
moments (Adam's mu and nu mirror the param tree) are split exactly like the params.

Entry point for a training loop:

    mesh = make_mesh("data=2,model=4")          # or parse_mesh(...) first to validate a flag
    check_config_fits(config, mesh)
    state, step = shard_training(mesh, state, train_step)
    state, metrics = step(state, batch)         # batch: host numpy, sharded over `data`

Many hosts: call `jax.distributed.initialize()` before anything else in every process; the
mesh then spans all processes' devices (jax.devices()), and each host passes its slice of the
global batch through `step` (see `shard_batch`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from flax_transformer.spec.config import TransformerConfig

AXES = ("data", "model")
DATA, MODEL = AXES

# (module name, leaf name) -> spec; checked on the last two names of a leaf's path, with the
# attention modules identified by the name above them.
_ATTENTION_MODULES = ("self_attn", "cross_attn")
_RULES: dict[tuple[str, str], P] = {
    ("query", "kernel"): P(None, MODEL),
    ("key", "kernel"): P(None, MODEL),
    ("value", "kernel"): P(None, MODEL),
    ("query", "bias"): P(MODEL),
    ("key", "bias"): P(MODEL),
    ("value", "bias"): P(MODEL),
    ("out", "kernel"): P(MODEL, None),
    ("linear1", "kernel"): P(None, MODEL),
    ("linear1", "bias"): P(MODEL),
    ("linear2", "kernel"): P(MODEL, None),
}


class MeshError(ValueError):
    """A mesh flag or shape that cannot work, with the reason."""


def parse_mesh(spec: str) -> dict[str, int]:
    """'data=2,model=4' -> {'data': 2, 'model': 4}. Missing axes default to 1."""
    if not isinstance(spec, str) or not spec.strip():
        raise MeshError("mesh spec must look like 'data=2,model=4'")
    sizes = {axis: 1 for axis in AXES}
    seen = set()
    for part in spec.split(","):
        name, sep, value = part.strip().partition("=")
        name = name.strip()
        if not sep or name not in AXES:
            raise MeshError(
                f"bad mesh entry {part.strip()!r} in {spec!r}: expected AXIS=SIZE with AXIS in "
                f"{AXES}"
            )
        if name in seen:
            raise MeshError(f"mesh axis {name!r} given twice in {spec!r}")
        seen.add(name)
        try:
            size = int(value)
        except ValueError:
            raise MeshError(f"mesh axis {name!r} needs an integer size, got {value!r}") from None
        if size < 1:
            raise MeshError(f"mesh axis {name!r} must be >= 1, got {size}")
        sizes[name] = size
    return sizes


def make_mesh(spec: str | Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ('data', 'model') Mesh over the first data*model devices (all by default)."""
    sizes = parse_mesh(spec) if isinstance(spec, str) else {a: int(spec.get(a, 1)) for a in AXES}
    devices = list(jax.devices() if devices is None else devices)
    needed = sizes[DATA] * sizes[MODEL]
    if needed > len(devices):
        raise MeshError(
            f"mesh data={sizes[DATA]},model={sizes[MODEL]} needs {needed} devices, "
            f"only {len(devices)} available ({devices[0].platform if devices else 'none'})"
        )
    grid = np.array(devices[:needed], dtype=object).reshape(sizes[DATA], sizes[MODEL])
    return Mesh(grid, AXES)


def mesh_sizes(mesh: Mesh) -> dict[str, int]:
    return {axis: mesh.shape.get(axis, 1) for axis in AXES}


def check_config_fits(config: TransformerConfig, mesh: Mesh, batch_size: int | None = None):
    """Raise MeshError unless heads, d_ff (and the batch) divide evenly over the mesh."""
    sizes = mesh_sizes(mesh)
    problems = []
    if config.num_heads % sizes[MODEL]:
        problems.append(f"num_heads ({config.num_heads}) is not divisible by model={sizes[MODEL]}")
    if config.d_ff % sizes[MODEL]:
        problems.append(f"d_ff ({config.d_ff}) is not divisible by model={sizes[MODEL]}")
    if batch_size is not None and batch_size % sizes[DATA]:
        problems.append(f"batch size ({batch_size}) is not divisible by data={sizes[DATA]}")
    if problems:
        raise MeshError("mesh does not fit: " + "; ".join(problems))


# ----------------------------------------------------------------------------- specs
def _path_names(path) -> list[str]:
    names = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                names.append(str(getattr(entry, attr)))
                break
    return names


def partition_spec(path_names: Sequence[str], shape: Sequence[int], model_size: int) -> P:
    """The spec of one leaf from its path names, e.g. (..., 'self_attn', 'query', 'kernel')."""
    if len(path_names) < 2 or model_size == 1:
        return P()
    module, leaf = path_names[-2], path_names[-1]
    spec = _RULES.get((module, leaf))
    if spec is None:
        return P()
    if module in ("query", "key", "value", "out"):
        if len(path_names) < 3 or path_names[-3] not in _ATTENTION_MODULES:
            return P()
    if len(spec) != len(shape):
        return P()
    for axis_name, dim in zip(spec, shape, strict=True):
        if axis_name == MODEL and dim % model_size:
            raise MeshError(
                f"{'/'.join(path_names)} of shape {tuple(shape)} cannot be split over "
                f"model={model_size}"
            )
    return spec


def tree_shardings(mesh: Mesh, tree: Any) -> Any:
    """A NamedSharding for every array leaf of `tree` (params, optimiser state, train state)."""
    model_size = mesh_sizes(mesh)[MODEL]

    def leaf_sharding(path, leaf):
        shape = getattr(leaf, "shape", ())
        return NamedSharding(mesh, partition_spec(_path_names(path), shape, model_size))

    return jax.tree_util.tree_map_with_path(leaf_sharding, tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis over `data`, the rest replicated."""
    return NamedSharding(mesh, P(DATA))


def shard_batch(mesh: Mesh, batch: Mapping[str, Any]) -> dict[str, jax.Array]:
    """Put a batch of (batch, ...) arrays on the mesh, split over `data`.

    With one process the batch is the global batch. With several (jax.distributed), each
    process passes its own rows and they are stitched into one global array.
    """
    sharding = batch_sharding(mesh)
    data_size = mesh_sizes(mesh)[DATA]
    out = {}
    for name, value in batch.items():
        value = np.asarray(value)
        if jax.process_count() == 1:
            if value.shape[0] % data_size:
                raise MeshError(
                    f"batch[{name!r}] has {value.shape[0]} rows, not divisible by data={data_size}"
                )
            out[name] = jax.device_put(value, sharding)
        else:
            out[name] = jax.make_array_from_process_local_data(sharding, value)
    return out


def shard_training(
    mesh: Mesh,
    state: Any,
    train_step: Callable[..., tuple[Any, Any]],
    *,
    donate: bool = True,
) -> tuple[Any, Callable[..., tuple[Any, Any]]]:
    """Shard a train state and wrap `train_step(state, batch, *rest) -> (state, metrics)`.

    Returns the sharded state and `step(state, batch, *rest)`, which shards the (host) batch
    over `data` and runs the jitted step with the state kept in its sharding; metrics come back
    replicated. `rest` (e.g. an rng key) is passed through as given.
    """
    state_shardings = tree_shardings(mesh, state)
    state = jax.device_put(state, state_shardings)
    replicated = NamedSharding(mesh, P())
    jitted = jax.jit(
        train_step,
        out_shardings=(state_shardings, replicated),
        donate_argnums=(0,) if donate else (),
    )

    def step(state, batch, *rest):
        return jitted(state, shard_batch(mesh, batch), *rest)

    step.jitted = jitted  # for .lower(...) / cost analysis
    return state, step
