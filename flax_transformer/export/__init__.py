"""Deploying a trained run: serialized StableHLO (jax.export), ONNX graphs, int8 weights.

- `stablehlo`: forward.stablehlo and greedy.stablehlo with symbolic batch and lengths;
- `onnx_graphs`: model / encoder / decoder graphs of the PyTorch twin (torch.onnx.export), and
  `greedy_onnx`, greedy decoding with them in onnxruntime;
- `int8`: weight-only int8 params for Flax (`quantize_variables`, `int8_model`);
- `torch_int8`: the twin with dynamic int8 Linear layers (quantize_dynamic), as TorchScript;
- `output`: the staged output directory and manifest.json; `cli`: the command.

The names below load lazily: importing this package loads neither JAX nor torch.
"""

from flax_transformer.lazy import lazy_exports

_INT8 = "flax_transformer.export.int8"
_EXPORTS = {
    "Int8Matrix": _INT8,
    "int8_model": _INT8,
    "quantize_params": _INT8,
    "quantize_variables": _INT8,
    "tree_nbytes": _INT8,
    "export_stablehlo": "flax_transformer.export.stablehlo",
    "export_onnx": "flax_transformer.export.onnx_graphs",
    "greedy_onnx": "flax_transformer.export.onnx_graphs",
    "export_torch_int8": "flax_transformer.export.torch_int8",
    "greedy_torch": "flax_transformer.export.torch_int8",
    "load_torch_int8": "flax_transformer.export.torch_int8",
    "ExportError": "flax_transformer.export.output",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
