"""Sequence classification's scores (`train.py --task classify`): accuracy, macro-F1 and the
confusion matrix of a classifier's evaluation. Its labelled files, label set and encoding are
data/labelled.py's.
"""

from __future__ import annotations

import numpy as np

from flax_transformer.data.pipeline import CLASSIFY  # noqa: F401  (the task's name)
from flax_transformer.training.steps import add_sums, summarize


# ----------------------------------------------------------------------------- scores
def confusion_matrix(truth, predicted, num_labels: int) -> np.ndarray:
    """(num_labels, num_labels) counts: row = the true class, column = the predicted one."""
    matrix = np.zeros((num_labels, num_labels), np.int64)
    np.add.at(matrix, (np.asarray(truth, np.int64), np.asarray(predicted, np.int64)), 1)
    return matrix


def scores_of(matrix: np.ndarray, names: tuple[str, ...]) -> dict:
    """accuracy, macro_f1 (the mean F1 over the classes that occur as truth or prediction, as
    scikit-learn's f1_score(average="macro") counts them) and per label precision, recall, F1
    and support, from a confusion matrix."""
    matrix = np.asarray(matrix, np.float64)
    true_positive = np.diag(matrix)
    actual, predicted = matrix.sum(axis=1), matrix.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(predicted > 0, true_positive / predicted, 0.0)
        recall = np.where(actual > 0, true_positive / actual, 0.0)
        denominator = actual + predicted
        f1 = np.where(denominator > 0, 2 * true_positive / denominator, 0.0)
    present = (actual + predicted) > 0
    total = matrix.sum()
    return {
        "accuracy": float(true_positive.sum() / total) if total else 0.0,
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "per_label": {
            name: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
            for name, p, r, f, s in zip(names, precision, recall, f1, actual, strict=True)
        },
    }


def evaluate_classifier(eval_step, params, batches, names: tuple[str, ...]):
    """(scores, confusion matrix) over `batches` ([(indices, batch)]) in one pass: valid_loss,
    token_accuracy (here: the share of examples right), accuracy and macro_f1."""
    sums, truth, predicted = None, [], []
    for _, batch in batches:
        aux = eval_step(params, batch)
        sums = add_sums(sums, aux)
        real = batch["labels"] >= 0  # padding rows of a short batch hold -1
        truth.append(batch["labels"][real])
        predicted.append(np.asarray(aux["predictions"])[real])
    matrix = confusion_matrix(np.concatenate(truth), np.concatenate(predicted), len(names))
    loss = summarize(sums)
    scores = scores_of(matrix, names)
    return {
        "valid_loss": loss["loss"],
        "token_accuracy": loss["token_accuracy"],
        "accuracy": scores["accuracy"],
        "macro_f1": scores["macro_f1"],
    }, matrix
