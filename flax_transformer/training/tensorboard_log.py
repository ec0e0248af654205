"""TensorBoard event files of a run: `tensorboard --logdir runs/` shows every workdir's
`tensorboard/` folder.

`TensorBoardLog.write(record)` takes the records metrics.jsonl gets (train: loss, lr, grad
norm, tokens/s; eval: validation loss, token accuracy, exact match) and writes them as scalars
"train/<name>" and "valid/<name>" at their step; `image` and `text` add the attention heatmap
and the decoded examples. The writer is tensorboardX (pure Python, no TensorFlow).

Resume: a resumed run opens the writer with `purge_step` = the checkpoint's step + 1. The
event file then starts with a restart marker, and TensorBoard's reader drops every event the
interrupted run wrote after the checkpoint, so each step is shown once (the same steps
metrics.jsonl forgets, see loop.truncate_metrics).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# metrics.jsonl record key -> scalar name, per record kind
_TRAIN = {"train_loss": "loss", "lr": "lr", "grad_norm": "grad_norm"}
_TRAIN |= {"tokens_per_sec": "tokens_per_sec"}
_EVAL = {"valid_loss": "loss", "token_accuracy": "token_accuracy", "exact_match": "exact_match",
         "accuracy": "accuracy", "macro_f1": "macro_f1"}  # fmt: skip


class TensorBoardLog:
    """A tensorboardX writer for the run's tensorboard/ folder: metrics records as scalars,
    pictures and decoded examples."""

    def __init__(self, directory: Path, purge_step: int | None = None):
        from tensorboardX import SummaryWriter  # imported when a run starts, not with the loop

        self.directory = Path(directory)
        self.writer = SummaryWriter(str(self.directory), purge_step=purge_step, flush_secs=30)

    def write(self, record: dict) -> None:
        """One metrics.jsonl record: {"kind": "train" | "eval", "step": ..., values...}."""
        prefix, names = ("train", _TRAIN) if record["kind"] == "train" else ("valid", _EVAL)
        for key, name in names.items():
            if key in record:
                self.writer.add_scalar(f"{prefix}/{name}", float(record[key]), record["step"])

    def image(self, tag: str, png: Path, step: int) -> None:
        """A PNG written by plots.py, as an image summary."""
        import matplotlib.image

        pixels = matplotlib.image.imread(png)  # (height, width, channels) floats in [0, 1]
        self.writer.add_image(tag, np.asarray(pixels[..., :3]), step, dataformats="HWC")

    def examples(self, examples: list[dict], step: int) -> None:
        """Decoded validation examples as a markdown table (a text summary)."""
        rows = ["| source | reference | hypothesis |", "|---|---|---|"]
        for ex in examples:
            cells = (ex["source"], ex["reference"], ex["hypothesis"])
            rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        self.writer.add_text("valid/examples", "\n".join(rows), step)

    def flush(self) -> None:
        """Write pending events to disk now."""
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


def _cell(text: str) -> str:
    # Markdown: a '|' would end the cell; backticks keep spaces and symbols visible.
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"
