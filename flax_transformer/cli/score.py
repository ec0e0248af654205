"""`ftx score`: score a whole test set with a trained run, from a checkpoint or the average of
the last N (the paper's evaluation: average the last 5 checkpoints, beam 4, length penalty 0.6).

    ftx score --workdir RUN --test-tsv newstest.tsv --beam 4 --alpha 0.6 --average-last 5
    ftx score --workdir LM_RUN --test-text held_out.txt

A seq2seq run reports the test set's loss (plain cross-entropy per target token, no label
smoothing, said beside it), token accuracy, corpus BLEU and chrF (sacrebleu; a note when most
references are too short for BLEU's 4-grams) and exact match of the decoded translations; a
language-model run reports loss and perplexity. Every example is scored (no --valid-max cap);
pairs longer than the model's max_len are skipped with a warning that counts them. One line
per number, or JSON with --json OUT (`-`: stdout). Exit status 0, 2 for bad
input (flags, a workdir that is not a run, a test file that cannot be read).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flax_transformer.cli.flags import flag_type
from flax_transformer.cli.output import add_json_flag
from flax_transformer.cli.process import exit_process
from flax_transformer.files.atomic_io import OutputPathError, atomic_write_text, check_output_path
from flax_transformer.files.interruptions import one_line_failures
from flax_transformer.runs.score import ScoreSpec, score
from flax_transformer.spec.validate import Float, Int


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The score flags; argparse errors (exit 2) for bad values or combinations."""
    parser = argparse.ArgumentParser(
        prog="ftx score",
        description="Score a test set with a run of ftx train: loss, BLEU and exact match "
        "(seq2seq) or perplexity (LM).",
    )
    parser.add_argument(
        "--workdir", type=Path, required=True, help="a run directory (ftx train --workdir)"
    )
    test = parser.add_mutually_exclusive_group(required=True)
    test.add_argument("--test-tsv", type=Path, help="seq2seq test set: source<TAB>target lines")
    test.add_argument("--test-text", type=Path, help="LM test set: one document a line")
    parser.add_argument(
        "--checkpoint", help="last, best or a step (default: best if kept, else last)"
    )
    parser.add_argument(
        "--average-last",
        type=flag_type(Int(min=1), "--average-last"),
        metavar="N",
        help="average the parameters of the last N checkpoints (the paper: 5)",
    )
    parser.add_argument(
        "--beam", type=flag_type(Int(min=1), "--beam"), help="beam size (default: greedy)"
    )
    parser.add_argument(
        "--alpha",
        type=flag_type(Float(ge=0), "--alpha"),
        help="beam search length penalty (default 0.6; needs --beam)",
    )
    parser.add_argument(
        "--batch-size", type=flag_type(Int(min=1), "--batch-size"), default=32, metavar="N"
    )
    parser.add_argument(
        "--bleu-tokenize",
        choices=("13a", "char", "zh", "intl", "none"),
        help="sacrebleu tokenizer (default: the run's)",
    )
    add_json_flag(parser)
    args = parser.parse_args(argv)
    if args.alpha is not None and args.beam is None:
        parser.error("--alpha needs --beam: greedy decoding has no length penalty")
    if args.average_last is not None and args.checkpoint is not None:
        parser.error("give --checkpoint or --average-last, not both")
    if args.test_text is not None and (args.beam or args.bleu_tokenize):
        parser.error("--beam and --bleu-tokenize score translations; --test-text scores an LM")
    if args.json not in (None, "-"):
        test_file = args.test_tsv or args.test_text
        try:
            inputs = [("run directory", args.workdir), ("test file", test_file)]
            check_output_path(args.json, inputs=inputs, what="--json")
        except OutputPathError as err:
            parser.error(str(err))
    return args


@one_line_failures
def main(argv: list[str] | None = None) -> int:
    """Entry point of `ftx score`: print the test set's scores (or write them as JSON); exit
    status 0, 2 for bad input."""
    from flax_transformer.training.checkpoint import CheckpointReadError

    args = parse_args(argv)
    spec = ScoreSpec(**{k: v for k, v in vars(args).items() if k != "json"})
    try:
        scores = score(spec)
    except (ValueError, CheckpointReadError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = json.dumps(scores, indent=2) + "\n"
    if args.json == "-":
        print(text, end="")
        return 0
    from flax_transformer.training.evaluation import loss_words

    for name, value in scores.items():
        shown = f"{value:.4f}" if isinstance(value, float) else value
        if name == "loss":  # what it is, as the training log names its valid loss
            shown = f"{shown} ({loss_words(0.0)})"
        print(f"{name}: {shown}")
    if args.json:
        atomic_write_text(args.json, text)
    return 0


if __name__ == "__main__":
    exit_process(main())
