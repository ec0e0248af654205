"""The training command's `--task classify` input: --train-tsv (and --valid-tsv) as
`text<TAB>label` lines for a sequence classifier fine-tuned from an --init-from encoder run
(an `ftx hf import` of a BERT, RoBERTa, XLM-RoBERTa or DistilBERT model).

`ClassifyInput` answers what runs/train.py asks of a corpus input (kind, read, datasets,
install, discard) and adds what a classifier needs: the label set (labelled.py), the config's
head fields, and the Hugging Face config that carries the labels (hf_config.json with
id2label, which `hf export` writes into config.json). It takes plain paths and the values of
the run files its labels come from (runs/train_classify.py reads them with the run
directories; runs/train_data.py makes the input); the labelled files are read in `read`, into
memory: classification sets are small next to translation corpora.
"""

from __future__ import annotations

from pathlib import Path

from flax_transformer.data.corpus import held_out_indices
from flax_transformer.data.labelled import (
    LabelChoice,
    check_labels,
    check_two_labels,
    choose_labels,
    classifier_hf_config,
    encode_labelled,
    read_labelled_tsv,
)
from flax_transformer.data.pipeline import DataError, warn_if_validation_is_training
from flax_transformer.spec.config import HEAD_FIELDS
from flax_transformer.spec.kinds import ENCODER


class ClassifyInput:
    """One classifier run's labelled files, label set and Hugging Face config."""

    kind = ENCODER

    def __init__(
        self,
        train_path,
        valid_path,
        seed: int,
        *,
        hf_config: dict,
        run_labels: tuple[str, ...] | None = None,
        init_id2label: dict | None = None,
        init_from: str | Path | None = None,
    ):
        """`hf_config`: the run's own hf_config.json on --resume, whose labels are
        `run_labels` (labels.json); else the --init-from run's (`init_from`), whose classifier's
        `init_id2label` (None: it has none) may keep its label order."""
        self.train_path, self.valid_path, self.seed = train_path, valid_path, seed
        self.hf_config, self.run_labels = hf_config, run_labels
        self.init_id2label, self.init_from = init_id2label, init_from
        self.train_pairs: list = []
        self.valid_pairs: list | None = None
        self.labels: LabelChoice | None = None
        self.head_fields: dict | None = None  # the classifier's TransformerConfig head fields

    def read(self, scan: bool) -> None:
        """Read the labelled files (into memory; read, like every input, here and not when the
        input is made), hold out a validation slice (without --valid-tsv), settle the label
        set: the run's own on --resume, else from the training labels and the --init-from
        model's."""
        self.train_pairs = read_labelled_tsv(self.train_path)
        check_two_labels(self.train_pairs, self.train_path)
        if self.valid_path:
            self.valid_pairs = read_labelled_tsv(self.valid_path)
        if self.valid_pairs is None:
            if len(self.train_pairs) < 2:
                raise DataError(
                    "need at least 2 training examples to hold some out for validation; "
                    "pass --valid-tsv"
                )
            held = set(held_out_indices(len(self.train_pairs), self.seed).tolist())
            pairs = self.train_pairs
            self.valid_pairs = [p for i, p in enumerate(pairs) if i in held]
            self.train_pairs = [p for i, p in enumerate(pairs) if i not in held]
            print(f"held out {len(self.valid_pairs)} of {len(pairs)} examples for validation")
        else:
            warn_if_validation_is_training(self.train_pairs, self.valid_pairs)
        if self.run_labels is not None:  # --resume: the run's own
            self.labels = LabelChoice(self.run_labels, kept=True)
            what = "run's"
        else:
            labels = (p.target for p in self.train_pairs)
            self.labels = choose_labels(labels, self.init_id2label)
            from flax_transformer.hf.config import ARCHITECTURES

            known = ARCHITECTURES.get(self.hf_config.get("model_type"), ())
            try:
                self.hf_config = classifier_hf_config(self.hf_config, self.labels.names, known)
            except ValueError as err:
                raise DataError(f"--init-from {self.init_from}: {err}") from None
            kept = "kept" if self.labels.kept else "new"
            print(
                f"{len(self.labels.names)} labels ({', '.join(self.labels.names)}); the "
                f"classifier layer is {kept}"
            )
            what = "training file's"
        check_labels(self.valid_pairs, self.labels.names, what)
        check_labels(self.train_pairs, self.labels.names, what)
        self.head_fields = self._head_fields(self.hf_config)

    @staticmethod
    def _head_fields(hf_config: dict) -> dict:
        """The TransformerConfig head fields of the classifier `hf_config` describes (the rest
        of the model's config is the init run's)."""
        from flax_transformer.hf.config import hf_to_config

        config, _ = hf_to_config(hf_config, where="hf_config.json")
        return {field: getattr(config, field) for field in HEAD_FIELDS}

    def bpe_texts(self):
        """No BPE is trained: the tokenizer is the --init-from run's."""
        return iter(())

    def datasets(self, tokenizer, max_len: int, on_long: str, workdir: Path, primary: bool):
        """(training set, validation set): the texts encoded with the tokenizer's special
        tokens, their labels numbered."""
        if not hasattr(tokenizer, "encode_input"):
            raise DataError(
                f"--task classify needs a Hugging Face tokenizer; the run's is {tokenizer.kind}"
            )
        names = self.labels.names
        return (
            encode_labelled(self.train_pairs, names, tokenizer, max_len, on_long),
            encode_labelled(self.valid_pairs, names, tokenizer, max_len, on_long),
        )

    def install(self, workdir: Path, train_set) -> None:
        """Nothing to move: the sets are in memory."""

    def discard(self) -> None:
        """Nothing was staged."""
