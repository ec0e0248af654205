"""`train.py --recipe paper-base` (the paper's training recipe as flag values) and `ftx score`
(a whole test set scored from a checkpoint or the average of the last N), issue #25."""

from __future__ import annotations

import json
import re

import jax
import numpy as np
import pytest

import train
from flax_transformer.cli.main import main as ftx
from flax_transformer.cli.train_flags import parse_args, spec_from_args
from flax_transformer.runs.load import load_run
from flax_transformer.runs.spec import TrainSpec, spec_values
from flax_transformer.runs.train import train as run_training
from flax_transformer.training.averaging import average_params, last_steps
from flax_transformer.training.evaluation import loss_words, scores_text, short_reference_note

TINY = [
    "--task-min-len", "2", "--task-max-len", "6", "--task-train-size", "300",
    "--task-valid-size", "16", "--d-model", "16", "--num-heads", "2", "--num-layers", "1",
    "--d-ff", "32", "--max-len", "16", "--batch-size", "8", "--warmup", "2", "--dropout", "0.0",
    "--steps", "6", "--save-every", "2", "--eval-every", "100", "--keep-checkpoints", "3",
]  # fmt: skip


def test_the_paper_recipe_sets_the_papers_values_and_flags_override_them():
    args = parse_args(["--recipe", "paper-base", "--train-tsv", "x.tsv", "--steps", "7"])
    assert (args.preset, args.schedule, args.warmup) == ("paper_base", "inverse_sqrt", 4000)
    assert args.lr == pytest.approx(512**-0.5 * 4000**-0.5)  # 6.99e-4, the paper's peak
    assert (args.label_smoothing, args.weight_decay, args.clip_norm) == (0.1, 0.0, 0.0)
    assert (args.batch_tokens, args.tokenizer, args.bpe_vocab_size) == (25000, "bpe", 37000)
    assert (args.save_every, args.keep_checkpoints) == (1000, 5)
    assert args.steps == 7  # the command line wins


