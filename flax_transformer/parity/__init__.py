"""Parity: where do two implementations of the same model start to differ?

- `capture`: every intermediate of one forward pass, on each side, by canonical name.
- `report`: per-tensor errors in execution order, the first divergence, table and JSON.
- `compare`: the API (`compare_models`, `compare_weights`); `inputs`: token batches;
- `modules`: `compare_modules` / `assert_parity` for any torch module against any Flax port,
  with `module_capture`, `pairing`, `transforms` and `diagnosis` (the weight verdict);
  `hf_bert`: the BERT family's mapping for it (transformers' BERT, RoBERTa, DistilBERT against
  `hf.load`'s Flax encoder) and `compare_hf_encoder`; `hf_decoder`: the Llama lineage's
  (Llama, Mistral, Qwen2, Qwen3 against `hf.load`'s Flax decoder) and `compare_hf_decoder`;
  `cli`: `python -m flax_transformer.parity A B`.
"""

from flax_transformer.lazy import lazy_exports

_EXPORTS = {
    "compare_models": "flax_transformer.parity.compare",
    "compare_modules": "flax_transformer.parity.modules",
    "assert_parity": "flax_transformer.parity.modules",
    "Diagnosis": "flax_transformer.parity.diagnosis",
    "EXCLUDE": "flax_transformer.parity.pairing",
    "compare_weights": "flax_transformer.parity.compare",
    "compare_hf_encoder": "flax_transformer.parity.hf_bert",
    "bert_module_names": "flax_transformer.parity.hf_bert",
    "encoder_module_names": "flax_transformer.parity.hf_bert",
    "encoder_parity_options": "flax_transformer.parity.hf_bert",
    "compare_hf_decoder": "flax_transformer.parity.hf_decoder",
    "decoder_module_names": "flax_transformer.parity.hf_decoder",
    "ParityInputError": "flax_transformer.parity.inputs",
    "make_batch": "flax_transformer.parity.inputs",
    "batch_from_texts": "flax_transformer.parity.inputs",
    "check_batch": "flax_transformer.parity.inputs",
    "ParityReport": "flax_transformer.parity.report",
    "TensorComparison": "flax_transformer.parity.report",
    "DEFAULT_TOLERANCES": "flax_transformer.parity.report",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
