"""Collect every named intermediate of the Flax model and of the torch twin, by canonical name.

Canonical names are torch-style dotted module paths (the Flax path `encoder/layers_0/norm1`
is `encoder.layers.0.norm1`), plus:
- `src_embedded`, `tgt_embedded`: token embeddings (scaled if configured) + positions;
- `<attention module>.attention_weights`: (batch, heads, q_len, k_len) softmax weights;
- `encoder`, `decoder`: the stacks' outputs (after the final norm when there is one);
- `logits`: the model output.
Every sub-layer output is the module's own output: `...self_attn` is the attention output
before dropout and residual, `...norm1` is the LayerNorm output, `...ffn` the feed-forward output.

Flax values come from `capture_intermediates` (a module's `__call__` output) and the sown
`intermediates`; torch values from forward hooks. Both return {name: float64-able ndarray} and
the torch side also the order in which the values were computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from flax_transformer.spec.kinds import ENCODER, LM
from flax_transformer.spec.kinds import model_inputs as kind_inputs
from flax_transformer.spec.naming import module_name

SOWN_EMBEDDINGS = ("src_embedded", "tgt_embedded")
ATTENTION_SUFFIX = ".attention_weights"


def flax_path_to_name(path: tuple[str, ...]) -> str:
    """('encoder', 'layers_0', 'ffn') -> 'encoder.layers.0.ffn' (the naming rule); () -> logits."""
    return module_name(path) if path else "logits"


def output_name(model_kind: str) -> str:
    """The model's own output in the report: a bare encoder's is its last hidden state."""
    return "output" if model_kind == ENCODER else "logits"


def embeddings_of(model_kind: str) -> list[str]:
    """The sown embeddings a model of `model_kind` makes, in the order it makes them."""
    return {LM: ["tgt_embedded"], ENCODER: ["src_embedded"]}.get(model_kind, list(SOWN_EMBEDDINGS))


def model_inputs(batch: Mapping[str, Any], model_kind: str) -> tuple[np.ndarray, ...]:
    """The positional token arrays the model takes: (src, tgt_in) or (tgt_in,)."""
    return tuple(np.asarray(x) for x in kind_inputs(batch, model_kind))


# ----------------------------------------------------------------------------- Flax
def _flax_capture_filter():
    from flax_transformer.nn.attention import MultiHeadAttention
    from flax_transformer.nn.layers import FeedForward, LayerNorm
    from flax_transformer.nn.model import Decoder, Encoder

    kinds = (MultiHeadAttention, LayerNorm, FeedForward, Encoder, Decoder)

    def capture(module, method_name: str) -> bool:
        # The top-level module (path ()) gives the logits; sub-layers their own outputs.
        return method_name == "__call__" and (module.path == () or isinstance(module, kinds))

    return capture


def capture_flax(model, params, batch: Mapping[str, Any], model_kind: str) -> dict[str, np.ndarray]:
    """Run the Flax `model` deterministically and return {canonical name: ndarray}."""
    _, state = model.apply(
        params,
        *model_inputs(batch, model_kind),
        capture_intermediates=_flax_capture_filter(),
        mutable=["intermediates"],
    )
    captured: dict[str, np.ndarray] = {}

    def walk(node, path):
        for key, value in node.items():
            if isinstance(value, Mapping):
                walk(value, path + (key,))
                continue
            # value is the tuple of every call's output; each module here runs once.
            if key == "__call__":
                name = flax_path_to_name(path) if path else output_name(model_kind)
                captured[name] = np.asarray(value[0])
            elif key == "attention_weights":
                captured[flax_path_to_name(path) + ATTENTION_SUFFIX] = np.asarray(value[0])
            elif key in SOWN_EMBEDDINGS and not path:
                captured[key] = np.asarray(value[0])

    walk(state["intermediates"], ())
    return captured


# ----------------------------------------------------------------------------- torch
def capture_torch(
    torch_model, batch: Mapping[str, Any], model_kind: str
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Run the torch twin in eval mode with forward hooks; ({name: ndarray}, execution order).

    Attention weights are read from `MultiHeadAttention.last_weights` (None when the fused
    kernel is on: then they are simply absent). The embeddings are the outputs of
    `embed_dropout`, which the seq2seq model calls for the source first, then the target.
    """
    import torch
    from torch import nn

    import torch_reference
    from torch_reference.model import tensor_to_numpy

    kinds = (
        torch_reference.MultiHeadAttention,
        nn.LayerNorm,
        torch_reference.FeedForward,
        torch_reference.Encoder,
        torch_reference.Decoder,
    )
    embedding_names = embeddings_of(model_kind)
    captured: dict[str, np.ndarray] = {}
    order: list[str] = []

    def record(name: str, tensor) -> None:
        if name in captured:
            raise RuntimeError(f"torch module {name!r} ran twice; cannot name its outputs")
        captured[name] = tensor_to_numpy(tensor)
        order.append(name)

    def hook_for(name: str):
        def hook(module, _inputs, output):
            if name == "embed_dropout":
                if not embedding_names:
                    raise RuntimeError("embed_dropout ran more often than the model has inputs")
                record(embedding_names.pop(0), output)
                return
            weights = getattr(module, "last_weights", None)
            if isinstance(module, torch_reference.MultiHeadAttention) and weights is not None:
                record(name + ATTENTION_SUFFIX, weights)  # computed before the output
            record(name or output_name(model_kind), output)

        return hook

    handles = []
    for name, module in torch_model.named_modules():
        if name in ("", "embed_dropout") or isinstance(module, kinds):
            handles.append(module.register_forward_hook(hook_for(name)))
    torch_model.eval()
    try:
        inputs = [
            torch.from_numpy(np.asarray(x, dtype=np.int64)) for x in model_inputs(batch, model_kind)
        ]
        with torch.no_grad():
            torch_model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return captured, order
