"""Pictures a person would rather look at than read: training curves, attention heatmaps and
a classifier's confusion matrix.

matplotlib with the Agg backend (no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from flax_transformer.files.atomic_io import atomic_path  # noqa: E402


def plot_curves(records: list[dict], path: str | Path) -> Path:
    """Loss (train and valid) and token accuracy against step, from metrics.jsonl records."""
    train = [r for r in records if r.get("kind") == "train"]
    valid = [r for r in records if r.get("kind") == "eval"]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        ax_loss.plot([r["step"] for r in train], [r["train_loss"] for r in train], label="train")
    if valid:
        steps = [r["step"] for r in valid]
        ax_loss.plot(steps, [r["valid_loss"] for r in valid], "o-", label="valid")
        ax_acc.plot(steps, [r["token_accuracy"] for r in valid], "o-", label="token accuracy")
        scored = [r for r in valid if "macro_f1" in r]  # a classifier's
        if scored:
            ax_acc.plot([r["step"] for r in scored], [r["macro_f1"] for r in scored], "s-",
                        label="macro-F1")  # fmt: skip
        decoded = [r for r in valid if "exact_match" in r]
        if decoded:
            ax_acc.plot(
                [r["step"] for r in decoded],
                [r["exact_match"] for r in decoded],
                "s",
                label="exact match (greedy)",
            )
    ax_loss.set(xlabel="step", ylabel="loss (label smoothing constant removed)", title="Loss")
    ax_loss.set_yscale("symlog", linthresh=0.01)
    ax_acc.set(xlabel="step", ylabel="fraction", title="Validation accuracy", ylim=(0, 1.02))
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, path)


def plot_attention(
    maps: list[np.ndarray],
    src_labels: list[str],
    tgt_labels: list[str],
    path: str | Path,
    max_heads: int = 4,
) -> Path:
    """Heatmap grid: one row per layer, up to `max_heads` heads per row.

    maps: per layer (heads, tgt_len, src_len); rows are target (query) tokens."""
    heads = min(max_heads, maps[0].shape[0])
    cell = 0.25
    width = max(3.0, cell * len(src_labels) + 1.5)
    height = max(2.5, cell * len(tgt_labels) + 1.0)
    fig, axes = plt.subplots(
        len(maps), heads, figsize=(width * heads, height * len(maps)), squeeze=False
    )
    for layer, weights in enumerate(maps):
        for head in range(heads):
            ax = axes[layer][head]
            ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_xticks(range(len(src_labels)), src_labels, fontsize=7, rotation=90)
            ax.set_yticks(range(len(tgt_labels)), tgt_labels, fontsize=7)
            ax.set_title(f"layer {layer} head {head}", fontsize=9)
            if head == 0:
                ax.set_ylabel("target (query)")
            if layer == len(maps) - 1:
                ax.set_xlabel("source (key)")
    fig.suptitle("Cross-attention of one validation example")
    return _save(fig, path)


def plot_confusion(
    matrix: np.ndarray, names: list[str] | tuple[str, ...], path: str | Path
) -> Path:
    """The confusion matrix of a classifier's validation set: rows the true labels, columns the
    predicted ones, each cell its count (shaded by the share of its row)."""
    return _save(confusion_figure(matrix, names), path)


def confusion_figure(matrix: np.ndarray, names: list[str] | tuple[str, ...]):
    """plot_confusion's figure, laid out: its title on two lines (one line was wider than the
    figure of a few labels, and was cut off)."""
    matrix = np.asarray(matrix)
    size = max(3.5, 0.6 * len(names) + 2.0)
    fig, ax = plt.subplots(figsize=(size, size * 0.9))
    rows = np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    ax.imshow(matrix / rows, cmap="Blues", vmin=0.0, vmax=1.0)
    ticks = range(len(names))
    ax.set_xticks(ticks, names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(ticks, names, fontsize=8)
    for (row, col), count in np.ndenumerate(matrix):
        shade = matrix[row, col] / rows[row, 0]
        ax.text(col, row, str(count), ha="center", va="center", fontsize=8,
                color="white" if shade > 0.5 else "black")  # fmt: skip
    accuracy = np.trace(matrix) / max(matrix.sum(), 1)
    ax.set(
        xlabel="predicted", ylabel="true", title=f"Validation confusion\naccuracy {accuracy:.3f}"
    )
    fig.tight_layout()
    return fig


def _save(fig, path: str | Path) -> Path:
    """Lay the figure out, write it as a PNG at `path` (atomically), close it; the path."""
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)
    return path
