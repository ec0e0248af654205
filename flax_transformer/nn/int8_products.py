"""Dynamic int8 matrix products: a model whose Dense kernels and embedding table are Int8Matrix
(nn.int8: int8 values, one float32 scale per output channel) computes each product as
int8 x int8 -> int32, the activations quantised per row at run time (symmetric, one scale per
row), the row scales and the weight scales applied to the int32 accumulators.

The model code is not changed: `Int8ProductsTransformer` / `Int8ProductsTransformerLM` run their
`apply` under a flax method interceptor that routes `Dense.__call__` and `nn.Embed.__call__` /
`attend` to the int8 code when their parameter is an Int8Matrix (anything else runs as usual).

Why dynamic int8 and not weight-only: on XLA:CPU a dequantise-then-float32 product is slower
than float32 itself; an int8 x int8 product of 4-8 rows was 2-2.8x faster (bench/NOTES.md,
"int8 for Hugging Face models"). Fewer rows than MIN_ROWS are padded with zero rows: an int8
product of one row was slower than float32, one padded to 2-4 rows about 1.5x faster.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_transformer.nn.int8 import INT8_MAX, Int8Matrix, quantize_matrix
from flax_transformer.nn.layers import Dense
from flax_transformer.nn.model import Transformer, TransformerLM

# Products of fewer rows are padded with zero rows to this many. 2 or 4: bench/NOTES.md
# ("int8 for Hugging Face models") measured the one-row output-table product at 3.61 ms padded
# to 4, 3.76 ms to 2, 5.95 ms to 8 (float32 6.10); whole-decode runs could not tell 2 from 4
# apart on the shared 2-core machine. 4, the faster of the two on the largest product.
MIN_ROWS = 4


def quantize_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(rows, in) float -> int8 values and (rows, 1) float32 scales, one per row."""
    x = x.astype(jnp.float32)
    scale = jnp.maximum(jnp.max(jnp.abs(x), axis=-1, keepdims=True), 1e-12) / INT8_MAX
    return jnp.clip(jnp.round(x / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8), scale


def int8_product(rows: jax.Array, values: jax.Array, contract_axis: int) -> jax.Array:
    """rows (n, in) float times int8 `values` contracted on `contract_axis` (0: an (in, out)
    kernel, 1: a (vocab, in) table): the int32 accumulators as float32 times the row scales;
    the caller applies the weight scales."""
    n = rows.shape[0]
    if n < MIN_ROWS:
        rows = jnp.concatenate([rows, jnp.zeros((MIN_ROWS - n, rows.shape[1]), rows.dtype)])
    xq, sx = quantize_rows(rows)
    acc = jax.lax.dot_general(
        xq, values, (((1,), (contract_axis,)), ((), ())), preferred_element_type=jnp.int32
    )
    return (acc.astype(jnp.float32) * sx)[:n]


def _dense(module: Dense, kernel: Int8Matrix, x: jax.Array) -> jax.Array:
    y = int8_product(x.reshape(-1, x.shape[-1]), kernel.values, 0) * kernel.scale
    y = y.reshape(x.shape[:-1] + (module.features,)).astype(module.dtype or x.dtype)
    return y + module.get_variable("params", "bias") if module.use_bias else y


def _embed(module: nn.Embed, method: str, table: Int8Matrix, x: jax.Array) -> jax.Array:
    if method == "__call__":  # a lookup: the rows read, dequantised
        rows = jnp.take(table.values, x, axis=0).astype(jnp.float32)
        return (rows * jnp.take(table.scale, x, axis=0)).astype(module.dtype)
    y = int8_product(x.reshape(-1, x.shape[-1]), table.values, 1) * table.scale[:, 0]
    return y.reshape(x.shape[:-1] + (table.values.shape[0],)).astype(module.dtype)


def int8_interceptor(next_fun, args, kwargs, context):
    """flax method interceptor: int8 products for Dense / Embed whose parameter is int8."""
    module, method = context.module, context.method_name
    if isinstance(module, Dense) and method == "__call__":
        kernel = module.get_variable("params", "kernel")
        if isinstance(kernel, Int8Matrix):
            return _dense(module, kernel, *args)
    if isinstance(module, nn.Embed) and method in ("__call__", "attend"):
        table = module.get_variable("params", "embedding")
        if isinstance(table, Int8Matrix):
            return _embed(module, method, table, *args)
    return next_fun(*args, **kwargs)


def quantize_for_products(variables: dict) -> dict:
    """{"params": tree} with every Dense kernel (one scale per column) and embedding table (one
    scale per row) an Int8Matrix (nn.int8.quantize_matrix); other leaves and collections, the
    learned position tables included, as they were."""
    axes = {"kernel": 0, "embedding": 1}  # the axis reduced: the scale runs along the other

    def leaf(path, value):
        name = getattr(path[-1], "key", None)
        if np.ndim(value) == 2 and name in axes:
            return quantize_matrix(value, reduce_axis=axes[name])
        return value

    params = jax.tree_util.tree_map_with_path(leaf, variables["params"])
    return {**variables, "params": params}


class _Int8ProductsApply:
    """`apply` under the int8 interceptor (float parameters run as usual)."""

    def apply(self, variables, *args, **kwargs):
        with nn.intercept_methods(int8_interceptor):
            return super().apply(variables, *args, **kwargs)


class Int8ProductsTransformer(_Int8ProductsApply, Transformer):
    """Transformer computing with dynamic int8 products on `quantize_for_products` variables."""


class Int8ProductsTransformerLM(_Int8ProductsApply, TransformerLM):
    """TransformerLM computing with dynamic int8 products on `quantize_for_products` variables."""


def int8_products_model(model):
    """The int8-products twin of a Transformer / TransformerLM, same config."""
    if isinstance(model, Transformer):
        return Int8ProductsTransformer(model.config)
    if isinstance(model, TransformerLM):
        return Int8ProductsTransformerLM(model.config)
    raise TypeError(f"int8 products need a Transformer or TransformerLM: {type(model).__name__}")


def is_int8_products(model) -> bool:
    """Whether `model` computes with int8 products (an Int8Products* model)."""
    return isinstance(model, _Int8ProductsApply)
