"""A classifier's labelled text (`--task classify`): the `text<TAB>label` files, the label set,
the Hugging Face config of the classifier an encoder run becomes, and the texts encoded as the
classifier reads them. (The scores are training/classification.py's.)

A file holds one `text<TAB>label` per line; labels are names. Their classes are numbered in
the order of the --init-from run's `id2label` when it names every label of the file (its
classifier is then kept as it is), else in sorted order with a new classifier layer. The
names are saved in the run (labels.json) and, on `hf export`, as config.json's id2label.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from flax_transformer.data.pipeline import (
    DataError,
    LabelledDataset,
    Pair,
    no_pair_fits,
    read_tsv,
    sources_of,
    warn_long_pairs,
)

SEQUENCE_SUFFIX = "ForSequenceClassification"
# The head parameters a classifier with new labels starts afresh (the pooler and a
# pre-classifier layer are kept: they are the pretrained model's, like the encoder).
CLASSIFIER_PARAMS = ("head/classifier",)


# ----------------------------------------------------------------------------- files
def read_labelled_tsv(path: str | Path) -> list[Pair]:
    """One `text<TAB>label` per line (blank lines skipped) as Pairs (source: the text, target:
    the label, stripped); a DataError naming the file and line for anything else."""
    pairs = read_tsv(path, names=("text", "label"))
    return [dataclasses.replace(pair, target=pair.target.strip()) for pair in pairs]


def check_two_labels(pairs: list[Pair], path: str | Path) -> None:
    """A training file names at least two labels, or a DataError naming it: a one-label
    "classifier" would answer that label with probability 1 whatever the text, and exported,
    transformers reads num_labels=1 as a regression head."""
    labels = {pair.target for pair in pairs}
    if len(labels) < 2:
        found = f"only the label {next(iter(labels))!r}" if labels else "no labels"
        raise DataError(
            f"{path}: a classifier needs at least 2 labels in its training file; found {found}"
        )


# ----------------------------------------------------------------------------- the labels
@dataclasses.dataclass(frozen=True)
class LabelChoice:
    """The classes of a classifier run: `names` (class 0 first) and whether the init run's
    classifier layer is kept (`kept`: its id2label names every label, in this order)."""

    names: tuple[str, ...]
    kept: bool

    @property
    def fresh_params(self) -> tuple[str, ...]:
        """Parameter paths the run initialises afresh instead of taking from --init-from."""
        return () if self.kept else CLASSIFIER_PARAMS


def choose_labels(labels: Iterable[str], init_id2label: Mapping | None) -> LabelChoice:
    """The label set of a run whose training file has `labels`, started from a model whose
    config.json says `init_id2label` ({class: name}; None for a model without a classifier)."""
    names = sorted(set(labels))
    if init_id2label:
        order = [str(init_id2label[k]) for k in sorted(init_id2label, key=int)]
        if set(names) <= set(order) and len(set(order)) == len(order):
            return LabelChoice(tuple(order), kept=True)
    return LabelChoice(tuple(names), kept=False)


def check_labels(pairs: list[Pair], names: tuple[str, ...], what: str) -> None:
    """Every label of `pairs` is one of `names`, or a DataError naming the first unknown one and
    its file and line (a validation file, or a --resume with a changed file)."""
    known = set(names)
    for pair in pairs:
        if pair.target not in known:
            raise DataError(
                f"{pair.where}: label {pair.target!r} is not one of the {what} labels "
                f"({', '.join(names)})"
            )


def classifier_architecture(architectures, model_type: str, known: Iterable[str]) -> str:
    """The `*ForSequenceClassification` class of a model whose config.json lists
    `architectures` (BertModel -> BertForSequenceClassification; already one: itself), among
    the `known` classes of its family; a ValueError when the family has none."""
    known = tuple(known)
    candidates = [name for name in known if name.endswith(SEQUENCE_SUFFIX)]
    first = architectures[0] if architectures else None
    if first is not None:
        base = first.split("For")[0] if "For" in first else first.removesuffix("Model")
        wanted = [base + SEQUENCE_SUFFIX]
    else:  # no architectures: the family's classifier named like its model type
        plain = model_type.replace("-", "").lower()
        wanted = [c for c in candidates if c[: -len(SEQUENCE_SUFFIX)].lower() == plain]
    for name in wanted:
        if name in candidates:
            return name
    raise ValueError(
        f"a {first or model_type} model has no sequence-classification head in this project "
        f"(supported: {', '.join(candidates) or 'none for this family'})"
    )


def classifier_hf_config(hf_config: dict, names: tuple[str, ...], known: Iterable[str]) -> dict:
    """The Hugging Face config of the classifier fine-tuned from a model of `hf_config`:
    architectures [its *ForSequenceClassification], id2label / label2id of `names`."""
    model_type = str(hf_config.get("model_type", ""))
    architecture = classifier_architecture(hf_config.get("architectures"), model_type, known)
    config = {k: v for k, v in hf_config.items() if k != "num_labels"}  # id2label says it
    config["architectures"] = [architecture]
    config["id2label"] = {str(i): name for i, name in enumerate(names)}
    config["label2id"] = {name: i for i, name in enumerate(names)}
    return config


# ----------------------------------------------------------------------------- encoding
def encode_labelled(
    pairs: list[Pair], names: tuple[str, ...], tokenizer, max_len: int, on_long: str = "skip"
) -> LabelledDataset:
    """Labelled texts as the classifier reads them: the tokenizer's ids with its special tokens
    (`encode_input`: [CLS] text [SEP] for BERT), the class number of each label. A text longer
    than max_len is skipped, truncated (its last special token kept) or an error."""
    number = {name: i for i, name in enumerate(names)}
    src, labels, kept, long = [], [], [], []
    for pair in pairs:
        ids = tokenizer.encode_input(pair.source)
        if len(ids) > max_len:
            long.append(pair.where)
            if on_long == "error":
                raise DataError(
                    f"{pair.where}: the text is {len(ids)} tokens (with special tokens), longer "
                    f"than max_len {max_len}; pass --on-long skip|truncate"
                )
            if on_long == "skip":
                continue
            ids = ids[: max_len - 1] + ids[-1:]
        src.append(np.array(ids, np.int32))
        labels.append(number[pair.target])
        kept.append(pair)
    if long:
        warn_long_pairs(len(long), long, max_len, on_long, stacklevel=3)
    if not kept:
        raise no_pair_fits(sources_of(pairs), len(pairs), max_len)
    return LabelledDataset(src, np.array(labels, np.int32), kept)
