"""Sequence classification: `train.py --task classify` fine-tunes an imported BERT into a
classifier, `hf export` gives what transformers' AutoModelForSequenceClassification loads and
predicts alike, `ftx classify` labels lines; the scores (accuracy, macro-F1, confusion) and the
label set rules; bad input refused by name.

The model is a tiny random BERT that transformers builds (tests/hf_models.py), with a WordPiece
tokenizer of made-up words; the data is generated: each text holds one of three marker words,
whose colour is its label (a rule the model learns in a few dozen steps)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import train
from flax_transformer.cli.classify import main as classify_main
from flax_transformer.cli.hf import main as hf_main
from flax_transformer.cli.score import main as score_main
from flax_transformer.data import labelled
from flax_transformer.data.pipeline import DataError, Pair
from flax_transformer.training import classification

from . import hf_models

pytest.importorskip("transformers")

MARKERS = {"w0": "red", "w1": "green", "w2": "blue"}


def labelled_lines(rng: np.random.Generator, count: int) -> list[str]:
    """`text<TAB>label` lines: 4-10 filler words and one marker word, labelled by the marker."""
    lines = []
    for _ in range(count):
        words = [f"w{i}" for i in rng.integers(10, 60, size=rng.integers(4, 11))]
        marker = list(MARKERS)[rng.integers(0, 3)]
        words.insert(int(rng.integers(0, len(words) + 1)), marker)
        lines.append(" ".join(words) + "\t" + MARKERS[marker])
    return lines


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(root, run dir) of an `hf import` of a tiny random BertModel, and labelled TSVs."""
    import transformers

    root = tmp_path_factory.mktemp("classify")
    config = hf_models.encoder_only_config("bert")
    config.architectures = ["BertModel"]
    torch.manual_seed(0)
    hf_models.save(transformers.BertModel(config), root / "bert")
    hf_models.encoder_only_tokenizer(root / "bert")
    assert hf_main(["import", str(root / "bert"), str(root / "run")]) == 0
    rng = np.random.default_rng(0)
    (root / "train.tsv").write_text("\n".join(labelled_lines(rng, 800)) + "\n")
    (root / "valid.tsv").write_text("\n".join(labelled_lines(rng, 200)) + "\n")
    return root, root / "run"


# ----------------------------------------------------------------------------- scores, labels
@pytest.mark.parametrize(
    "names", [("negative", "positive"), ("blue", "green", "red"), tuple("abcdefghij")]
)
def test_the_confusion_picture_shows_its_whole_title(names):
    """The title was cut off at the figure's edge for a few labels."""
    from flax_transformer.training.plots import confusion_figure

    matrix = np.arange(len(names) ** 2).reshape(len(names), len(names))
    fig = confusion_figure(matrix, names)
    fig.canvas.draw()
    (ax,) = fig.axes
    title, box = ax.title.get_window_extent(), fig.bbox
    assert box.x0 <= title.x0 and title.x1 <= box.x1 and title.y1 <= box.y1, (title, box)


def test_scores_of_a_confusion_matrix():
    # rows: true a, b, c; columns: predicted. a: 3 right, 1 as b; b: 2 right; c: 1 as a.
    matrix = classification.confusion_matrix([0, 0, 0, 0, 1, 1, 2], [0, 0, 0, 1, 1, 1, 0], 3)
    np.testing.assert_array_equal(matrix, [[3, 1, 0], [0, 2, 0], [1, 0, 0]])
    scores = classification.scores_of(matrix, ("a", "b", "c"))
    assert scores["accuracy"] == pytest.approx(5 / 7)
    f1 = {"a": 2 * 3 / (2 * 3 + 1 + 1), "b": 2 * 2 / (2 * 2 + 1), "c": 0.0}
    assert scores["macro_f1"] == pytest.approx(np.mean(list(f1.values())))
    assert scores["per_label"]["a"] == pytest.approx(
        {"precision": 3 / 4, "recall": 3 / 4, "f1": f1["a"], "support": 4}
    )
    # A class that is neither truth nor prediction does not count in the macro average.
    unused = classification.scores_of(np.pad(matrix, (0, 1)), ("a", "b", "c", "d"))
    assert unused["macro_f1"] == pytest.approx(scores["macro_f1"])


