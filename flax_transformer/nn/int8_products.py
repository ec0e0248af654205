"""Dynamic int8 matrix products: a model whose Dense kernels and embedding table are Int8Matrix
(nn.int8: int8 values, one float32 scale per output channel) computes each product as
int8 x int8 -> int32, the activations quantised per row at run time (symmetric, one scale per
row), the row scales and the weight scales applied to the int32 accumulators.

The model code is not changed: `Int8ProductsTransformer` / `Int8ProductsTransformerLM` run their
`apply` under a flax method interceptor that routes `Dense.__call__` and `nn.Embed.__call__` /
`attend` to the int8 code when their parameter is an Int8Matrix (anything else runs as usual).

On a CPU with Intel AMX, or else AVX2, the products run in kernels.int8_amx's kernels, on
weights packed once by `quantize_for_products` (an AmxInt8Matrix: the layout both read);
elsewhere, and for matrices whose input size is not a multiple of 64, in XLA's int8 dot. All
are exact int8 x int8 -> int32, so the paths give the same numbers;
FLAX_TRANSFORMER_INT8_KERNEL chooses (`KERNELS.int8`, kernels.switches).

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
from flax import struct

from flax_transformer.kernels import int8_amx
from flax_transformer.kernels.switches import KERNELS
from flax_transformer.nn.int8 import INT8_MAX, Int8Matrix, quantize_matrix
from flax_transformer.nn.layers import Dense, product_matrix
from flax_transformer.nn.model import Transformer, TransformerEncoder, TransformerLM

# Products of fewer rows are padded with zero rows to this many. 2 or 4: bench/NOTES.md
# ("int8 for Hugging Face models") measured the one-row output-table product at 3.61 ms padded
# to 4, 3.76 ms to 2, 5.95 ms to 8 (float32 6.10); whole-decode runs could not tell 2 from 4
# apart on the shared 2-core machine. 4, the faster of the two on the largest product.
MIN_ROWS = 4


@struct.dataclass
class AmxInt8Matrix(Int8Matrix):
    """An Int8Matrix whose products run in kernels.int8_amx's kernels (AMX or AVX2, the one
    KERNELS.int8 chooses): `packed` is the matrix as (in, out), in their layout
    (int8_amx.pack), `values` and `scale` as before."""

    packed: jax.Array | None = None


def quantize_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(rows, in) float -> int8 values and (rows, 1) float32 scales, one per row."""
    x = x.astype(jnp.float32)
    scale = jnp.maximum(jnp.max(jnp.abs(x), axis=-1, keepdims=True), 1e-12) / INT8_MAX
    return jnp.clip(jnp.round(x / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8), scale


def int8_product(rows: jax.Array, matrix: Int8Matrix, contract_axis: int) -> jax.Array:
    """rows (n, in) float times the int8 values of `matrix` contracted on `contract_axis` (0:
    an (in, out) kernel, 1: a (vocab, in) table): the int32 accumulators as float32 times the
    row scales; the caller applies the weight scales. An AmxInt8Matrix's product runs in the
    packed kernel, without padding rows (it has no per-call packing to spread over them)."""
    n = rows.shape[0]
    packed = isinstance(matrix, AmxInt8Matrix)
    if n < MIN_ROWS and not packed:
        rows = jnp.concatenate([rows, jnp.zeros((MIN_ROWS - n, rows.shape[1]), rows.dtype)])
    xq, sx = quantize_rows(rows)
    values = matrix.values
    if packed:
        build = KERNELS.int8.choose().build or "amx"  # the build that packed it (same switch)
        acc = int8_amx.product(xq, matrix.packed, values.shape[1 - contract_axis], build)
    else:
        acc = jax.lax.dot_general(
            xq, values, (((1,), (contract_axis,)), ((), ())), preferred_element_type=jnp.int32
        )
    return (acc.astype(jnp.float32) * sx)[:n]


def _dense(module: Dense, kernel: Int8Matrix, x: jax.Array) -> jax.Array:
    y = int8_product(x.reshape(-1, x.shape[-1]), kernel, 0) * kernel.scale
    y = y.reshape(x.shape[:-1] + (module.features,)).astype(module.dtype or x.dtype)
    return y + module.get_variable("params", "bias") if module.use_bias else y


def _embed(module: nn.Embed, method: str, table: Int8Matrix, x: jax.Array) -> jax.Array:
    if method == "__call__":  # a lookup: the rows read, dequantised
        rows = jnp.take(table.values, x, axis=0).astype(jnp.float32)
        return (rows * jnp.take(table.scale, x, axis=0)).astype(module.dtype)
    y = int8_product(x.reshape(-1, x.shape[-1]), table, 1) * table.scale[:, 0]
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
    """{"params": tree} with every Dense kernel (one scale per column) and nn.Embed table (one
    scale per row) an Int8Matrix (nn.int8.quantize_matrix); other leaves (a relative position
    bias's table among them) and collections as they were. Where kernels.int8_amx runs
    (KERNELS.int8: its switch, the CPU), the matrices whose input size suits its tiles are
    AmxInt8Matrix, packed for it."""
    axes = {"kernel": 0, "embedding": 1}  # the axis reduced: the scale runs along the other
    amx = KERNELS.int8.active()

    def leaf(path, value):
        name = product_matrix(path, value)
        if name is None:
            return value
        matrix = quantize_matrix(value, reduce_axis=axes[name])
        if not amx:
            return matrix
        # As the product reads it: (in, out); a table (vocab, in) is the transpose.
        product_layout = np.asarray(matrix.values if name == "kernel" else matrix.values.T)
        if not int8_amx.supports(product_layout.shape[0]):
            return matrix
        packed = int8_amx.pack(product_layout)
        return AmxInt8Matrix(matrix.values, matrix.scale, matrix.dtype, packed)

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


class Int8ProductsTransformerEncoder(_Int8ProductsApply, TransformerEncoder):
    """TransformerEncoder (BERT, RoBERTa, DistilBERT, a T5 encoder; its pooler and head too)
    computing with dynamic int8 products on `quantize_for_products` variables."""


def int8_products_model(model):
    """The int8-products twin of a Transformer / TransformerLM / TransformerEncoder, same
    config."""
    if isinstance(model, Transformer):
        return Int8ProductsTransformer(model.config)
    if isinstance(model, TransformerLM):
        return Int8ProductsTransformerLM(model.config)
    if isinstance(model, TransformerEncoder):
        return Int8ProductsTransformerEncoder(model.config)
    raise TypeError(
        "int8 products need a Transformer, TransformerLM or TransformerEncoder: "
        f"{type(model).__name__}"
    )


def is_int8_products(model) -> bool:
    """Whether `model` computes with int8 products (an Int8Products* model)."""
    return isinstance(model, _Int8ProductsApply)