@pytest.mark.slow  # a BPE tokenizer and a few steps of a tiny model (about 15 s)
def test_the_paper_recipe_trains_a_few_steps_on_cpu(tmp_path):
    corpus = tmp_path / "train.tsv"
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(200):
        sentence = " ".join(rng.choice(words, rng.integers(2, 6)))
        lines.append(f"{sentence}\t{' '.join(reversed(sentence.split()))}")
    corpus.write_text("\n".join(lines) + "\n")
    workdir = tmp_path / "run"
    small = ["--d-model", "32", "--num-heads", "2", "--num-layers", "1", "--d-ff", "64"]
    small += ["--max-len", "32", "--bpe-vocab-size", "300", "--batch-tokens", "512"]
    flags = ["--recipe", "paper-base", "--train-tsv", corpus, *small, "--steps", "3"]
    assert train.main([str(f) for f in [*flags, "--workdir", workdir]]) == 0
    run = spec_values(json.loads((workdir / "run.json").read_text()))
    assert run["recipe"] == "paper-base" and run["schedule"] == "inverse_sqrt"
    assert (run["warmup"], run["label_smoothing"], run["batch_tokens"]) == (4000, 0.1, 512)
    assert json.loads((workdir / "results.json").read_text())["steps"] == 3


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny reverse-task run with checkpoints at steps 2, 4 and 6, and a test TSV."""
    root = tmp_path_factory.mktemp("score")
    workdir = root / "run"
    # From Python, without a command line: the spec of the flags TINY, the results returned.
    spec = TrainSpec(task="reverse", task_min_len=2, task_max_len=6, task_train_size=300,
                     task_valid_size=16, d_model=16, num_heads=2, num_layers=1, d_ff=32,
                     max_len=16, batch_size=8, warmup=2, dropout=0.0, steps=6, save_every=2,
                     eval_every=100, keep_checkpoints=3, workdir=str(workdir))  # fmt: skip
    flags = [*TINY, "--task", "reverse", "--workdir", str(workdir)]
    assert spec == spec_from_args(parse_args(flags))
    results = run_training(spec)
    assert json.loads(json.dumps(results)) == json.loads((workdir / "results.json").read_text())
    test = root / "test.tsv"
    test.write_text("abc\tcba\nhello\tolleh\nxy\tyx\n")
    return workdir, test


def test_average_of_the_last_checkpoints_is_their_mean(trained):
    workdir, _ = trained
    assert last_steps(workdir, 2) == [4, 6]
    run = load_run(workdir, "last")
    averaged = average_params(workdir, run.config, run.model_kind, [4, 6])["params"]
    four, six = load_run(workdir, 4).params["params"], load_run(workdir, 6).params["params"]
    expected = jax.tree.map(
        lambda a, b: ((np.float64(a) + np.float64(b)) / 2).astype(np.float32), four, six
    )
    jax.tree.map(np.testing.assert_array_equal, averaged, expected)
    with pytest.raises(ValueError, match="--average-last 5: .* holds 3 checkpoint"):
        last_steps(workdir, 5)


def test_score_reports_loss_bleu_and_exact_match_as_json(trained, capsys):
    workdir, test = trained
    argv = ["score", "--workdir", str(workdir), "--test-tsv", str(test), "--json", "-"]
    assert ftx([*argv, "--beam", "2", "--alpha", "0.6", "--average-last", "2"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["examples"] == 3 and scores["steps"] == [4, 6]
    assert scores["checkpoint"] == "average" and scores["decoding"] == "beam 2, alpha 0.6"
    assert scores["bleu_tokenize"] == "char"  # a built-in task run scores letter by letter
    assert np.isfinite(scores["loss"]) and 0 <= scores["exact_match"] <= 1
    assert 0 <= scores["bleu"] <= 100 and 0 <= scores["token_accuracy"] <= 1
    assert 0 <= scores["chrf"] <= 100
    # 2 of the 3 references are shorter than BLEU's 4-grams (letters here): a note says why
    # BLEU says little ("BLEU 0.00 beside 99.5% exact match" left a newcomer guessing).
    assert scores["bleu_note"].startswith("2 of 3 references have fewer than 4 tokens")
    assert ftx(["score", "--workdir", str(workdir), "--test-tsv", str(test)]) == 0
    out = capsys.readouterr().out
    assert "checkpoint: last" in out and "decoding: greedy" in out and "bleu: " in out
    assert "chrf: " in out and "bleu_note: 2 of 3 references" in out
    assert re.search(r"^loss: \d+\.\d{4} \(cross-entropy, no label smoothing\)$", out, re.M)


def test_every_command_names_its_loss_the_same_way():
    """The training log's valid loss includes the run's label smoothing, ftx score's does not:
    both say which (they differed on the same file and checkpoint with no word why)."""
    scores = {"valid_loss": 1.5, "token_accuracy": 0.5, "exact_match": 0.25, "bleu": 10.0,
              "chrf": 30.0}  # fmt: skip
    assert scores_text(scores, 0.1) == (
        "valid loss 1.5000 (cross-entropy with label smoothing 0.1), token accuracy 0.5000, "
        "exact match 0.2500, BLEU 10.00, chrF 30.00"
    )
    assert loss_words(0.0) == "cross-entropy, no label smoothing"
    # A classifier's units are examples: accuracy, not "token accuracy".
    classifier = {"valid_loss": 0.2, "token_accuracy": 0.9, "accuracy": 0.9, "macro_f1": 0.8}
    assert scores_text(classifier, 0.0) == (
        "valid loss 0.2000 (cross-entropy, no label smoothing), accuracy 0.9000, macro-F1 0.8000"
    )


def test_the_short_reference_note_counts_bleu_tokens():
    assert short_reference_note(["the cat sat down", "a b c d e"], "13a") is None
    note = short_reference_note(["yes", "no thanks", "the cat sat down"], "13a")
    assert note.startswith("2 of 3 references have fewer than 4 tokens (BLEU's 4-grams, "
                           "tokenize=13a)")  # fmt: skip
    assert short_reference_note(["abcd", "abc"], "char") is None  # 4 letters: 4 tokens


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--alpha", "0.6"], "--alpha needs --beam"),
        (["--average-last", "2", "--checkpoint", "last"], "not both"),
        (["--average-last", "9"], "--average-last 9: "),
        (["--beam", "0"], "argument --beam: must be a positive int, got 0"),
    ],
)
def test_score_bad_flags_exit_2(trained, capsys, flags, message):
    workdir, test = trained
    argv = ["score", "--workdir", str(workdir), "--test-tsv", str(test), *flags]
    assert ftx(argv) == 2
    assert message in capsys.readouterr().err
