"""The Hugging Face families this project reads and writes: one module per family, each one
`Family` (family.py). Adding a family is adding its module and one line to FAMILIES; the
loader, saver, exporter, tokenizer and generation read the registry and never branch on a
model_type themselves (docs/hf.md, "Adding a family").

    family_for("marian").kind            # "seq2seq"
    family_for(hf_config["model_type"])  # UnsupportedConfigError naming the supported types
"""

from __future__ import annotations

from flax_transformer.hf.families.bart import BART
from flax_transformer.hf.families.bert import BERT
from flax_transformer.hf.families.distilbert import DISTILBERT
from flax_transformer.hf.families.family import Family, FusedQKV, UnsupportedConfigError
from flax_transformer.hf.families.gemma import GEMMA
from flax_transformer.hf.families.gemma2 import GEMMA2
from flax_transformer.hf.families.gemma3_text import GEMMA3_TEXT
from flax_transformer.hf.families.gpt2 import GPT2
from flax_transformer.hf.families.llama import LLAMA
from flax_transformer.hf.families.marian import MARIAN
from flax_transformer.hf.families.mbart import MBART
from flax_transformer.hf.families.mistral import MISTRAL
from flax_transformer.hf.families.phi3 import PHI3
from flax_transformer.hf.families.qwen2 import QWEN2
from flax_transformer.hf.families.qwen3 import QWEN3
from flax_transformer.hf.families.roberta import ROBERTA
from flax_transformer.hf.families.t5 import T5

FAMILIES: tuple[Family, ...] = (
    *(MARIAN, BART, MBART, GPT2, T5, BERT, ROBERTA, DISTILBERT),
    *(LLAMA, MISTRAL, QWEN2, QWEN3, GEMMA, GEMMA2, GEMMA3_TEXT, PHI3),
)
_BY_MODEL_TYPE = {t: family for family in FAMILIES for t in family.model_types}
MODEL_TYPES: tuple[str, ...] = tuple(_BY_MODEL_TYPE)
if len(MODEL_TYPES) != sum(len(f.model_types) for f in FAMILIES):
    raise RuntimeError("a model_type belongs to two families")


def family_for(model_type, where: str = "config.json") -> Family:
    """The Family reading config.json's `model_type`; UnsupportedConfigError (naming `where`
    and the supported types) for any other."""
    family = _BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise UnsupportedConfigError(
            f"{where}: model_type {model_type!r} is not supported (supported: "
            f"{', '.join(MODEL_TYPES)})"
        )
    return family


__all__ = [
    "FAMILIES",
    "MODEL_TYPES",
    "Family",
    "FusedQKV",
    "UnsupportedConfigError",
    "family_for",
]
