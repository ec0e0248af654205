"""Sharded training with jax.sharding: the batch over a `data` axis, weights over `model`.

One code path, the mesh decides: a 1x1 mesh is plain single-device training, data=N is data
parallel, model=M splits attention heads and feed-forward hidden units (Megatron style).

Every param declares the logical names of its axes where it is created (nn/layers.py's
`with_axes`); LOGICAL_RULES maps those names to mesh axes:

- "heads" (num_heads * head_dim, head-major) -> model: the query/key/value kernels and biases
  split on their output axis (whole heads), the attention `out` kernel on its input axis;
- "mlp" (d_ff) -> model: ffn linear1's kernel and bias on the output axis, linear2's kernel on
  its input axis;
- "embed", "embed_out", "labels", "head_count", "head_dim", "vocab", "position" -> replicated:
  embeddings, LayerNorms, output biases, lm_head, an encoder's pooler and heads, T5's
  relative bias.
Leaves outside the params (step counters, rng keys) are replicated, and any part of the state
shaped like the param tree (the optimiser's moments: Adam's mu and nu mirror it) is laid out
exactly like the params.

Entry point for a training loop:

    mesh = make_mesh("data=2,model=4")          # or parse_mesh(...) first to validate a flag
    check_config_fits(config, mesh)
    state, step = shard_training(mesh, state, train_step, model=model)
    state, metrics = step(state, batch)         # batch: host numpy, sharded over `data`

Many processes (distributed.py joins them): the mesh spans all processes' devices
(jax.devices()), and each process passes its rows of the global batch through `step` (see
`shard_batch`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from flax_transformer.nn.kinds import abstract_variables
from flax_transformer.nn.layers import boxed_param_axes
from flax_transformer.spec.config import TransformerConfig

AXES = ("data", "model")
DATA, MODEL = AXES

# Logical axis name -> mesh axis (None: replicated). Every name a param declares needs a rule.
LOGICAL_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", DATA),
    ("heads", MODEL),
    ("mlp", MODEL),
    ("embed", None),
    ("embed_out", None),  # the output of a d_model x d_model matrix (pooler, encoder heads)
    ("labels", None),  # a classifier's classes
    ("head_count", None),  # one value per head (T5's relative bias): small, replicated
    ("head_dim", None),  # one value per unit of a head (Qwen3's q/k norms): replicated
    ("vocab", None),
    ("position", None),
)


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
    """{"data": n, "model": m}: the mesh's size along each axis (1 for an axis it lacks)."""
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
def _is_box(node) -> bool:
    return isinstance(node, nn.LogicallyPartitioned)


def _boxed_params(model, inputs, kwargs) -> Any:
    """A shape-only init of `model` with every param boxed with its logical axis names."""
    with boxed_param_axes():
        if inputs or kwargs:
            variables = jax.eval_shape(lambda: model.init(jax.random.key(0), *inputs, **kwargs))
        else:
            variables = abstract_variables(model)
    params = variables.get("params", {})
    leaves, _ = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_box)
    undeclared = [_path_str(path) for path, leaf in leaves if not _is_box(leaf)]
    if undeclared:
        raise MeshError(
            "params without logical axis names (create them with nn.layers.with_axes): "
            + ", ".join(undeclared)
        )
    return params


def logical_param_specs(model, *inputs, **kwargs) -> Any:
    """The param tree of `model` with a PartitionSpec of each param's logical axis names.

    Read from a shape-only init (nothing is allocated) called with `inputs` and `kwargs`, by
    default the model kind's dummy inputs (nn.kinds). Raises MeshError for a param that
    declares no axes.
    """
    return jax.tree.map(
        lambda box: P(*box.names), _boxed_params(model, inputs, kwargs), is_leaf=_is_box
    )


def mesh_partition_spec(
    logical: P, shape: Sequence[int], sizes: Mapping[str, int], where: str = "param"
) -> P:
    """Logical axis names -> mesh axes by LOGICAL_RULES, for an array of `shape` on a mesh of
    `sizes` ({"data": 2, "model": 4}). Mesh axes of size 1 are dropped (replicated).

    Raises MeshError for a name without a rule or a dimension the mesh axis does not divide.
    """
    rules = dict(LOGICAL_RULES)
    unknown = [name for name in logical if name is not None and name not in rules]
    if unknown:
        raise MeshError(f"{where}: no sharding rule for the logical axis {unknown[0]!r}")
    if len(logical) != len(shape):
        raise MeshError(f"{where} of shape {tuple(shape)} has logical axes {tuple(logical)}")
    spec = nn.logical_to_mesh_axes(tuple(logical), LOGICAL_RULES)
    axes = tuple(axis if axis is not None and sizes.get(axis, 1) > 1 else None for axis in spec)
    for axis, dim in zip(axes, shape, strict=True):
        if axis is not None and dim % sizes[axis]:
            raise MeshError(
                f"{where} of shape {tuple(shape)} cannot be split over {axis}={sizes[axis]}"
            )
    return P(*axes) if any(axes) else P()


def param_partition_specs(model, sizes: Mapping[str, int], *inputs, **kwargs) -> Any:
    """The mesh PartitionSpec of every param of `model` on a mesh of `sizes` (a param tree).

    `inputs` and `kwargs` as for logical_param_specs.
    """

    def spec(path, box):
        return mesh_partition_spec(P(*box.names), box.value.shape, sizes, _path_str(path))

    boxed = _boxed_params(model, inputs, kwargs)
    return jax.tree_util.tree_map_with_path(spec, boxed, is_leaf=_is_box)


def _path_str(path) -> str:
    names = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                names.append(str(getattr(entry, attr)))
                break
    return "/".join(names)


def tree_shardings(mesh: Mesh, tree: Any, param_specs: Any) -> Any:
    """A NamedSharding for every array leaf of `tree` (params, optimiser state, train state).

    Each part of `tree` with the structure of `param_specs` (a param tree of PartitionSpecs,
    see param_partition_specs) - the params, and optimiser moments that mirror them - takes
    those specs; every other leaf is replicated. Raises MeshError when no part matches.
    """
    params_def = jax.tree.structure(param_specs)
    matched = []

    def is_params(node) -> bool:
        return jax.tree.structure(node) == params_def

    def shard(node):
        if not is_params(node):
            return NamedSharding(mesh, P())
        matched.append(node)
        return jax.tree.map(lambda spec, _: NamedSharding(mesh, spec), param_specs, node)

    shardings = jax.tree.map(shard, tree, is_leaf=is_params)
    if not matched:
        raise MeshError("no part of the tree has the structure of the model's params")
    return shardings


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis over `data`, the rest replicated."""
    return NamedSharding(mesh, nn.logical_to_mesh_axes(("batch",), LOGICAL_RULES))


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
    model,
    donate: bool = True,
) -> tuple[Any, Callable[..., tuple[Any, Any]]]:
    """Shard a train state and wrap `train_step(state, batch, *rest) -> (state, metrics)`.

    `model` is the linen model the state's params belong to: its params' declared logical
    axes decide their layout. Returns the sharded state and `step(state, batch, *rest)`,
    which shards the (host) batch over `data` and runs the jitted step with the state kept in
    its sharding; metrics come back replicated. `rest` (e.g. an rng key) is passed through.
    """
    param_specs = param_partition_specs(model, mesh_sizes(mesh))
    state_shardings = tree_shardings(mesh, state, param_specs)
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
