"""Named model sizes, so benchmarks, the demo, train.py and tests do not each keep a copy.

    preset("tiny", src_vocab_size=40)      # a preset with any field overridden

- `tiny`: unit tests and smoke runs (d_model 32, 4 heads, 1+1 layers, d_ff 48); vocabularies
  differ from each other and from d_model/d_ff so a wrong transpose is a shape error.
- `small`: train.py's default model (d_model 64, 4 heads, 2+2 layers, d_ff 256): it learns the
  default task in about a minute on 2 CPU cores.
- `reference`: the benchmark's reference config (d_model 256, 4 heads, 3+3 layers, d_ff 1024,
  vocab 1000, dropout 0.1).
- `paper_base`: the paper's base model (d_model 512, 8 heads, 6+6 layers, d_ff 2048, dropout 0.1).
"""

from __future__ import annotations

from typing import Any

from flax_transformer.spec.config import TransformerConfig

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        src_vocab_size=40, tgt_vocab_size=44, d_model=32, num_heads=4,
        num_encoder_layers=1, num_decoder_layers=1, d_ff=48, max_len=16, dropout_rate=0.0,
    ),
    "small": dict(
        src_vocab_size=259, tgt_vocab_size=259, d_model=64, num_heads=4,
        num_encoder_layers=2, num_decoder_layers=2, d_ff=256, max_len=64, dropout_rate=0.0,
    ),
    "reference": dict(
        src_vocab_size=1000, tgt_vocab_size=1000, d_model=256, num_heads=4,
        num_encoder_layers=3, num_decoder_layers=3, d_ff=1024, max_len=128, dropout_rate=0.1,
    ),
    "paper_base": dict(
        src_vocab_size=32000, tgt_vocab_size=32000, d_model=512, num_heads=8,
        num_encoder_layers=6, num_decoder_layers=6, d_ff=2048, max_len=512, dropout_rate=0.1,
    ),
}  # fmt: skip


def preset(name: str, **overrides: Any) -> TransformerConfig:
    """The named preset's TransformerConfig, with `overrides` replacing any of its fields."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return TransformerConfig(**{**PRESETS[name], **overrides})
