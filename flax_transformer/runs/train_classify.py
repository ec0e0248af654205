"""The training command's `--task classify` input: --train-tsv (and --valid-tsv) as
`text<TAB>label` lines for a sequence classifier fine-tuned from an --init-from encoder run
(an `ftx hf import` of a BERT, RoBERTa, XLM-RoBERTa or DistilBERT model).

`ClassifyInput` answers what runs/train.py asks of a corpus input (kind, read, datasets,
install, discard) and adds what a classifier needs: the label set (training/classification.py),
the config's head fields, and the run files that carry the labels (labels.json, and
hf_config.json with id2label, which `hf export` writes into config.json). The files are read
into memory: classification sets are small next to translation corpora.
"""

from __future__ import annotations

from pathlib import Path

from flax_transformer.data.corpus import held_out_indices
from flax_transformer.data.pipeline import warn_if_validation_is_training
from flax_transformer.runs import run_dir
from flax_transformer.runs.spec import UsageError
from flax_transformer.spec.kinds import ENCODER
from flax_transformer.training import classification


class ClassifyInput:
    """One classifier run's labelled files, label set and Hugging Face config."""

    kind = ENCODER

    def __init__(self, spec, workdir: Path):
        self.spec, self.workdir = spec, Path(workdir)
        self.train_pairs: list = []
        self.valid_pairs: list | None = None
        self.labels: classification.LabelChoice | None = None
        self.hf_config: dict | None = None
        self.head_fields: dict | None = None  # the classifier's TransformerConfig head fields

    def read(self, scan: bool) -> None:
        """Read the labelled files (into memory; read, like every input, here and not when the
        input is made), hold out a validation slice (without --valid-tsv), settle the label
        set: the run's own on --resume, else from the training labels and the --init-from
        model's."""
        spec = self.spec
        self.train_pairs = classification.read_labelled_tsv(spec.train_tsv)
        classification.check_two_labels(self.train_pairs, spec.train_tsv)
        if spec.valid_tsv:
            self.valid_pairs = classification.read_labelled_tsv(spec.valid_tsv)
        if self.valid_pairs is None:
            if len(self.train_pairs) < 2:
                raise UsageError(
                    "need at least 2 training examples to hold some out for validation; "
                    "pass --valid-tsv"
                )
            held = set(held_out_indices(len(self.train_pairs), self.spec.seed).tolist())
            pairs = self.train_pairs
            self.valid_pairs = [p for i, p in enumerate(pairs) if i in held]
            self.train_pairs = [p for i, p in enumerate(pairs) if i not in held]
            print(f"held out {len(self.valid_pairs)} of {len(pairs)} examples for validation")
        else:
            warn_if_validation_is_training(self.train_pairs, self.valid_pairs)
        if self.spec.resume:
            names = run_dir.read_labels(self.workdir)
            if names is None:
                raise UsageError(f"--resume --task classify: {self.workdir} has no labels.json")
            self.labels = classification.LabelChoice(names, kept=True)
            self.hf_config = self._read_hf_config(self.workdir)
            what = "run's"
        else:
            init = Path(self.spec.init_from)
            init_hf = self._read_hf_config(init)
            id2label = init_hf.get("id2label") if self._has_classifier(init) else None
            labels = (p.target for p in self.train_pairs)
            self.labels = classification.choose_labels(labels, id2label)
            from flax_transformer.hf.config import ARCHITECTURES

            known = ARCHITECTURES.get(init_hf.get("model_type"), ())
            try:
                self.hf_config = classification.classifier_hf_config(
                    init_hf, self.labels.names, known
                )
            except ValueError as err:
                raise UsageError(f"--init-from {init}: {err}") from None
            kept = "kept" if self.labels.kept else "new"
            print(
                f"{len(self.labels.names)} labels ({', '.join(self.labels.names)}); the "
                f"classifier layer is {kept}"
            )
            what = "training file's"
        classification.check_labels(self.valid_pairs, self.labels.names, what)
        classification.check_labels(self.train_pairs, self.labels.names, what)
        self.head_fields = self._head_fields(self.hf_config)

    @staticmethod
    def _read_hf_config(directory: Path) -> dict:
        """A run's hf_config.json: a classifier is exported to Hugging Face, so its encoder
        must come from there."""
        from flax_transformer.hf.checkpoint import read_json

        path = directory / run_dir.HF_CONFIG
        if not path.exists():
            raise UsageError(
                f"--task classify: {directory} has no {run_dir.HF_CONFIG}; start from an "
                "`ftx hf import` of a BERT, RoBERTa, XLM-RoBERTa or DistilBERT model"
            )
        return read_json(path, "Hugging Face config")

    @staticmethod
    def _has_classifier(init: Path) -> bool:
        """The --init-from run's model ends in a sequence classifier (its id2label counts)."""
        return run_dir.read_config(init).head.startswith("sequence")

    @staticmethod
    def _head_fields(hf_config: dict) -> dict:
        """The TransformerConfig head fields of the classifier `hf_config` describes (the rest
        of the model's config is the init run's)."""
        from flax_transformer.hf.config import hf_to_config
        from flax_transformer.runs.load import HEAD_FIELDS

        config, _ = hf_to_config(hf_config, where=str(run_dir.HF_CONFIG))
        return {field: getattr(config, field) for field in HEAD_FIELDS}

    def bpe_texts(self):
        """No BPE is trained: the tokenizer is the --init-from run's."""
        return iter(())

    def datasets(self, tokenizer, max_len: int, on_long: str, workdir: Path, primary: bool):
        """(training set, validation set): the texts encoded with the tokenizer's special
        tokens, their labels numbered."""
        if not hasattr(tokenizer, "encode_input"):
            raise UsageError(
                f"--task classify needs a Hugging Face tokenizer; the run's is {tokenizer.kind}"
            )
        names = self.labels.names
        encode = classification.encode_labelled
        return (
            encode(self.train_pairs, names, tokenizer, max_len, on_long),
            encode(self.valid_pairs, names, tokenizer, max_len, on_long),
        )

    def install(self, workdir: Path, train_set) -> None:
        """Nothing to move: the sets are in memory."""

    def discard(self) -> None:
        """Nothing was staged."""
