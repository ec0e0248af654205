"""Hugging Face checkpoints (Marian, BART, mBART, GPT-2, T5 / mT5 / UMT5 and their bare
encoders) in JAX: load, run, generate, save.

    from flax_transformer import hf

    model = hf.load("opus-mt-dir")                 # a directory written by save_pretrained
    logits = model.forward(input_ids, attention_mask, decoder_input_ids)   # numpy in and out
    tokens = model.generate(input_ids, attention_mask, num_beams=4)        # transformers' layout
    hf.save(model, "out-dir")              # from_pretrained reads it back

`load(path, dtype="float32") -> HFModel` reads config.json, the weights (model.safetensors, a
sharded model.safetensors.index.json, or pytorch_model.bin with torch.load(weights_only=True)),
generation_config.json and the tokenizer files with numpy; the weights are checked strictly and
read one tensor at a time (dtype="bfloat16" keeps a bfloat16 file's bits).
`save(model, path, max_shard_size="50GB")` writes them back, in shards as save_pretrained does
when they pass max_shard_size. `HFModel` holds `.module`
(the linen Transformer / TransformerLM / TransformerEncoder), `.variables`, `.config` (the
TransformerConfig),
`.hf_config`, `.generation_config`, `.tokenizer` (transformers' AutoTokenizer, loaded lazily,
None without tokenizer files or without transformers) and `.kind` ("seq2seq" | "lm" |
"encoder"); `.encoder_fn()` gives the encoder as a jittable JAX function.
`HFModel.generate(input_ids, attention_mask=None, **kwargs)` calls
`flax_transformer.hf.generation.generate(model, input_ids, attention_mask=..., **kwargs)`,
imported on first use.

CLI: `python -m flax_transformer.hf import HF_DIR RUN_DIR` (a train.py run directory that
`generate` decodes with and `train.py --init-from` fine-tunes) and `... export RUN_DIR HF_DIR`.
The weight and config mapping lives in hf/config.py, hf/weights.py and hf/checkpoint.py;
docs/hf.md has the details.
"""

from flax_transformer.lazy import lazy_exports

_EXPORTS = {
    "HFModel": "flax_transformer.hf.model",
    "load": "flax_transformer.hf.model",
    "save": "flax_transformer.hf.model",
    "UnsupportedConfigError": "flax_transformer.hf.config",
    "ConversionError": "flax_transformer.spec.tree_check",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
