"""int8 matrices with per-output-channel float32 scales (symmetric: w ~ values * scale,
|values| <= 127), and the quantization of a params tree into them.

Which axis is the output channel:
- Dense kernels (in, out): one scale per column, (1, out).
- Embedding tables (vocab, d_model) and learned positions (max_len, d_model): one scale per row,
  (rows, 1). A row is what a lookup reads, and with tie_output the table's rows are also the
  output channels of the logits (x @ table.T), so one layout serves both uses.
Biases and LayerNorm scales (vectors) stay in their float dtype.

Used by export.int8 (weight-only: dequantised inside the program) and nn.int8_products
(dynamic int8 matrix products, hf.load(..., quantize="int8")).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

INT8_MAX = 127
# The leaf names of matrices and the axis their scale runs along (the output channel's).
ROW_SCALED = ("embedding", "weight")  # (rows, d_model) tables: one scale per row
COLUMN_SCALED = ("kernel",)  # (in, out) Dense kernels: one scale per column


@struct.dataclass
class Int8Matrix:
    """A quantised matrix: values int8 (same shape as the matrix), scale float32 broadcastable
    to it, (1, out) or (rows, 1). `dtype` is the float dtype it dequantises to."""

    values: jax.Array
    scale: jax.Array
    dtype: str = struct.field(pytree_node=False, default="float32")

    def dequantize(self) -> jax.Array:
        """The float matrix values * scale, same shape as `values`, in `dtype`."""
        # jnp, not numpy: on constants (weights baked into an export) the convert is staged
        # into the program, so the int8 values are what it stores.
        return (jnp.asarray(self.values).astype(jnp.float32) * self.scale).astype(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes held: the int8 values plus the float32 scales."""
        return int(np.asarray(self.values).nbytes + np.asarray(self.scale).nbytes)


def quantize_matrix(matrix, reduce_axis: int) -> Int8Matrix:
    """Symmetric int8 with one scale per slice along the axis that is not `reduce_axis`."""
    w = np.asarray(matrix, dtype=np.float32)
    scale = np.max(np.abs(w), axis=reduce_axis, keepdims=True) / INT8_MAX
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)  # an all-zero channel stays 0
    values = np.clip(np.rint(w / scale), -INT8_MAX, INT8_MAX).astype(np.int8)
    return Int8Matrix(values, scale, np.dtype(np.asarray(matrix).dtype).name)


def quantize_params(params: dict) -> dict:
    """The params tree with every matrix an Int8Matrix (see the module docstring)."""

    def leaf(path, value):
        name = getattr(path[-1], "key", None)
        if np.ndim(value) == 2 and name in COLUMN_SCALED:
            return quantize_matrix(value, reduce_axis=0)  # scale (1, out)
        if np.ndim(value) == 2 and name in ROW_SCALED:
            return quantize_matrix(value, reduce_axis=1)  # scale (rows, 1)
        return value

    return jax.tree_util.tree_map_with_path(leaf, params)


def quantize_variables(variables: dict[str, Any]) -> dict[str, Any]:
    """{"params": tree} -> {"params": the tree with int8 matrices}; other collections kept."""
    return {**variables, "params": quantize_params(variables["params"])}
