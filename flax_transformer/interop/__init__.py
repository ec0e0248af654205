"""Weights across frameworks: the project's torch twin, torch.nn.Transformer (and, later, more).

- `convert`: Flax params <-> torch state_dict by the canonical rule; safetensors files; the
  `python -m flax_transformer.convert` CLI.
- `nn_transformer` / `nn_transformer_weights`: torch.nn.Transformer's call, masks and weights in
  Flax; `python -m flax_transformer.interop` checks the port against torch.
"""

from flax_transformer.lazy import lazy_exports

_EXPORTS = {
    "ConversionError": "flax_transformer.spec.tree_check",
    "NNTransformer": "flax_transformer.interop.nn_transformer",
    "NNTransformerDecoder": "flax_transformer.interop.nn_transformer",
    "NNTransformerEncoder": "flax_transformer.interop.nn_transformer",
    "generate_square_subsequent_mask": "flax_transformer.interop.nn_transformer",
    "torch_attention_mask": "flax_transformer.interop.nn_transformer",
    "from_torch": "flax_transformer.interop.nn_transformer_weights",
    "load_nn_transformer_state": "flax_transformer.interop.nn_transformer_weights",
    "to_nn_transformer_state": "flax_transformer.interop.nn_transformer_weights",
    "nn_key": "flax_transformer.interop.nn_transformer_weights",
    "nn_state_layout": "flax_transformer.interop.nn_transformer_weights",
    "torch_state_to_flax": "flax_transformer.interop.convert",
    "flax_to_torch_state": "flax_transformer.interop.convert",
    "load_flax_params": "flax_transformer.interop.convert",
    "load_torch_state": "flax_transformer.interop.convert",
    "save_flax_params": "flax_transformer.interop.convert",
    "save_torch_state": "flax_transformer.interop.convert",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
