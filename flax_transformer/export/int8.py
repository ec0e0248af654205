"""Weight-only int8 for Flax inference: every matrix of a params tree as int8 values and one
float32 scale per output channel (symmetric: w ~ values * scale, |values| <= 127).

Which axis is the output channel:
- Dense kernels (in, out): one scale per column, (1, out).
- Embedding tables (vocab, d_model) and learned positions (max_len, d_model): one scale per row,
  (rows, 1). A row is what a lookup reads, and with tie_output the table's rows are also the
  output channels of the logits (x @ table.T), so one layout serves both uses.
Biases and LayerNorm scales (vectors) stay in their float dtype: they are a tiny share of the
bytes and quantising them buys nothing.

`Int8Transformer` / `Int8TransformerLM` are the two models with an `apply` that takes such a
tree: the int8 arrays are what is stored and passed into jit, and each matrix is dequantised
inside the traced function, next to the matmul that uses it.
"""

from __future__ import annotations

import jax
import numpy as np

from flax_transformer.nn.int8 import (  # noqa: F401 (re-exported: the export.int8 names)
    COLUMN_SCALED,
    INT8_MAX,
    ROW_SCALED,
    Int8Matrix,
    quantize_matrix,
    quantize_params,
    quantize_variables,
)
from flax_transformer.nn.model import Transformer, TransformerLM


def dequantize(tree):
    """Every Int8Matrix in `tree` back to a float matrix (traced inside jit: a few ops each)."""
    is_q = lambda x: isinstance(x, Int8Matrix)  # noqa: E731
    return jax.tree.map(lambda x: x.dequantize() if is_q(x) else x, tree, is_leaf=is_q)


def tree_nbytes(tree) -> int:
    """Bytes of every array in `tree` (an Int8Matrix counts its values and its scales)."""
    is_q = lambda x: isinstance(x, Int8Matrix)  # noqa: E731
    leaves = jax.tree.leaves(tree, is_leaf=is_q)
    return sum(x.nbytes if is_q(x) else int(np.asarray(x).nbytes) for x in leaves)


class _DequantizingApply:
    """`apply` that accepts int8 variables: matrices are dequantised inside the traced call."""

    def apply(self, variables, *args, **kwargs):
        return super().apply(dequantize(variables), *args, **kwargs)


class Int8Transformer(_DequantizingApply, Transformer):
    """Transformer whose `apply` takes `quantize_variables(...)` output (or float variables)."""


class Int8TransformerLM(_DequantizingApply, TransformerLM):
    """TransformerLM whose `apply` takes `quantize_variables(...)` output."""


def int8_model(model):
    """The int8-accepting twin of a Transformer / TransformerLM, same config."""
    if isinstance(model, Transformer):
        return Int8Transformer(model.config)
    if isinstance(model, TransformerLM):
        return Int8TransformerLM(model.config)
    raise TypeError(f"not a Transformer or TransformerLM: {type(model).__name__}")
