"""The score workflow (`ftx score`): a whole test set scored with a run, from a checkpoint or
the average of the last N; `score(ScoreSpec(...)) -> {name: value}`. What it reports is said in
cli/score.py, which builds the spec from its flags and prints the scores."""

from __future__ import annotations

import dataclasses
import math
import sys
import warnings
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ScoreSpec:
    """What to score: the run, the test set (test_tsv for a seq2seq run, test_text for an LM),
    which parameters (a checkpoint, or the average of the last N) and how to decode."""

    workdir: Path
    test_tsv: Path | None = None
    test_text: Path | None = None
    checkpoint: str | None = None
    average_last: int | None = None
    beam: int | None = None
    alpha: float | None = None
    batch_size: int = 32
    bleu_tokenize: str | None = None  # None: the run's own choice


def load_params(spec: ScoreSpec, run):
    """(params, which): the run's loaded checkpoint, or the average of its last N."""
    if spec.average_last is None:
        return run.params, {"checkpoint": run.checkpoint, "step": run.step}
    from flax_transformer.training.averaging import average_params, last_steps

    steps = last_steps(spec.workdir, spec.average_last)
    params = average_params(spec.workdir, run.config, run.model_kind, steps)
    return params, {"checkpoint": "average", "steps": steps}


def read_test_set(spec: ScoreSpec, run):
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
            f"{spec.workdir} is {what} run; `ftx score` scores translation and language-model "
            "runs. Label a test set with `ftx classify --workdir RUN --input FILE` (a "
            "classifier's accuracy and macro-F1 are in its training log, valid_* lines)"
        )
    if spec.test_text is not None:
        if run.model_kind != "lm":
            raise ValueError(f"{spec.workdir} is a {run.model_kind} run; give --test-tsv")
        return encode_documents(read_text_lines(spec.test_text), run.tokenizer, run.config.max_len)
    if run.model_kind == "lm":
        raise ValueError(f"{spec.workdir} is a language-model run; give --test-text")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = encode_pairs(read_tsv(spec.test_tsv), run.tokenizer, run.config.max_len)
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    return dataset


def score(spec: ScoreSpec) -> dict:
    """The scores of the test set, with what was scored (examples, checkpoint, decoding)."""
    import jax

    from flax_transformer.data.pipeline import eval_batches
    from flax_transformer.decoding import Beam, Greedy
    from flax_transformer.nn.kinds import model_for
    from flax_transformer.runs.checks import bleu_tokenizer
    from flax_transformer.runs.load import open_run
    from flax_transformer.runs.run_dir import read_run_json
    from flax_transformer.runs.spec import TrainSpec, spec_values
    from flax_transformer.training.evaluation import evaluate_decoding, evaluate_loss
    from flax_transformer.training.steps import make_eval_step

    run = open_run(spec.workdir, spec.checkpoint)
    params, which = load_params(spec, run)
    dataset = read_test_set(spec, run)
    model = model_for(run.config, run.model_kind)
    pad = run.tokenizer.pad_id
    batches = eval_batches(dataset, spec.batch_size, run.config.max_len, pad)
    loss = evaluate_loss(jax.jit(make_eval_step(model, 0.0)), params["params"], batches)
    scores = {"examples": len(dataset), **which, "loss": loss["loss"]}
    if run.model_kind == "lm":
        return scores | {"perplexity": float(math.exp(min(loss["loss"], 50.0)))}
    strategy = (
        Greedy()
        if spec.beam is None
        else Beam(spec.beam, 0.6 if spec.alpha is None else spec.alpha)
    )
    saved = spec_values(read_run_json(spec.workdir) or {})
    bleu_tokenize = spec.bleu_tokenize or bleu_tokenizer(  # the run's own choice, "auto" resolved
        TrainSpec(
            bleu_tokenize=saved.get("bleu_tokenize", "auto"),
            train_tsv=saved.get("train_tsv"),
            train_jsonl=saved.get("train_jsonl"),
        )
    )
    decoded = evaluate_decoding(
        model, params["params"], dataset, run.tokenizer, batch_size=spec.batch_size,
        max_len=run.config.max_len, bleu_tokenize=bleu_tokenize, strategy=strategy,
    )  # fmt: skip
    decoding = "greedy" if spec.beam is None else f"beam {strategy.size}, alpha {strategy.alpha}"
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
