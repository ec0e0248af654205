"""Label text with a sequence classifier: a run of `train.py --task classify`, or an `ftx hf
import` of a `*ForSequenceClassification` model.

    ftx classify --workdir RUN [--input FILE] [--checkpoint last|best|STEP] [--batch-size N]

Reads one text per line (from --input or stdin) and writes, per line and in order,
`label<TAB>probability` (the most probable label and its softmax probability). The label names
are the run's labels.json, else its Hugging Face config's id2label. A bad input line (empty,
not valid UTF-8, longer than the model's max_len) is reported on stderr with its line number
and gives an empty output line; the exit status is then 2, as for a workdir that holds no
sequence classifier.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from flax_transformer.cli.flags import flag_type
from flax_transformer.cli.generate import read_lines
from flax_transformer.cli.output import JSON_LINES_HELP, add_json_flag, emit_lines
from flax_transformer.files.interruptions import one_line_failures
from flax_transformer.files.text_lines import LineDecodeError, decode_line
from flax_transformer.runs.generate import InputError, batches
from flax_transformer.spec.kinds import ENCODER
from flax_transformer.spec.validate import Int

BUCKET = 16  # batch widths are rounded up to a multiple of this: fewer compilations


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The flags of `ftx classify` (argparse exits with status 2 on a bad one)."""
    parser = argparse.ArgumentParser(
        prog="ftx classify",
        description="Label each input line with a sequence classifier run: label<TAB>probability.",
    )
    parser.add_argument("--workdir", type=Path, required=True, help="a classifier run directory")
    parser.add_argument("--input", type=Path, help="input file, one text per line (default: stdin)")
    parser.add_argument(
        "--checkpoint", default=None, help="last, best or a step number (default: best, else last)"
    )
    parser.add_argument(
        "--batch-size",
        type=flag_type(Int(min=1), "--batch-size"),
        default=32,
        help="texts per forward pass (default: %(default)s)",
    )
    add_json_flag(parser, JSON_LINES_HELP)
    return parser.parse_args(argv)


def label_names(workdir: Path, num_labels: int) -> tuple[str, ...]:
    """The classes' names: labels.json (a --task classify run), else the imported model's
    id2label, else LABEL_0, LABEL_1, ... as transformers names them."""
    from flax_transformer.runs import run_dir

    names = run_dir.read_labels(workdir)
    if names is None and (workdir / run_dir.HF_CONFIG).exists():
        from flax_transformer.hf.checkpoint import read_json

        id2label = read_json(workdir / run_dir.HF_CONFIG, "Hugging Face config").get("id2label")
        if isinstance(id2label, dict) and len(id2label) == num_labels:
            names = tuple(str(id2label[k]) for k in sorted(id2label, key=int))
    names = names or tuple(f"LABEL_{i}" for i in range(num_labels))
    if len(names) != num_labels:
        raise ValueError(
            f"{workdir}: {len(names)} label names for a classifier of {num_labels} labels"
        )
    return names


class Classifier:
    """Texts -> (label, probability) with one run's model, one jitted forward per batch width."""

    def __init__(self, run, names: tuple[str, ...]):
        import jax

        self.run, self.names, self.max_len = run, names, run.config.max_len
        model = run.model

        def probabilities(params, src):  # (batch, width) -> (batch, num_labels)
            return jax.nn.softmax(model.apply(params, src).astype(np.float32), axis=-1)

        self._forward = jax.jit(probabilities)

    def encode(self, line: str | bytes, number: int) -> list[int]:
        """One input line -> the ids the classifier reads (special tokens included); InputError
        naming line `number` for bad UTF-8, an empty line or too many tokens."""
        if isinstance(line, bytes):
            try:
                line = decode_line(line)
            except LineDecodeError as err:
                raise InputError(f"line {number}: {err}") from None
        if not line.strip():
            raise InputError(f"line {number}: empty input")
        ids = self.run.tokenizer.encode_input(line)
        if len(ids) > self.max_len:
            raise InputError(
                f"line {number}: the text is {len(ids)} tokens (with special tokens), longer "
                f"than the model's max_len {self.max_len}"
            )
        return ids

    def classify(self, rows: list[list[int]]) -> list[tuple[str, float]]:
        """Token rows -> the most probable label of each and its probability."""
        width = min(-(-max(map(len, rows)) // BUCKET) * BUCKET, self.max_len)
        src = np.full((len(rows), width), self.run.config.pad_id, np.int32)
        for i, row in enumerate(rows):
            src[i, : len(row)] = row
        probs = np.asarray(self._forward(self.run.params, src))  # (batch, num_labels)
        best = probs.argmax(axis=-1)
        return [(self.names[int(b)], float(p[b])) for b, p in zip(best, probs, strict=True)]


@one_line_failures
def main(argv: list[str] | None = None) -> int:
    """Entry point of `ftx classify`: print one `label<TAB>probability` line per input line; exit
    status 2 for a bad workdir, flag or input line (an empty line is printed in its place)."""
    args = parse_args(argv)
    from flax_transformer.runs.load import RunLoadError, open_run

    try:
        run = open_run(args.workdir, args.checkpoint, kinds=(ENCODER,), purpose="classify")
        if not run.config.head.startswith("sequence"):
            raise ValueError(
                f"{args.workdir} holds a {run.config.head} model, not a sequence classifier"
            )
        if not hasattr(run.tokenizer, "encode_input"):
            raise ValueError(f"{args.workdir}: a classifier run needs a Hugging Face tokenizer")
        classifier = Classifier(run, label_names(args.workdir, run.config.num_labels))
    except (RunLoadError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    outputs, errors, good, found = [], [], [], {}
    for number, line in enumerate(read_lines(args.input), start=1):
        try:
            good.append((len(outputs), classifier.encode(line, number)))
            outputs.append(None)
        except InputError as err:
            errors.append(str(err))
            outputs.append("")
    for chunk in batches(good, args.batch_size):
        labelled = classifier.classify([ids for _, ids in chunk])
        for (index, _), (label, probability) in zip(chunk, labelled, strict=True):
            outputs[index] = f"{label}\t{probability:.4f}"
            found[index] = (label, probability)
    for message in errors:
        print(f"error: {message}; an empty line is written in its place", file=sys.stderr)
    records = [  # a bad line: nulls in its place
        {"line": number, "label": None, "probability": None}
        for number in range(1, len(outputs) + 1)
    ]
    for index, (label, probability) in found.items():
        records[index].update(label=label, probability=float(probability))
    emit_lines(records, outputs, args.json)
    return 2 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