def test_labels_keep_the_init_models_order_only_when_it_names_them_all():
    kept = labelled.choose_labels(["pos", "neg"], {"0": "neg", "1": "neutral", "2": "pos"})
    assert kept == labelled.LabelChoice(("neg", "neutral", "pos"), kept=True)
    assert kept.fresh_params == ()
    new = labelled.choose_labels(["pos", "neg", "pos"], {"0": "LABEL_0", "1": "LABEL_1"})
    assert new == labelled.LabelChoice(("neg", "pos"), kept=False)
    assert new.fresh_params == ("head/classifier",)


def test_the_classifier_class_follows_the_family():
    known = ("BertModel", "BertForSequenceClassification", "BertForMaskedLM")
    name = labelled.classifier_architecture
    assert name(["BertModel"], "bert", known) == "BertForSequenceClassification"
    assert name(["BertForMaskedLM"], "bert", known) == "BertForSequenceClassification"
    assert name(None, "bert", known) == "BertForSequenceClassification"
    roberta = ("XLMRobertaModel", "XLMRobertaForSequenceClassification",
               "RobertaForSequenceClassification")  # fmt: skip
    assert name(None, "xlm-roberta", roberta) == "XLMRobertaForSequenceClassification"
    with pytest.raises(ValueError, match="no sequence-classification head"):
        name(["T5EncoderModel"], "t5", ("T5EncoderModel", "T5ForConditionalGeneration"))


def test_labelled_tsv_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("a good text\tpos\n\nno label here\n")
    with pytest.raises(DataError, match=r"bad.tsv line 3: no tab; expected exactly one 'text<TAB"):
        labelled.read_labelled_tsv(path)
    path.write_text("text\t \n")
    with pytest.raises(DataError, match="line 1: empty label"):
        labelled.read_labelled_tsv(path)
    with pytest.raises(DataError, match=r"v.tsv:7: label 'maybe' is not one of the"):
        labelled.check_labels([Pair("x", "maybe", "v.tsv:7")], ("neg", "pos"), "run's")


# ----------------------------------------------------------------------------- bad flags
@pytest.mark.parametrize(
    "flags, message",
    [
        ([], "--task classify fine-tunes an encoder: give --init-from RUN"),
        (["--init-from", "RUN", "--pack"], "--task classify does not take --pack"),
    ],
)
def test_flags_that_do_not_go_with_classify_are_refused(imported, flags, message, capsys):
    root, run = imported
    flags = [str(run) if f == "RUN" else f for f in flags]
    argv = ["--task", "classify", "--train-tsv", str(root / "train.tsv"), *flags]
    assert train.main([*argv, "--workdir", str(root / "refused")]) == 2
    assert message in capsys.readouterr().err
    assert not (root / "refused").exists()


def test_an_unknown_validation_label_is_named_before_anything_is_written(imported, capsys):
    root, run = imported
    valid = root / "odd.tsv"
    valid.write_text("w0 w11\tred\nw1 w12\tpurple\n")
    argv = ["--task", "classify", "--init-from", str(run), "--train-tsv", str(root / "train.tsv")]
    workdir = root / "never"
    assert train.main([*argv, "--valid-tsv", str(valid), "--workdir", str(workdir)]) == 2
    assert f"{valid}:2: label 'purple' is not one of the training file's labels" in (
        capsys.readouterr().err
    )
    assert not workdir.exists()


