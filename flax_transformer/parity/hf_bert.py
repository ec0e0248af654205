"""compare_modules for the BERT family: transformers' PyTorch BERT, RoBERTa (XLM-RoBERTa) and
DistilBERT models against this project's Flax encoder of the same checkpoint
(`flax_transformer.hf.load(path)`), without writing the module-name mapping by hand.

    report = compare_hf_encoder(torch_model, hf.load(path), ids, mask, token_types)
    report.ok, report.first_divergence, report.diagnosis.verdict, print(report.format_table())

or, to call compare_modules yourself (your own inputs, masks, tolerances):

    compare_modules(torch_model, (), model.module, model.variables, (ids,),
                    torch_kwargs=..., flax_kwargs=..., **encoder_parity_options("bert", "none"))

`bert_module_names` is BERT's mapping (bare `BertModel` and `BertFor*`: the names are the same
with or without the `bert.` prefix); `encoder_module_names(model_type, head)` gives the mapping
of any family member and Flax head (config.head). A torch module whose value the Flax side does
not have (BERT's attention context before its output dense, the activation of the masked LM's
transform) or has already paired with another torch module (BertSelfOutput = its LayerNorm) is
EXCLUDE: listed as "missing", never paired by shape. The position tables are compared as the
rows each token reads (the Flax module adds them to its input: its output minus its input);
transformers' default position ids are assumed (the same rows for every sequence in BERT and
DistilBERT, per row in RoBERTa).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from flax_transformer.parity.inputs import ParityInputError
from flax_transformer.parity.modules import compare_modules
from flax_transformer.parity.pairing import EXCLUDE
from flax_transformer.parity.report import ParityReport
from flax_transformer.parity.transforms import chain, minus_input, take
from flax_transformer.spec.config import ENCODER_HEADS

# model_type -> the prefix of the encoder's modules inside a model with a head
PREFIXES = {
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "distilbert": "distilbert",
}

# BERT / RoBERTa: a layer's modules (after `encoder.layer.N.`) -> the Flax path under
# `encoder/layers_N/`; EXCLUDE: no value of its own on the Flax side.
BERT_LAYER = {
    "attention.self.query": "self_attn/query",
    "attention.self.key": "self_attn/key",
    "attention.self.value": "self_attn/value",
    "attention.self": EXCLUDE,  # the context before the output dense: not a Flax value
    "attention.output.dense": "self_attn/out",
    "attention.output.dropout": "Dropout_0",
    "attention.output.LayerNorm": "norm1",
    "attention.output": EXCLUDE,  # = its LayerNorm
    "attention": EXCLUDE,  # = its output's LayerNorm
    "intermediate.dense": "ffn/linear1",
    "intermediate.intermediate_act_fn": "ffn/Dropout_0",  # Flax calls the activation as a function
    "intermediate": EXCLUDE,  # = its activation
    "output.dense": "ffn/linear2",
    "output.dropout": "Dropout_1",
    "output.LayerNorm": "norm2",
    "output": EXCLUDE,  # = its LayerNorm = the layer's output
}
DISTILBERT_LAYER = {
    "attention.q_lin": "self_attn/query",
    "attention.k_lin": "self_attn/key",
    "attention.v_lin": "self_attn/value",
    "attention.out_lin": "self_attn/out",
    "attention": "self_attn",
    "sa_layer_norm": "norm1",
    "ffn.lin1": "ffn/linear1",
    "ffn.activation": "ffn/Dropout_0",
    "ffn.lin2": "ffn/linear2",
    "ffn.dropout": "Dropout_1",
    "ffn": "ffn",  # lin2 then dropout; the Flax FeedForward ends at linear2 (the same value)
    "output_layer_norm": "norm2",
}
EMBEDDINGS = {
    "word_embeddings": "src_embed",
    "token_type_embeddings": "type_embed",
    "position_embeddings": "pos_embed",
    "LayerNorm": "src_embed_norm",
    "dropout": "embed_dropout",
}
POOLER = {"pooler.dense": "pooler/dense", "pooler.activation": "pooler", "pooler": EXCLUDE}
# config.head (spec.config.ENCODER_HEADS) -> {the head's torch modules, outside the encoder's
# prefix: the Flax path}
HEAD_MODULES = {
    "none": {},
    "sequence_pooled": {"dropout": "head/Dropout_0", "classifier": "head/classifier"},
    "token": {"dropout": "head/Dropout_0", "classifier": "head/classifier"},
    "sequence_tanh": {  # RoBERTa's classifier: dropout, dense, tanh, dropout, out_proj
        "classifier.dropout": "head/Dropout_0",
        "classifier.dense": "head/pre_classifier",
        "classifier.out_proj": "head/classifier",
        "classifier": "head",
    },
    "sequence_relu": {  # DistilBERT: pre_classifier, ReLU, dropout, classifier
        "pre_classifier": "head/pre_classifier",
        "dropout": "head/Dropout_0#1",  # Flax drops out before pre_classifier too (call 0)
        "classifier": "head/classifier",
    },
    "masked_lm": {
        "cls.predictions.transform.dense": "head/dense",
        "cls.predictions.transform.transform_act_fn": EXCLUDE,  # a function on the Flax side
        "cls.predictions.transform.LayerNorm": "head/norm",
        "cls.predictions.transform": EXCLUDE,  # = its LayerNorm
        "cls.predictions.decoder": "head",  # the tied decoder + bias: the head's output
        "cls.predictions": EXCLUDE,
        "cls": EXCLUDE,
        "lm_head.dense": "head/dense",
        "lm_head.layer_norm": "head/norm",
        "lm_head.decoder": "head",
        "lm_head": EXCLUDE,  # = its decoder
    },
}

ModuleNames = Callable[[str], "str | None | object"]  # a name -> a Flax path, None or EXCLUDE


def encoder_module_names(model_type: str, head: str = "none") -> ModuleNames:
    """The mapping (torch module name -> Flax path, None or EXCLUDE) for a transformers model
    of `model_type` ("bert", "roberta", "xlm-roberta", "distilbert") whose Flax twin has
    config.head `head` ("none" for BertModel, "sequence_pooled" for
    BertForSequenceClassification, ...; `hf.load(path).config.head`)."""
    if model_type not in PREFIXES:
        raise ParityInputError(
            f"model_type {model_type!r} is not of the BERT family (one of {sorted(PREFIXES)})"
        )
    if head not in ENCODER_HEADS:
        raise ParityInputError(f"head {head!r} is not one of {ENCODER_HEADS}")
    prefix = PREFIXES[model_type]
    distil = model_type == "distilbert"
    stack, layer_parts = ("transformer", DISTILBERT_LAYER) if distil else ("encoder", BERT_LAYER)
    fixed = {f"embeddings.{k}": v for k, v in EMBEDDINGS.items()}
    fixed[stack] = "encoder"
    if not distil:
        fixed.update(POOLER)
    layer = re.compile(rf"{stack}\.layer\.(\d+)(?:\.(.+))?")
    heads = HEAD_MODULES[head]

    def mapping(name: str):
        if name in heads:
            return heads[name]
        if name == prefix:  # the encoder inside a model with a head: its outputs repeat others
            return EXCLUDE
        inner = name.removeprefix(prefix + ".")
        if inner in fixed:
            return fixed[inner]
        match = layer.fullmatch(inner)
        if match is None:
            return None  # e.g. `embeddings`: the fallback pairs it (the sown src_embedded)
        index, rest = match.groups()
        if rest is None:
            return f"encoder/layers_{index}"
        target = layer_parts.get(rest)
        if target is None or target is EXCLUDE:
            return target
        return f"encoder/layers_{index}/{target}"

    return mapping


_BERT = {head: encoder_module_names("bert", head) for head in ("masked_lm", "sequence_pooled")}


def bert_module_names(name: str):
    """BERT's mapping, any of BertModel, BertForSequenceClassification,
    BertForTokenClassification, BertForMaskedLM: transformers' module name -> the Flax path of
    `hf.load(path).module` (None: left to the canonical rule and the fallback; EXCLUDE)."""
    for names in _BERT.values():  # BERT's head module names never collide
        target = names(name)
        if target is not None:
            return target
    return None


def encoder_transforms(model_type: str) -> tuple[dict, dict]:
    """(torch transforms, Flax transforms) for the position embeddings: the rows each token
    reads. BERT and DistilBERT read one row per position for the whole batch ((1, len, d) in
    transformers, compared as (len, d)); RoBERTa a row per token ((batch, len, d))."""
    if model_type in ("roberta", "xlm-roberta"):
        return {}, {"pos_embed": minus_input()}
    return (
        {r"(.+\.)?embeddings\.position_embeddings": take(0)},
        {"pos_embed": chain(minus_input(), take(0))},
    )


def encoder_parity_options(model_type: str, head: str = "none") -> dict:
    """compare_modules' `mapping`, `transforms` and `flax_transforms` for the pair (see
    encoder_module_names), to pass as keywords: compare_modules(..., **options)."""
    transforms, flax_transforms = encoder_transforms(model_type)
    return dict(
        mapping=encoder_module_names(model_type, head),
        transforms=transforms,
        flax_transforms=flax_transforms,
    )


def compare_hf_encoder(
    torch_model,
    hf_model,
    input_ids,
    attention_mask=None,
    token_type_ids=None,
    *,
    dtype: str = "float64",
    rtol: float | None = None,
) -> ParityReport:
    """compare_modules of transformers' `torch_model` (BertModel, BertFor..., RoBERTa,
    DistilBERT) against `hf_model` (what `flax_transformer.hf.load` returns, or anything with its
    `.module`, `.variables`, `.config` and `.hf_config`) on one batch: `input_ids` (batch, len),
    `attention_mask` (nonzero on real tokens; None: all real), `token_type_ids` (None: not
    passed, so 0 on both sides). Both sides run at `dtype` (float64: float64 copies of the
    weights). Padded tokens are left out of the comparison (the masked entries of every
    (batch, len, ...) tensor). To find a bug in your own Flax variables or config, pass
    `dataclasses.replace(hf_model, variables=...)` (or `module=`)."""
    model_type = hf_model.hf_config.get("model_type")
    torch_type = getattr(getattr(torch_model, "config", None), "model_type", None)
    if torch_type != model_type:
        raise ParityInputError(
            f"the torch model is a {torch_type!r} model, the Flax one {model_type!r}: compare a "
            "checkpoint with the model it was loaded from"
        )
    ids = token_array("input_ids", input_ids)
    mask = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask) != 0
    if mask.shape != ids.shape:
        raise ParityInputError(f"attention_mask has shape {mask.shape}, input_ids {ids.shape}")
    import torch

    torch_kwargs = dict(
        input_ids=torch.from_numpy(ids.astype(np.int64)),
        attention_mask=torch.from_numpy(mask.astype(np.int64)),
    )
    flax_kwargs = {"src_mask": mask[:, None, None, :]}
    if token_type_ids is not None:
        types = token_array("token_type_ids", token_type_ids)
        if types.shape != ids.shape:
            raise ParityInputError(f"token_type_ids has shape {types.shape}, input_ids {ids.shape}")
        torch_kwargs["token_type_ids"] = torch.from_numpy(types.astype(np.int64))
        flax_kwargs["token_types"] = types
    return compare_modules(
        torch_model,
        (),
        hf_model.module,
        hf_model.variables,
        (ids,),
        torch_kwargs=torch_kwargs,
        flax_kwargs=flax_kwargs,
        dtype=dtype,
        rtol=rtol,
        mask=real_tokens(mask),
        **encoder_parity_options(model_type, hf_model.config.head),
    )


def real_tokens(mask: np.ndarray):
    """The mask callable: a tensor of 3 or more axes led by (batch, len) keeps its real tokens'
    entries; others (a pooled row, a sequence head's logits, a position table) are compared
    whole, even when a width happens to equal len."""

    def valid(_name: str, shape: tuple):
        if len(shape) >= 3 and tuple(shape[:2]) == mask.shape:
            return mask.reshape(mask.shape + (1,) * (len(shape) - 2))
        return None

    return valid


def token_array(name: str, ids) -> np.ndarray:
    """`ids` as (batch, len) int32; ParityInputError naming `name` for anything else."""
    array = np.asarray(ids)
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.integer):
        raise ParityInputError(f"{name} must be (batch, len) integer token ids, got {array.shape}")
    return array.astype(np.int32)
