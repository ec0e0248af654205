"""The training command's corpus files (--train-tsv, --train-jsonl, --lm-text) as a data input
(data/corpus_input.py): which files and formats the flags name, and the input that reads them.
The built-in tasks stay in memory (data/pipeline.task_pairs); a classifier's labelled TSV is a
ClassifyInput (data/classify_input.py), its run files read by runs/train_classify.py.
"""

from __future__ import annotations

from flax_transformer.data import corpus
from flax_transformer.data.classify_input import ClassifyInput
from flax_transformer.data.corpus_input import ChatInput, CorpusInput
from flax_transformer.data.pipeline import CLASSIFY
from flax_transformer.runs.run_dir import TOKENIZER


def corpus_source(spec):
    """(format, training file, validation format, validation file or None) of the flags, or
    None for a built-in task."""
    valid = ("jsonl", spec.valid_jsonl) if spec.valid_jsonl else ("tsv", spec.valid_tsv)
    if spec.train_tsv:
        return "tsv", spec.train_tsv, *valid  # (either validation format: check_spec)
    if spec.train_jsonl:
        return "jsonl", spec.train_jsonl, *valid
    if spec.lm_text:
        return "text", spec.lm_text, "text", spec.lm_valid
    return None


def corpus_input(spec, source, kind: str, classifier: dict | None = None):
    """The input of a corpus source whose data is `kind` (runs/checks.data_kind): a
    ClassifyInput for --task classify (`classifier`: the values of its run files,
    runs/train_classify.py), a ChatInput for a --train-jsonl of {"messages"} records (CHAT),
    else a CorpusInput of that model kind (a new BPE tokenizer trains on its sample unless the
    tokenizer is --init-from's)."""
    if spec.task == CLASSIFY:
        return ClassifyInput(spec.train_tsv, spec.valid_tsv, spec.seed, **classifier)
    if kind == corpus.CHAT:
        return ChatInput(spec.train_jsonl, spec.valid_jsonl, spec.seed)
    bpe = spec.tokenizer == "bpe" and not spec.init_from
    return CorpusInput(source, kind, spec.seed, bpe, TOKENIZER)
