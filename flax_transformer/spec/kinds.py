"""The model kinds, by name (numpy only; the linen classes are registered in nn/kinds.py)."""

from __future__ import annotations

# encoder: a bare encoder (a T5 encoder as a text encoder): tokens -> last hidden states.
SEQ2SEQ, LM, ENCODER = "seq2seq", "lm", "encoder"
MODEL_KINDS = (SEQ2SEQ, LM, ENCODER)
# The encoder-decoder kind was called "transformer" before 0.2; files and run.json written then
# still say so, and code may still pass it: read as "seq2seq".
OLD_NAMES = {"transformer": SEQ2SEQ}


def current_name(kind: str) -> str:
    """The kind's current name for an old one (e.g. a `--model transformer` flag); else as given."""
    return OLD_NAMES.get(kind, kind)


def check_kind(kind: str) -> str:
    """`kind` as one of MODEL_KINDS (an old name is translated), or a ValueError naming them."""
    kind = current_name(kind)
    if kind not in MODEL_KINDS:
        raise ValueError(f"model kind must be one of {MODEL_KINDS}, got {kind!r}")
    return kind


def infer_model_kind(keys) -> str:
    """A state with an encoder or a source embedding is seq2seq, or a bare encoder when it has
    no decoder; otherwise decoder-only."""
    source = decoder = False
    for key in keys:
        key = key if isinstance(key, str) else ".".join(key)
        source = source or key.startswith(("encoder", "src_embed", "shared_embed"))
        decoder = decoder or key.startswith(("decoder", "tgt_embed"))
    if source:
        return SEQ2SEQ if decoder else ENCODER
    return LM


# The token arrays each kind takes, in call order: batch keys and positional model arguments.
INPUT_NAMES = {SEQ2SEQ: ("src", "tgt_in"), LM: ("tgt_in",), ENCODER: ("src",)}


def model_inputs(batch, kind: str) -> tuple:
    """The positional token arrays a model of `kind` takes from a batch dict."""
    return tuple(batch[name] for name in INPUT_NAMES[check_kind(kind)])


def kind_of_batch(batch) -> str:
    """A batch with a source is seq2seq; one with only target tokens is an LM batch."""
    return SEQ2SEQ if "src" in batch else LM


# Each kind's class name, the same in both twins (flax_transformer.nn.model, torch_reference).
CLASS_NAMES = {SEQ2SEQ: "Transformer", LM: "TransformerLM", ENCODER: "TransformerEncoder"}
