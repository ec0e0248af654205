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
import math
import sys
import warnings
from pathlib import Path

from flax_transformer.cli.flags import flag_type
from flax_transformer.cli.output import add_json_flag
from flax_transformer.cli.process import exit_process
from flax_transformer.files.atomic_io import OutputPathError, atomic_write_text, check_output_path
from flax_transformer.files.interruptions import one_line_failures
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


def load_params(args, run):
    """(params, which): the run's loaded checkpoint, or the average of its last N."""
    if args.average_last is None:
        return run.params, {"checkpoint": run.checkpoint, "step": run.step}
    from flax_transformer.training.averaging import average_params, last_steps

    steps = last_steps(args.workdir, args.average_last)
    params = average_params(args.workdir, run.config, run.model_kind, steps)
    return params, {"checkpoint": "average", "steps": steps}


def read_test_set(args, run):
    """The encoded test set (all of it; pairs over max_len skipped with a warning)."""
    from flax_transformer.data.pipeline import (
        encode_documents,
        encode_pairs,
        read_text_lines,
        read_tsv,
    )

    if run.model_kind == "encoder":  # a classifier's test set is labels, not translations
        what = "a sequence classifier" if run.config.head.startswith("sequence") else "an encoder"
        raise ValueError(
            f"{args.workdir} is {what} run; `ftx score` scores translation and language-model "
            "runs. Label a test set with `ftx classify --workdir RUN --input FILE` (a "
            "classifier's accuracy and macro-F1 are in its training log, valid_* lines)"
        )
    if args.test_text is not None:
        if run.model_kind != "lm":
            raise ValueError(f"{args.workdir} is a {run.model_kind} run; give --test-tsv")
        return encode_documents(read_text_lines(args.test_text), run.tokenizer, run.config.max_len)
    if run.model_kind == "lm":
        raise ValueError(f"{args.workdir} is a language-model run; give --test-text")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = encode_pairs(read_tsv(args.test_tsv), run.tokenizer, run.config.max_len)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    return dataset


def score(args) -> dict:
    """The scores of the test set, with what was scored (examples, checkpoint, decoding)."""
    import jax

    from flax_transformer.data.pipeline import eval_batches
    from flax_transformer.decoding import Beam, Greedy
    from flax_transformer.nn.kinds import model_for
    from flax_transformer.runs.checks import bleu_tokenizer
    from flax_transformer.runs.spec import TrainSpec, spec_values
    from flax_transformer.training.evaluation import evaluate_decoding, evaluate_loss
    from flax_transformer.training.run import open_run
    from flax_transformer.training.run_dir import read_run_json
    from flax_transformer.training.steps import make_eval_step

    run = open_run(args.workdir, args.checkpoint)
    params, which = load_params(args, run)
    dataset = read_test_set(args, run)
    model = model_for(run.config, run.model_kind)
    pad = run.tokenizer.pad_id
    batches = eval_batches(dataset, args.batch_size, run.config.max_len, pad)
    loss = evaluate_loss(jax.jit(make_eval_step(model, 0.0)), params["params"], batches)
    scores = {"examples": len(dataset), **which, "loss": loss["loss"]}
    if run.model_kind == "lm":
        return scores | {"perplexity": float(math.exp(min(loss["loss"], 50.0)))}
    strategy = (
        Greedy()
        if args.beam is None
        else Beam(args.beam, 0.6 if args.alpha is None else args.alpha)
    )
    saved = spec_values(read_run_json(args.workdir) or {})
    bleu_tokenize = args.bleu_tokenize or bleu_tokenizer(  # the run's own choice, "auto" resolved
        TrainSpec(
            bleu_tokenize=saved.get("bleu_tokenize", "auto"),
            train_tsv=saved.get("train_tsv"),
            train_jsonl=saved.get("train_jsonl"),
        )
    )
    decoded = evaluate_decoding(
        model, params["params"], dataset, run.tokenizer, batch_size=args.batch_size,
        max_len=run.config.max_len, bleu_tokenize=bleu_tokenize, strategy=strategy,
    )  # fmt: skip
    decoding = "greedy" if args.beam is None else f"beam {strategy.size}, alpha {strategy.alpha}"
    return (
        scores
        | {
            "token_accuracy": loss["token_accuracy"],
            "bleu": decoded.bleu,
            "chrf": decoded.chrf,
            "exact_match": decoded.exact_match,
            "decoding": decoding,
            "bleu_tokenize": bleu_tokenize,
        }
        | ({"bleu_note": decoded.bleu_note} if decoded.bleu_note else {})
    )


@one_line_failures
def main(argv: list[str] | None = None) -> int:
    """Entry point of `ftx score`: print the test set's scores (or write them as JSON); exit
    status 0, 2 for bad input."""
    from flax_transformer.training.checkpoint import CheckpointReadError

    args = parse_args(argv)
    try:
        scores = score(args)
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