def test_a_training_file_with_one_label_is_refused_naming_it(imported, capsys):
    """One label would train a "classifier" answering it with probability 1 (and transformers
    reads an exported num_labels=1 as regression): refused before anything is written."""
    root, run = imported
    single = root / "single.tsv"
    single.write_text("w0 w11\tred\nw1 w12\tred\nw2 w13\tred\n")
    workdir = root / "one_label"
    argv = ["--task", "classify", "--init-from", str(run), "--train-tsv", str(single)]
    assert train.main([*argv, "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert f"{single}: a classifier needs at least 2 labels" in err
    assert "only the label 'red'" in err
    assert not workdir.exists()


def test_an_init_run_without_its_hugging_face_config_is_named_before_any_data(
    imported, tmp_path, capsys
):
    """The label set comes from the --init-from run's hf_config.json, read with the run
    directories: a run without one is refused in one line before the data is read and before
    anything is written."""
    import shutil

    root, run = imported
    bare = tmp_path / "bare"
    shutil.copytree(run, bare)
    (bare / "hf_config.json").unlink()
    workdir = tmp_path / "never"
    argv = ["--task", "classify", "--init-from", str(bare), "--train-tsv", str(root / "no.tsv")]
    assert train.main([*argv, "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert f"--task classify: {bare} has no hf_config.json; start from an `ftx hf import`" in err
    assert "no.tsv" not in err and "Traceback" not in err
    assert not workdir.exists()


def test_score_says_an_encoder_run_is_not_scored_here(imported, capsys):
    root, run = imported  # a bare BertModel: an encoder run, as a classifier run is
    assert score_main(["--workdir", str(run), "--test-tsv", str(root / "valid.tsv")]) == 2
    err = capsys.readouterr().err
    assert f"error: {run} is an encoder run; `ftx score` scores translation" in err, err
    assert "Traceback" not in err


def test_classify_refuses_a_run_without_a_classifier(imported, capsys):
    _, run = imported  # a bare BertModel
    assert classify_main(["--workdir", str(run)]) == 2
    assert "holds a none model, not a sequence classifier" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the whole path
@pytest.mark.slow
def test_fine_tune_export_and_transformers_predict_the_same(imported, tmp_path, capsys):
    """From an imported bare BERT: fine-tuned to >= 95% validation accuracy, exported, and
    transformers' AutoModelForSequenceClassification gives the same labels (and probabilities
    within float32 tolerance) as `ftx classify` on the validation texts."""
    import transformers

    root, run = imported
    workdir = tmp_path / "classifier"
    argv = ["--task", "classify", "--init-from", str(run), "--train-tsv", str(root / "train.tsv")]
    argv += ["--valid-tsv", str(root / "valid.tsv"), "--workdir", str(workdir), "--steps", "150"]
    argv += ["--batch-size", "32", "--lr", "1e-3", "--warmup", "30", "--eval-every", "75"]
    assert train.main(argv) == 0
    out = capsys.readouterr().out
    assert "3 labels (blue, green, red); the classifier layer is new" in out
    assert "--init-from: new head/classifier" in out
    results = json.loads((workdir / "results.json").read_text())
    assert results["accuracy"] >= 0.95, results
    assert results["macro_f1"] >= 0.95
    assert np.sum(results["confusion"]) == results["valid_examples"] == 200
    assert (workdir / "confusion.png").stat().st_size > 0
    assert json.loads((workdir / "labels.json").read_text()) == ["blue", "green", "red"]
    evals = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [75, 150]
    assert all({"accuracy", "macro_f1"} <= set(r) for r in evals)

    # --resume (the same flags, more steps) continues with the run's labels and head.
    argv[argv.index("--steps") + 1] = "160"
    assert train.main([*argv, "--resume"]) == 0
    assert "resumed from step 150" in capsys.readouterr().out
    resumed = json.loads((workdir / "results.json").read_text())
    assert resumed["steps"] == 160 and resumed["accuracy"] >= 0.95

    # `ftx score` says what a classifier run is and what to use (it was an array-shape error).
    capsys.readouterr()
    assert score_main(["--workdir", str(workdir), "--test-tsv", str(root / "valid.tsv")]) == 2
    err = capsys.readouterr().err
    assert f"{workdir} is a sequence classifier run; `ftx score` scores translation" in err
    assert "`ftx classify --workdir RUN --input FILE`" in err

    assert hf_main(["export", str(workdir), str(tmp_path / "hf")]) == 0
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf")
    assert type(model).__name__ == "BertForSequenceClassification"
    assert model.config.id2label == {0: "blue", 1: "green", 2: "red"}
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    texts = [line.split("\t")[0] for line in (root / "valid.tsv").read_text().splitlines()]
    with torch.no_grad():
        logits = model.eval()(**tokenizer(texts, padding=True, return_tensors="pt")).logits
    probabilities = torch.softmax(logits, -1).numpy()
    expected = [model.config.id2label[int(i)] for i in probabilities.argmax(-1)]

    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    capsys.readouterr()  # (what the export printed)
    assert classify_main(["--workdir", str(workdir), "--input", str(tmp_path / "texts.txt")]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [label for label, _ in rows] == expected
    ours = np.array([float(p) for _, p in rows])
    np.testing.assert_allclose(ours, probabilities.max(-1), atol=1e-4)  # (printed to 4 places)
    # --json: one record a line, the probability unrounded.
    argv = ["--workdir", str(workdir), "--input", str(tmp_path / "texts.txt"), "--json"]
    assert classify_main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["label"] for r in records] == expected
    np.testing.assert_allclose(
        [r["probability"] for r in records], probabilities.max(-1), atol=1e-5
    )
