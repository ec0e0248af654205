"""float32 products on weights packed once (kernels.f32_packed), for generation.

`pack_for_products` returns the variables with every float32 Dense kernel and embedding table
a PackedF32Matrix (the matrix as stored, plus its copy in the kernel's layout), and
`packed_products_model` the model's twin whose `apply` routes `Dense.__call__` and
`nn.Embed.attend` to the kernel when their parameter is packed (lookups read the table as
stored; anything else runs as usual), as nn.int8_products does for int8. hf.generate uses
them where kernels.f32_packed runs (`KERNELS.f32`: FLAX_TRANSFORMER_F32_KERNEL); the HFModel's
own variables are never replaced, so saving, converting and the forward pass see plain arrays.

The cost in memory: the embedding tables twice (as stored, for the lookups, and packed); the
Dense kernels are held packed only.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from flax_transformer.kernels import f32_packed
from flax_transformer.kernels.switches import KERNELS
from flax_transformer.nn.layers import Dense, product_matrix
from flax_transformer.nn.model import Transformer, TransformerLM


@struct.dataclass
class PackedF32Matrix:
    """A float32 matrix as the product reads it, (in, out) in f32_packed's layout (`packed`),
    and, for an embedding table (vocab, in), as stored (`values`: the lookups read its rows;
    None for a Dense kernel, which only the product reads)."""

    # values first: flax checks a parameter's first leaf against the shape the module declares
    # (nn.Embed does, in its setup, before any lookup).
    values: jax.Array | None
    packed: jax.Array


def _dense(module: Dense, kernel: PackedF32Matrix, x: jax.Array) -> jax.Array:
    rows = x.reshape(-1, x.shape[-1])  # (..., in) -> (rows, in)
    y = f32_packed.product(rows, kernel.packed, module.features)
    y = y.reshape(x.shape[:-1] + (module.features,)).astype(module.dtype or x.dtype)
    return y + module.get_variable("params", "bias") if module.use_bias else y


def _embed(module: nn.Embed, method: str, table: PackedF32Matrix, x: jax.Array) -> jax.Array:
    if method == "__call__":  # a lookup: the rows as stored
        return jnp.take(table.values, x, axis=0).astype(module.dtype or table.values.dtype)
    y = f32_packed.product(x.reshape(-1, x.shape[-1]), table.packed, table.values.shape[0])
    return y.reshape(x.shape[:-1] + (table.values.shape[0],)).astype(module.dtype or x.dtype)


def packed_interceptor(next_fun, args, kwargs, context):
    """flax method interceptor: the packed kernel for Dense / Embed whose parameter is packed."""
    module, method = context.module, context.method_name
    if isinstance(module, Dense) and method == "__call__":
        kernel = module.get_variable("params", "kernel")
        if isinstance(kernel, PackedF32Matrix):
            return _dense(module, kernel, *args)
    if isinstance(module, nn.Embed) and method in ("__call__", "attend"):
        table = module.get_variable("params", "embedding")
        if isinstance(table, PackedF32Matrix):
            return _embed(module, method, table, *args)
    return next_fun(*args, **kwargs)


def pack_for_products(variables: dict) -> dict:
    """{"params": tree} with every float32 Dense kernel and nn.Embed table a PackedF32Matrix;
    other leaves (a relative position bias's table among them) and collections as they were. The
    packed copies replace the kernels; the tables are kept as well, for their lookups."""

    def leaf(path, value):
        name = product_matrix(path, value)
        if name is None or value.dtype != np.float32:
            return value
        if name == "kernel":  # (in, out) already
            return PackedF32Matrix(None, f32_packed.pack(np.asarray(value)))
        return PackedF32Matrix(value, f32_packed.pack(np.asarray(value).T))

    params = jax.tree_util.tree_map_with_path(leaf, variables["params"])
    return {**variables, "params": params}


class _PackedProductsApply:
    """`apply` under the packed interceptor."""

    def apply(self, variables, *args, **kwargs):
        with nn.intercept_methods(packed_interceptor):
            return super().apply(variables, *args, **kwargs)


class PackedProductsTransformer(_PackedProductsApply, Transformer):
    """Transformer computing its float32 products in kernels.f32_packed, on packed variables."""


class PackedProductsTransformerLM(_PackedProductsApply, TransformerLM):
    """TransformerLM computing its float32 products in kernels.f32_packed, on packed variables."""


def packed_products_model(model):
    """The packed-products twin of a Transformer / TransformerLM, same config; None for any
    other model (it keeps XLA's products)."""
    if type(model) is Transformer:
        return PackedProductsTransformer(model.config)
    if type(model) is TransformerLM:
        return PackedProductsTransformerLM(model.config)
    return None


def for_generation(model, variables: dict, config) -> tuple:
    """(model, variables) a float32 Transformer / TransformerLM generates with: its packed twin
    and packed variables where kernels.f32_packed runs (KERNELS.f32: its switch, the CPU), else
    as given."""
    twin = packed_products_model(model)
    if twin is None or not config.dtype == config.param_dtype == "float32":
        return model, variables
    if not KERNELS.f32.active():
        return model, variables
    return twin, pack_for_products(variables)
