"""The canonical naming rule: Flax param path <-> torch state_dict key (numpy only).

Flax path `a/b/layers_3/c/kernel` <-> torch key `a.b.layers.3.c.weight`. Leaves: Dense `kernel`
(in, out) <-> Linear `weight` (out, in), transposed; LayerNorm `scale`, Embed `embedding` and
learned positions `weight` <-> `weight`; `bias` <-> `bias`. See docs/architecture.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

LEAF_TO_TORCH = {
    "kernel": "weight",
    "scale": "weight",
    "embedding": "weight",
    "bias": "bias",
    "weight": "weight",
}


def module_name(path: tuple[str, ...]) -> str:
    """Torch module name of a Flax module path: ('encoder', 'layers_0', 'ffn') ->
    'encoder.layers.0.ffn'."""
    return ".".join(re.sub(r"^layers_(\d+)$", r"layers.\1", part) for part in path)


def flax_path_to_torch_key(path: tuple[str, ...]) -> str:
    """Canonical torch key of a Flax param path:
    ('encoder', 'layers_3', 'ffn', 'linear1', 'kernel') -> 'encoder.layers.3.ffn.linear1.weight'"""
    prefix = module_name(path[:-1])
    leaf = LEAF_TO_TORCH[path[-1]]
    return f"{prefix}.{leaf}" if prefix else leaf


def is_transposed(path: tuple[str, ...]) -> bool:
    """Dense kernels are (in, out) in Flax and (out, in) in torch."""
    return path[-1] == "kernel"


def convert_layout(path: tuple[str, ...], array):
    """Dense kernels transposed between Flax (in, out) and torch (out, in); others unchanged."""
    return array.T if is_transposed(path) else array


def flatten_params(params: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
    """Nested dict -> {path tuple: leaf}. Accepts {'params': ...} too."""
    if set(params) == {"params"}:
        params = params["params"]
    flat: dict[tuple[str, ...], Any] = {}

    def walk(node, prefix):
        for name, child in node.items():
            if isinstance(child, Mapping):
                walk(child, prefix + (name,))
            else:
                flat[prefix + (name,)] = child

    walk(params, ())
    return flat


def unflatten_params(flat: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    """{path tuple: leaf} -> the nested dict tree (the inverse of flatten_params, without the
    "params" level)."""
    tree: dict[str, Any] = {}
    for path, leaf in flat.items():
        node = tree
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = leaf
    return tree
